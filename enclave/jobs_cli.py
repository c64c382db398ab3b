"""`enclave jobs`: the analyst's commands, over HTTP only (httpx), never the database.

The service's URL and the analyst's API key come from ``ENCLAVE_URL`` and
``ENCLAVE_API_KEY`` (``--url`` and ``--key`` override them). Every error the API answers
(RFC 9457 problem+json) is one line, ``error: <title>: <detail>``, and exit status 1, as
are the CLI's own user errors (:func:`enclave.errors.fail`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from enclave.errors import fail
from enclave.job_options import (
    CreatedAfterOpt,
    CreatedBeforeOpt,
    CursorOpt,
    EveryOpt,
    GuaranteeOpt,
    MethodFilterOpt,
    StatusOpt,
)
from enclave.privacy_text import privacy_number, remaining_notes
from service.version import __version__

if TYPE_CHECKING:
    from service.releases import LoadedRelease

jobs_app = typer.Typer(
    help=(
        "Analysts: quote, submit, watch, download and score jobs over HTTP "
        "(ENCLAVE_URL, ENCLAVE_API_KEY)."
    ),
    no_args_is_help=True,
)
console = Console()

DEFAULT_URL = "http://127.0.0.1:8000"
FINISHED = {"released", "failed", "cancelled"}

Url = Annotated[
    str, typer.Option("--url", envvar="ENCLAVE_URL", help="The enclave API's base URL.")
]
Key = Annotated[
    str | None,
    typer.Option("--key", envvar="ENCLAVE_API_KEY", help="Your API key.", show_default=False),
]
JobId = Annotated[str, typer.Argument(help="The job's id (from `submit`).")]


def problem_line(response: httpx.Response) -> str:
    """One line for an error response: ``<title>: <detail>`` of its problem+json, plus
    the first invalid field of a validation error; the status line for anything else."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "title" not in body:
        return f"HTTP {response.status_code} {response.reason_phrase}"
    line = f"{body['title']}: {body.get('detail') or response.reason_phrase}"
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        where = ".".join(str(p) for p in errors[0].get("loc", []))
        line += f" ({where}: {errors[0].get('msg', '')})"
    return " ".join(line.split())  # one line, whatever the detail holds


class Api:
    """The analyst's session with the API: every error becomes one ``error:`` line."""

    def __init__(self, url: str, key: str | None) -> None:
        if not key:
            fail("no API key: set ENCLAVE_API_KEY or pass --key")
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}", "User-Agent": f"enclave/{__version__}"},
            timeout=60.0,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.url}: {exc}")
        if response.status_code >= 400:
            fail(problem_line(response))
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.call(method, path, **kwargs).json()


def metric_list(text: str) -> list[str]:
    """Comma-separated metric names as a list (blanks dropped); the API checks the names."""
    return [m.strip() for m in text.split(",") if m.strip()]


def _evaluate_block(
    metrics: str | None,
    epsilon: float | None,
    delta: float | None,
    noise: str | None,
    confidence: float | None,
    sample: int | None,
) -> dict[str, Any]:
    """The ``evaluate`` fields the --evaluate* flags give (service/schemas/evaluations.py
    TrainingEvaluation: metrics, epsilon, delta, noise, confidence, sample); those not
    given are left to the --body file or the API's defaults."""
    block = {
        "metrics": None if metrics is None else metric_list(metrics),
        "epsilon": epsilon,
        "delta": delta,
        "noise": noise,
        "confidence": confidence,
        "sample": sample,
    }
    return {k: v for k, v in block.items() if v is not None}


