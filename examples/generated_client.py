"""The analyst's flow with a Python client generated from the service's OpenAPI document.

Generate the client once (openapi-python-client is in the dev extra), then run this:

    openapi-python-client generate --url http://127.0.0.1:8000/openapi.json --meta none \\
        --config examples/openapi-client.yaml --output-path enclave_client
    ENCLAVE_URL=http://127.0.0.1:8000 ENCLAVE_KEY=enc_... python examples/generated_client.py adult

It lists the datasets, quotes a DP-SGD request, prints what the plan resolved (the plan's
mechanism and its DP event are typed: one class per method and per event type), submits it
(with an Idempotency-Key, so running it twice submits once) and prints the job. Every error
is a `Problem` (RFC 9457).
tests/integration/test_generated_client.py runs this script against a live service.
"""

from __future__ import annotations

import os
import sys

from enclave_client import AuthenticatedClient
from enclave_client.api.analyst import create_job, get_job, list_datasets, quote
from enclave_client.models import (
    ComposedEventJson,
    DpsgdMechanism,
    DpsgdOptions,
    JobRequest,
    JobRequestMethod,
    Problem,
)


def fail(problem: object) -> int:
    if isinstance(problem, Problem):
        print(f"{problem.status} {problem.title}: {problem.detail}", file=sys.stderr)
    else:
        print(f"unexpected answer: {problem!r}", file=sys.stderr)
    return 1


def main(dataset: str, epsilon: float = 1.0, delta: float = 1e-5) -> int:
    client = AuthenticatedClient(
        base_url=os.environ["ENCLAVE_URL"],
        token=os.environ["ENCLAVE_KEY"],
        raise_on_unexpected_status=True,
    )
    with client:
        datasets = list_datasets.sync(client=client)
        if not isinstance(datasets, list):
            return fail(datasets)
        for ds in datasets:
            print(f"dataset {ds.name}: remaining ε {ds.budget.remaining_epsilon:.4g}")

        request = JobRequest(
            dataset=dataset,
            method=JobRequestMethod.DPSGD,
            epsilon=epsilon,
            delta=delta,
            dpsgd=DpsgdOptions(epochs=1),
        )
        q = quote.sync(client=client, body=request)
        if isinstance(q, Problem) or q is None:
            return fail(q)
        print(f"quote: admitted={q.admitted}, plan ε={q.plan.epsilon:g}, δ={q.plan.delta:g}")
        mechanism, event = q.plan.mechanism, q.plan.event
        if isinstance(mechanism, DpsgdMechanism):
            print(
                f"plan: {mechanism.steps} steps at sampling rate {mechanism.sampling_rate:.4g}, "
                f"noise multiplier {mechanism.noise_multiplier:.4g}"
            )
        if isinstance(event, ComposedEventJson):
            print(f"charged: {event.type_} of {', '.join(e.type_ for e in event.events)}")
        if not q.admitted:
            print(f"not admitted: {q.reason}", file=sys.stderr)
            return 1

        key = f"example-{dataset}-{epsilon:g}-{delta:g}"
        job = create_job.sync(client=client, body=request, idempotency_key=key)
        if isinstance(job, Problem) or job is None:
            return fail(job)
        job = get_job.sync(client=client, job_id=job.id)
        if isinstance(job, Problem) or job is None:
            return fail(job)
        print(f"job {job.id}: {job.status.value}, step {job.progress_step} of {job.progress_total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "adult"))
