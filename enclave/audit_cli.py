"""`enclave admin audit`: the one-run privacy audit (Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846) of a method and configuration, run here, in-process, on a public dataset
bundled with the product (worker/audits.py); with ``--via-api``, as an admin job instead
(POST /v1/admin/audits, run by a worker, listed by the API and the dashboard), waited for
and printed the same way. Nothing is charged to any budget and nothing is released: the
admin reads the figure, with the largest figure the same test could show beside it,
because a small lower bound is not a proof of privacy."""

from __future__ import annotations

import enum
import math
import time
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from enclave.errors import fail
from enclave.jobs_cli import DEFAULT_URL, Api, Url
from service.audits import round_down, round_up
from service.privacy.one_run_audit import OneRunBound


def audit_sentence(bound: OneRunBound) -> str:
    """The figure and its ceiling in one sentence, e.g. "ε ≥ 0.41 at 95% (this test
    cannot show more than 5.81 with 1,000 canaries): a lower bound, not a proof"."""
    level = f"{bound.confidence * 100:g}%"
    return (
        f"ε ≥ {round_down(bound.epsilon, 2)} at {level} (this test cannot show more than "
        f"{round_up(bound.ceiling, 2)} with {bound.canaries:,} canaries): "
        "a lower bound, not a proof"
    )


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        fail(f"--{name} must be a positive number, got {value!r}")
    return value


class CanaryChoice(enum.StrEnum):
    """The request's canary_kind (service.schemas.audits.CanaryKind)."""

    input = "input"
    gradient = "gradient"