def _request_body(
    body: Path | None,
    dataset: str | None,
    method: str | None,
    epsilon: float | None,
    delta: float | None,
    model: str | None,
    samples: int | None,
    evaluate: dict[str, Any],
) -> dict[str, Any]:
    """The body of POST /v1/quote and /v1/jobs: the --body file's JSON object, with the
    flags given on top (``evaluate``: the --evaluate* flags' fields, on top of the file's
    ``evaluate`` block). The API validates it (a 422 problem names the field)."""
    out: dict[str, Any] = {}
    if body is not None:
        try:
            out = json.loads(body.read_text())
        except (OSError, UnicodeError, ValueError) as exc:
            fail(f"cannot read the request body from {body}: {exc}")
        if not isinstance(out, dict):
            fail(f"{body}: the request body must be a JSON object")
    flags: dict[str, Any] = {"dataset": dataset, "method": method, "epsilon": epsilon}
    flags |= {"delta": delta, "samples": samples}
    flags["model"] = None if model is None else {"kind": model}
    out.update({k: v for k, v in flags.items() if v is not None})
    missing = [k for k in ("dataset", "method", "epsilon") if k not in out]
    if missing:
        fail(f"the request needs {', '.join(missing)}: pass --{missing[0]} or --body FILE")
    if evaluate:
        given = out.get("evaluate")
        out["evaluate"] = {**(given if isinstance(given, dict) else {}), **evaluate}
        if "epsilon" not in out["evaluate"]:
            fail("train then evaluate needs the evaluation's ε: pass --evaluate-epsilon")
    return out


BodyFile = Annotated[
    Path | None,
    typer.Option(
        "--body",
        dir_okay=False,
        help="A JSON file with the request (the body of POST /v1/jobs); flags override it.",
    ),
]
DatasetOpt = Annotated[str | None, typer.Option(help="Dataset name.")]
MethodOpt = Annotated[
    str | None, typer.Option(help="dpsgd, expm, expm_nf, or auto (the service chooses).")
]
EpsilonOpt = Annotated[float | None, typer.Option(help="ε of one release, in nats.")]
DeltaOpt = Annotated[float | None, typer.Option(help="δ of one release (0 for pure methods).")]
ModelOpt = Annotated[str | None, typer.Option(help="Model kind: logistic, mlp, grud.")]
SamplesOpt = Annotated[int | None, typer.Option(help="Released models (each charged).")]
# Train then evaluate: the request's `evaluate` block (service/schemas/evaluations.py
# TrainingEvaluation), one flag per field; the API checks every value (a 422 problem).
EVALUATE_PANEL = "Train then evaluate (the request's evaluate block)"


def _evaluate_option(flag: str, text: str) -> Any:
    return typer.Option(flag, help=text, rich_help_panel=EVALUATE_PANEL, show_default=False)


EvaluateOpt = Annotated[
    str | None,
    _evaluate_option(
        "--evaluate",
        "Also score the released model on the dataset's private holdout, in the same job "
        "and charge: comma-separated metrics (accuracy, auc, log_loss, calibration_error, "
        "confusion). Needs --evaluate-epsilon.",
    ),
]
EvaluateEpsilonOpt = Annotated[
    float | None,
    _evaluate_option(
        "--evaluate-epsilon",
        "ε (nats) of the evaluation, added to the training's (metrics default: accuracy,log_loss).",
    ),
]
EvaluateDeltaOpt = Annotated[
    float | None,
    _evaluate_option(
        "--evaluate-delta", "δ of the evaluation (API default 0; Gaussian noise needs δ > 0)."
    ),
]
EvaluateNoiseOpt = Annotated[
    str | None, _evaluate_option("--evaluate-noise", "laplace (API default) or gaussian.")
]
EvaluateConfidenceOpt = Annotated[
    float | None,
    _evaluate_option(
        "--evaluate-confidence", "Level of each metric's interval (API default 0.95)."
    ),
]
EvaluateSampleOpt = Annotated[
    int | None,
    _evaluate_option(
        "--evaluate-sample", "Which released model to score, with --samples > 1 (API default 0)."
    ),
]


def _budget(view: dict[str, Any] | None) -> str:
    if view is None:
        return "none"
    remaining = privacy_number(view["remaining_epsilon"], down=True)
    return f"{remaining} of ε {privacy_number(view['epsilon_total'])}"


def _change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    if before is None:
        return "no cap"
    return f"{_budget(before)} → {'refused' if after is None else _budget(after)}"


NOT_PROVEN = {"nominal": ": not proven"}


def _estimate_rows(estimate: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The quote's worker time and memory estimate (a ceiling; see its note)."""
    if not estimate:
        return []
    seconds, memory = estimate.get("seconds"), estimate.get("memory_bytes")
    return [
        ("worker time (at most)", "no estimate" if seconds is None else f"~{seconds:.3g} s"),
        (
            "worker memory (at most)",
            "no estimate" if memory is None else f"~{memory / 2**20:.3g} MiB",
        ),
    ]


def _evaluation_rows(evaluation: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Train then evaluate: the plan's split of its (ε, δ) between the training and the
    evaluation (the stated ε above is their composition, charged once)."""
    if not evaluation:
        return []
    metrics = ", ".join(str(m["metric"]) for m in evaluation["metrics"])
    return [
        (
            "training ε, δ",
            f"{privacy_number(evaluation['training_epsilon'])}, "
            f"{privacy_number(evaluation['training_delta'])}",
        ),
        (
            "evaluation ε, δ",
            f"{privacy_number(evaluation['epsilon'])}, {privacy_number(evaluation['delta'])}",
        ),
        (
            "evaluation",
            f"{metrics} of sample {evaluation['sample']} on {evaluation['holdout_rows']} "
            f"holdout rows, {evaluation['noise']} noise",
        ),
    ]


def quote_table(quote: dict[str, Any]) -> Table:
    """The plan and its charge: the stated (ε, δ) and what the ledger charges."""
    plan = quote["plan"]
    mech = plan["mechanism"]
    charged = quote.get("charged_epsilon")
    choice = plan.get("method_choice")  # method 'auto': what it chose and why
    table = Table("", "", title="Quote (nothing charged)", show_header=False)
    rows = [
        ("dataset", plan["dataset"]),
        ("method", plan["method"] + (f" (auto: {choice['reason']})" if choice else "")),
        ("model", str(plan["model"].get("kind"))),
        (
            "guarantee",
            plan["guarantee"].upper() + (": not proven" if plan["guarantee"] == "nominal" else ""),
        ),
        ("accountant", plan["accountant"]),
        ("stated ε (nats)", privacy_number(plan["epsilon"])),
        ("stated δ", privacy_number(plan["delta"])),
        ("charged_epsilon", "= stated ε (pure)" if charged is None else privacy_number(charged)),
        ("samples", str(plan["samples"])),
        ("steps", str(mech.get("steps", ""))),
    ]
    for name in ("noise_multiplier", "sampling_rate", "expected_batch_size", "epochs"):
        if name in mech:
            rows.append((name, f"{mech[name]:g}"))
    rows += _evaluation_rows(plan.get("evaluation"))
    rows += _estimate_rows(quote.get("estimate"))
    rows += [
        ("dataset ε remaining", _change(quote["dataset_before"], quote["dataset_after"])),
        ("your cap remaining", _change(quote["analyst_before"], quote["analyst_after"])),
        ("admitted", "yes" if quote["admitted"] else f"no: {quote.get('reason') or ''}"),
    ]
    for name, value in rows:
        table.add_row(name, escape(value))
    return table


@jobs_app.command("quote")
def quote(
    url: Url = DEFAULT_URL,
    key: Key = None,
    body: BodyFile = None,
    dataset: DatasetOpt = None,
    method: MethodOpt = None,
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    model: ModelOpt = None,
    samples: SamplesOpt = None,
    ev_metrics: EvaluateOpt = None,
    ev_epsilon: EvaluateEpsilonOpt = None,
    ev_delta: EvaluateDeltaOpt = None,
    ev_noise: EvaluateNoiseOpt = None,
    ev_confidence: EvaluateConfidenceOpt = None,
    ev_sample: EvaluateSampleOpt = None,
) -> None:
    """Show the plan and its charge for a request without charging anything (with
    --evaluate: the training and the evaluation of its model, composed). Exits 1 when the
    ledger would refuse it (the reason is on stderr)."""
    ev = _evaluate_block(ev_metrics, ev_epsilon, ev_delta, ev_noise, ev_confidence, ev_sample)
    request = _request_body(body, dataset, method, epsilon, delta, model, samples, ev)
    answer = Api(url, key).json("POST", "/v1/quote", json=request)
    console.print(quote_table(answer))
    for note in remaining_notes(answer):  # what "remaining" means, and why a refusal
        console.print(note, soft_wrap=True)
    if not answer["admitted"]:
        fail(f"not admitted: {answer.get('reason') or 'budget exceeded'}")


@jobs_app.command("submit")
def submit(
    url: Url = DEFAULT_URL,
    key: Key = None,
    body: BodyFile = None,
    dataset: DatasetOpt = None,
    method: MethodOpt = None,
    epsilon: EpsilonOpt = None,
    delta: DeltaOpt = None,
    model: ModelOpt = None,
    samples: SamplesOpt = None,
    ev_metrics: EvaluateOpt = None,
    ev_epsilon: EvaluateEpsilonOpt = None,
    ev_delta: EvaluateDeltaOpt = None,
    ev_noise: EvaluateNoiseOpt = None,
    ev_confidence: EvaluateConfidenceOpt = None,
    ev_sample: EvaluateSampleOpt = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(help="Send again safely: the same key and body return the first job."),
    ] = None,
) -> None:
    """Submit a job (charged now, before any private row is read); prints its id last.
    With --evaluate the job also scores its released model on the holdout (one charge);
    `download` then prints the results."""
    ev = _evaluate_block(ev_metrics, ev_epsilon, ev_delta, ev_noise, ev_confidence, ev_sample)
    request = _request_body(body, dataset, method, epsilon, delta, model, samples, ev)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = Api(url, key).call("POST", "/v1/jobs", json=request, headers=headers)
    job = response.json()
    again = " (the same Idempotency-Key: the first job)" if response.status_code == 200 else ""
    console.print(
        f"job {job['status']}{again}: step {job['progress_step']} of {job['progress_total']}, "
        f"ε = {privacy_number(job['epsilon'])}, δ = {privacy_number(job['delta'])} charged"
        + (" (training and evaluation)" if job["plan"].get("evaluation") else "")
    )
    typer.echo(job["id"])


@jobs_app.command("select")
def select(
    body: Annotated[
        Path,
        typer.Argument(dir_okay=False, help="A JSON file: the body of POST /v1/selections."),
    ],
    url: Url = DEFAULT_URL,
    key: Key = None,
    quote_only: Annotated[
        bool, typer.Option("--quote", help="Only show the whole workflow's cost.")
    ] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(help="Send again safely: the same key and body return the first job."),
    ] = None,
) -> None:
    """Quote or submit a selection job (architecture, hyperparameters, features); the job
    is then watched and downloaded like any other. Prints the job id last."""
    try:
        request = json.loads(body.read_text())
    except (OSError, UnicodeError, ValueError) as exc:
        fail(f"cannot read the request body from {body}: {exc}")
    api = Api(url, key)
    if quote_only:
        answer = api.json("POST", "/v1/selections/quote", json=request)
        console.print(quote_table(answer))
        mech = answer["plan"]["mechanism"]
        for stage, values in mech["stages"].items():
            eps, delta = privacy_number(values["epsilon"]), privacy_number(values["delta"])
            console.print(f"stage {stage}: ε = {eps}, δ = {delta}")
        console.print(f"trainings: {mech['trainings']}, runs: {mech['runs']}")
        for note in remaining_notes(answer):
            console.print(note, soft_wrap=True)
        if not answer["admitted"]:
            fail(f"not admitted: {answer.get('reason') or 'budget exceeded'}")
        return
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    job = api.call("POST", "/v1/selections", json=request, headers=headers).json()
    console.print(
        f"selection {job['status']}: ε = {privacy_number(job['epsilon'])}, "
        f"δ = {privacy_number(job['delta'])} charged"
    )
    typer.echo(job["id"])


@jobs_app.command("list")
def list_jobs(
    url: Url = DEFAULT_URL,
    key: Key = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Jobs a page (newest first).")] = 50,
    cursor: CursorOpt = None,
    every: EveryOpt = False,
    status: StatusOpt = None,
    dataset: DatasetOpt = None,
    method: MethodFilterOpt = None,
    guarantee: GuaranteeOpt = None,
    created_after: CreatedAfterOpt = None,
    created_before: CreatedBeforeOpt = None,
) -> None:
    """Your jobs, newest first (GET /v1/jobs): filters combine; without --all, the next
    page's cursor is printed under the table. The API checks the values (one error line)."""
    params: dict[str, Any] = {"limit": limit, "status": status, "dataset": dataset}
    params |= {"method": method, "guarantee": guarantee, "created_after": created_after}
    params |= {"created_before": created_before}
    params = {k: v for k, v in params.items() if v is not None}
    api = Api(url, key)
    jobs: list[dict[str, Any]] = []
    while True:
        response = api.call(
            "GET", "/v1/jobs", params={**params, **({"cursor": cursor} if cursor else {})}
        )
        jobs += response.json()
        cursor = response.headers.get("X-Next-Cursor")
        if not every or not cursor:
            break
    # Fold, never truncate: the id goes on to `watch` and `download`.
    names = ("dataset", "method", "status", "steps", "ε", "δ", "created", "error")
    table = Table(Column("job", overflow="fold"), *names, title="Your jobs, newest first")
    for j in jobs:
        table.add_row(
            j["id"], j["dataset"], j["method"], j["status"],
            f"{j['progress_step']}/{j['progress_total']}",
            privacy_number(j["epsilon"]), privacy_number(j["delta"]),
            str(j["created_at"])[:19], escape(j.get("error") or ""),
        )  # fmt: skip
    console.print(table)
    if cursor:
        console.print(f"more jobs: --cursor {cursor}", soft_wrap=True)


@jobs_app.command("watch")
def watch(
    job_id: JobId,
    url: Url = DEFAULT_URL,
    key: Key = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 1.0,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Give up after this many seconds.")
    ] = None,
) -> None:
    """Show the job's progress (step k of T) until it ends; exit 1 unless it was released."""
    api = Api(url, key)
    deadline = None if timeout is None else time.monotonic() + timeout
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
        job = api.json("GET", f"/v1/jobs/{job_id}")
        task = bar.add_task(job["status"], total=job["progress_total"] or None)
        while True:
            bar.update(
                task,
                description=f"{job_id[:8]} {job['status']}",
                completed=job["progress_step"],
                total=job["progress_total"] or None,
            )
            if job["status"] in FINISHED:
                break
            if deadline is not None and time.monotonic() > deadline:
                fail(f"job {job_id} is still {job['status']} after {timeout:g} s")
            time.sleep(interval)
            job = api.json("GET", f"/v1/jobs/{job_id}")
    if job["status"] != "released":
        fail(f"job {job_id} {job['status']}" + (f": {job['error']}" if job.get("error") else ""))
    console.print(
        f"job {job_id} released ({job['guarantee']} guarantee); "
        f"`enclave jobs download {job_id}` fetches it"
    )


@jobs_app.command("download")
def download(
    job_id: JobId,
    url: Url = DEFAULT_URL,
    key: Key = None,
    out: Annotated[
        Path | None, typer.Option(file_okay=False, help="Folder to write (default: the job id).")
    ] = None,
) -> None:
    """Write the release's model card (card.json) and weights (model.safetensors) into a
    folder, and check the weights against the card's SHA-256."""
    from enclave.analyst import CARD_FILE, WEIGHTS_FILE, open_release

    api = Api(url, key)
    card = api.call("GET", f"/v1/jobs/{job_id}/release")
    weights = api.call("GET", f"/v1/jobs/{job_id}/release/weights")
    folder = out or Path(job_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CARD_FILE).write_bytes(card.content)
        (folder / WEIGHTS_FILE).write_bytes(weights.content)
    except OSError as exc:
        fail(f"cannot write the release to {folder}: {exc}")
    try:
        release = open_release(folder)
    except ValueError as exc:
        fail(f"the downloaded release is not intact: {exc}")
    privacy = release.card.get("privacy", {})
    console.print(
        f"wrote {folder / CARD_FILE} and {folder / WEIGHTS_FILE}; "
        f"{str(privacy.get('guarantee', '')).upper()} guarantee, "
        f"ε = {privacy_number(privacy.get('epsilon'))}, δ = {privacy_number(privacy.get('delta'))}",
        soft_wrap=True,
    )
    if isinstance(release.card.get("evaluation"), dict):  # train then evaluate
        console.print(evaluation_table(release.card))


@jobs_app.command("score")
def score(
    release: Annotated[
        Path, typer.Argument(exists=True, help="A downloaded release (its folder).")
    ],
    path: Annotated[
        Path,
        typer.Argument(
            exists=True,
            help=(
                "Public data in the release's public schema: a CSV of rows, or for a "
                "release trained on images an image folder or file (.npz) in the "
                "schema's source format."
            ),
        ),
    ],
    sample: Annotated[int, typer.Option(min=0, help="Which released model (samples > 1).")] = 0,
    predictions: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False,
            help="Write P(y = 1) (K ≥ 3 classes: one column per class) per kept row to this CSV.",
        ),
    ] = None,
) -> None:
    """Score public data with a downloaded release (on this machine; no API call). A CSV:
    rows kept and dropped (with reasons), and the AUC when the CSV has the target column
    (K ≥ 3 classes: the accuracy and the macro one-vs-rest AUC). Images (when the card's
    public schema is of kind images): the images kept and rejected, the accuracy and the
    AUC (K ≥ 3 classes: macro one-vs-rest)."""
    from enclave.analyst import open_release

    try:
        loaded = open_release(release)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"cannot score {path.name} with the release in {release}: {exc}")
    public = loaded.card.get("preprocessing", {}).get("public_schema", {})
    if isinstance(public, dict) and public.get("kind") == "images":
        _score_images(loaded, release, path, sample=sample, predictions=predictions)
    elif path.is_dir():
        fail(f"{path} is a folder: this release scores a CSV of rows (its dataset is tabular)")
    else:
        _score_csv(loaded, release, path, sample=sample, predictions=predictions)