def admin_audit(
    method: Annotated[
        str,
        typer.Option(
            help="The method to audit: dpsgd, expm or expm_nf on adult; dpsgd or expm_nf on icu."
        ),
    ],
    epsilon: Annotated[float, typer.Option(help="The claimed ε of the audited plan.")],
    delta: Annotated[float, typer.Option(help="The claimed δ of the audited plan.")],
    canaries: Annotated[int, typer.Option(help="m: canaries, each included w.p. 1/2.")],
    dataset: Annotated[
        str,
        typer.Option(
            help="A public dataset bundled with the product: adult (logistic regression) "
            "or icu (the synthetic ICU sample, GRU-D)."
        ),
    ] = "adult",
    guesses: Annotated[
        int | None, typer.Option(help="r: guesses made (top r/2 and bottom r/2). Default m/5.")
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence of the bound.")] = 0.95,
    canary_kind: Annotated[
        CanaryChoice,
        typer.Option(
            "--canary-kind",
            help="input: m mislabeled rows scored by their loss (black box, every method). "
            "gradient: m white-box Dirac gradient canaries in the DP-SGD run, scored by the "
            "run's noisy updates on their parameters (dpsgd only; m at most the model's "
            "parameters).",
        ),
    ] = CanaryChoice.input,
    via_api: Annotated[
        bool,
        typer.Option(
            "--via-api",
            help="Run it as an admin job (POST /v1/admin/audits, a worker runs it) and wait; "
            "it is then listed by the API and the dashboard. Default: here, in-process.",
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", envvar="ENCLAVE_API_KEY", help="An admin's API key.", show_default=False
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0, help="With --via-api: give up after this many seconds.")
    ] = 3600.0,
) -> None:
    """Run a one-run privacy audit (one training run) and print ε's lower bound and the
    test's ceiling. Public data only; nothing is charged or released."""
    _positive("epsilon", epsilon)
    if not math.isfinite(delta) or delta < 0:  # δ = 0: expm_nf's pure claim
        fail(f"--delta must be a number ≥ 0, got {delta!r}")
    if not 0 < confidence < 1:
        fail(f"--confidence must be in (0, 1), got {confidence!r}")
    if via_api:
        body = {
            "method": method,
            "epsilon": epsilon,
            "delta": delta,
            "canaries": canaries,
            "dataset": dataset,
            "model": {"kind": "grud" if dataset == "icu" else "logistic"},
            "guesses": guesses,
            "confidence": confidence,
            "canary_kind": canary_kind.value,
        }
        _audit_via_api(Api(url, key), body, timeout)
        return
    from service.plans import PlanError
    from worker.audits import AuditRefused, run_one_run_audit

    try:
        audit = run_one_run_audit(
            method=method,
            epsilon=epsilon,
            delta=delta,
            canaries=canaries,
            dataset=dataset,
            guesses=guesses,
            confidence=confidence,
            canary_kind=canary_kind.value,
        )
    except AuditRefused as exc:
        fail(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{where}: {first['msg']} (got {first.get('input')!r})")
    except PlanError as exc:
        fail(f"no plan for this configuration: {exc}")
    _report(
        audit.bound,
        method=audit.method,
        model=audit.model,
        dataset=audit.dataset,
        rows=audit.rows,
        epsilon=epsilon,
        delta=delta,
        noise_multiplier=audit.noise_multiplier,
        steps=audit.steps,
        sampling_rate=audit.sampling_rate,
        seconds=audit.seconds,
        canary_kind=audit.canary_kind,
    )


def _report(
    b: OneRunBound,
    *,
    method: str,
    model: str,
    dataset: str,
    rows: int,
    epsilon: float,
    delta: float,
    noise_multiplier: float | None,
    steps: int | None,
    sampling_rate: float | None,
    seconds: float,
    canary_kind: str = "input",
) -> None:
    typer.echo(audit_sentence(b))
    kind = "gradient " if canary_kind == "gradient" else ""
    run = [
        f"σ = {noise_multiplier:.4g}" if noise_multiplier is not None else "",
        f"{steps} steps" if steps is not None else "",
        f"q = {sampling_rate:.4g}" if sampling_rate is not None else "",
    ]
    figures = ", ".join(part for part in run if part)
    typer.echo(
        f"{b.correct} of {b.guesses} guesses right on {b.canaries:,} {kind}canaries; "
        f"{method} {MODEL_WORDS.get(model, model)} on {dataset} ({rows:,} rows), "
        f"claimed ε = {epsilon:g}, δ = {delta:g}; {figures}; {seconds:.1f} s; "
        "nothing charged"
    )


MODEL_WORDS = {"logistic": "logistic regression", "grud": "GRU-D"}


def _audit_via_api(api: Api, body: dict[str, Any], timeout: float) -> None:
    """POST the audit, poll it until it ends, print what the in-process run prints (and
    the audit's id: the API and the dashboard list it)."""
    audit = api.json("POST", "/v1/admin/audits", json=body)
    deadline = time.monotonic() + timeout
    while audit["status"] in ("queued", "running"):
        if time.monotonic() > deadline:
            fail(f"audit {audit['id']} is still {audit['status']} after {timeout:g} s")
        time.sleep(0.5)
        audit = api.json("GET", f"/v1/admin/audits/{audit['id']}")
    if audit["status"] != "done":
        fail(f"audit {audit['id']} {audit['status']}: {audit.get('failure') or ''}".rstrip(": "))
    r, config = audit["result"], audit["configuration"]
    bound = OneRunBound(
        epsilon=r["epsilon_lower_bound"],
        ceiling=r["ceiling"],
        canaries=r["canaries"],
        guesses=r["guesses"],
        correct=r["correct"],
        confidence=r["confidence"],
        delta=config["delta"],
    )
    _report(
        bound,
        method=config["method"],
        model=config["model"]["kind"],
        dataset=config["dataset"],
        rows=r["rows"],
        epsilon=config["epsilon"],
        delta=config["delta"],
        noise_multiplier=r["noise_multiplier"],
        steps=r["steps"],
        sampling_rate=r["sampling_rate"],
        seconds=audit["seconds"],
        canary_kind=config.get("canary_kind", "input"),
    )
    typer.echo(f"audit {audit['id']} (GET /v1/admin/audits/{audit['id']}, dashboard: Audits)")