def _probability_columns(p: Any) -> dict[str, Any]:
    """P(y = 1) as ``probability``, or one ``p_k`` column per class for K ≥ 3."""
    return {f"p_{k}": p[:, k] for k in range(p.shape[1])} if p.ndim == 2 else {"probability": p}


def _score_csv(
    loaded: LoadedRelease, release: Path, csv: Path, *, sample: int, predictions: Path | None
) -> None:
    import pandas as pd

    from enclave.analyst import score_csv

    try:
        scored = score_csv(loaded, csv, sample=sample)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"cannot score {csv.name} with the release in {release}: {exc}")
    table = Table("", "", title=f"Scored {csv.name}", show_header=False)
    table.add_row("rows kept", str(len(scored.kept_index)))
    table.add_row("rows dropped", str(len(scored.dropped)))
    table.add_row("AUC", "no labels" if scored.auc is None else f"{scored.auc:.4f}")
    if scored.probabilities.ndim == 2:  # K ≥ 3 classes: the AUC is macro one-vs-rest
        accuracy = scored.accuracy
        table.add_row("accuracy", "no labels" if accuracy is None else f"{accuracy:.4f}")
    console.print(table)
    for row, why in list(scored.dropped.items())[:5]:
        console.print(f"dropped row {row}: {escape(why)}", soft_wrap=True)
    if predictions is not None:
        columns = _probability_columns(scored.probabilities)
        pd.DataFrame({"row": scored.kept_index, **columns}).to_csv(predictions, index=False)
        console.print(f"wrote {predictions}")


def _score_images(
    loaded: LoadedRelease, release: Path, path: Path, *, sample: int, predictions: Path | None
) -> None:
    import pandas as pd

    from enclave.analyst import score_images

    try:
        scored = score_images(loaded, path, sample=sample)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"cannot score {path.name} with the release in {release}: {exc}")
    k = scored.probabilities.shape[1] if scored.probabilities.ndim == 2 else 2
    auc_name = "AUC (macro one-vs-rest)" if k >= 3 else "AUC"
    table = Table("", "", title=f"Scored {path.name} ({k} classes)", show_header=False)
    table.add_row("images kept", str(scored.report.images_kept))
    table.add_row("images rejected", str(scored.report.images_in - scored.report.images_kept))
    table.add_row("accuracy", f"{scored.accuracy:.4f}")
    table.add_row(
        auc_name,
        "needs every class among the images" if scored.auc is None else f"{scored.auc:.4f}",
    )
    console.print(table)
    for line in scored.report.lines()[1:]:
        console.print(escape(line), soft_wrap=True)
    if predictions is not None:
        columns = _probability_columns(scored.probabilities)
        frame = pd.DataFrame({"image": scored.names, "label": scored.y, **columns})
        frame.to_csv(predictions, index=False)
        console.print(f"wrote {predictions}")


def _interval(interval: dict[str, Any] | None) -> str:
    if not interval:
        return ""
    return f"[{interval['lower']:.4f}, {interval['upper']:.4f}]"


def evaluation_table(card: dict[str, Any]) -> Table:
    """An evaluation's released results: each metric's noisy value and its interval."""
    ev = card["evaluation"]
    table = Table(
        "metric",
        "noisy value",
        f"interval ({ev['confidence']:g})",
        "ε (nats)",
        "noise scale",
        title=(
            f"Private evaluation of job {escape(str(ev['job_id']))} on the holdout "
            f"({ev['holdout_rows']} rows), ε = {privacy_number(ev['epsilon'])}, "
            f"δ = {privacy_number(ev['delta'])}, {ev['noise']} noise"
        ),
    )
    for name, result in ev["metrics"].items():
        if name == "confusion":
            cells = [
                f"(y={i}, ŷ={j}) {count} {_interval(result['intervals'][i][j])}"
                for i, row in enumerate(result["counts"])
                for j, count in enumerate(row)
            ]
            table.add_row(
                name,
                "noisy counts",
                "; ".join(cells),
                privacy_number(result["epsilon"]),
                f"{result['noise_scale']:.4g}",
            )
            continue
        value = result.get("value")
        table.add_row(
            name,
            "not released" if value is None else f"{value:.4f}",
            _interval(result.get("interval")),
            privacy_number(result["epsilon"]),
            "" if result.get("noise_scale") is None else f"{result['noise_scale']:.4g}",
        )
    return table


@jobs_app.command("evaluate")
def evaluate(
    job_id: Annotated[str, typer.Argument(help="A released training job of yours.")],
    epsilon: Annotated[float, typer.Option(help="ε (nats) of the whole evaluation.")],
    delta: Annotated[float, typer.Option(help="δ (0 with Laplace noise).")] = 0.0,
    metrics: Annotated[
        str,
        typer.Option(
            help="Comma-separated: accuracy, auc, log_loss, calibration_error, confusion."
        ),
    ] = "accuracy,log_loss",
    noise: Annotated[str, typer.Option(help="laplace or gaussian.")] = "laplace",
    confidence: Annotated[float, typer.Option(help="Level of each interval.")] = 0.95,
    sample: Annotated[int, typer.Option(min=0, help="Which released model (samples > 1).")] = 0,
    quote_only: Annotated[
        bool, typer.Option("--quote", help="Show the cost only; charge nothing.")
    ] = False,
    wait: Annotated[
        bool, typer.Option(help="Wait for the result and print it (else print the job id).")
    ] = True,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 1.0,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Give up waiting after this many seconds.")
    ] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
) -> None:
    """Score a released model on its dataset's private holdout (POST /v1/evaluations):
    charged to the ledger like a job; prints each metric's noisy value and its confidence
    interval (sampling and DP noise together) once the worker has released it."""
    body = {
        "job_id": job_id,
        "epsilon": epsilon,
        "delta": delta,
        "metrics": metric_list(metrics),
        "noise": noise,
        "confidence": confidence,
        "sample": sample,
    }
    api = Api(url, key)
    if quote_only:
        answer = api.json("POST", "/v1/evaluations/quote", json=body)
        console.print(quote_table(answer))
        if not answer["admitted"]:
            fail(f"not admitted: {answer.get('reason') or 'budget exceeded'}")
        return
    job = api.json("POST", "/v1/evaluations", json=body)
    console.print(
        f"evaluation {job['status']}: ε = {privacy_number(job['epsilon'])}, "
        f"δ = {privacy_number(job['delta'])} charged"
    )
    if not wait:
        typer.echo(job["id"])
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    while job["status"] not in FINISHED:
        if deadline is not None and time.monotonic() > deadline:
            fail(f"evaluation {job['id']} is still {job['status']} after {timeout:g} s")
        time.sleep(interval)
        job = api.json("GET", f"/v1/jobs/{job['id']}")
    if job["status"] != "released":
        fail(
            f"evaluation {job['id']} {job['status']}"
            + (f": {job['error']}" if job.get("error") else "")
        )
    console.print(evaluation_table(api.json("GET", f"/v1/jobs/{job['id']}/release")))
    typer.echo(job["id"])
