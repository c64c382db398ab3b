"""`enclave admin audit`: the one-run privacy audit (Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846) of a method and configuration, run here, in-process, on a public dataset
bundled with the product (worker/audits.py); with ``--via-api``, as an admin job instead
(POST /v1/admin/audits, run by a worker, listed by the API and the dashboard), waited for
and printed the same way. With ``--attack lira``, LiRA membership inference (Carlini et al.
2022; worker/lira.py) on a pool of public Adult rows instead: TPR at 0.1% and 1% FPR, AUC,
its ε lower bound beside its ceiling, and the one-run bound of one held-out target.
Nothing is charged to any budget and nothing is released: the admin reads the figure,
with the largest figure the same test could show beside it, because a small lower bound
is not a proof of privacy."""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from enclave.errors import fail
from enclave.jobs_cli import DEFAULT_URL, Api, Url
from service.audits import (
    LIRA_DEFAULT_MODELS,
    LIRA_DEFAULT_POOL,
    default_model,
    round_down,
    round_up,
)
from service.privacy.one_run_audit import OneRunBound
from service.schemas.audits import AuditRequest, LiraFigures


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


def lira_sentence(lira: LiraFigures, confidence: float) -> str:
    """LiRA's figures in one sentence: TPR at the two FPR levels, AUC, and its bound beside
    its ceiling (rounded down and up)."""
    rates = ", ".join(f"{r.tpr:.4f} at {r.target_fpr * 100:g}% FPR" for r in lira.rates)
    return (
        f"LiRA ({lira.models} models on {lira.pool:,} public Adult rows): TPR {rates}; "
        f"AUC {lira.auc:.3f}; ε ≥ {round_down(lira.epsilon_lower_bound, 2)} at "
        f"{confidence * 100:g}% (this test cannot show more than {round_up(lira.ceiling, 2)}; "
        "it treats one model's rows as independent: not a certificate)"
    )


class AttackChoice(enum.StrEnum):
    """The request's attack (service.schemas.audits.AuditAttack)."""

    one_run = "one_run"
    lira = "lira"


class CanaryChoice(enum.StrEnum):
    """The request's canary_kind (service.schemas.audits.CanaryKind)."""

    input = "input"
    gradient = "gradient"


def json_object(flag: str, text: str) -> dict[str, Any]:
    """A JSON-object option (--model's spec, --dpsgd, --expm, --expm-nf) as the request
    field's value; text that is not a JSON object is the command's one-line error. The API
    (in-process: its schema, service/schemas/audits.py) checks the fields inside."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        fail(f"{flag} must be a JSON object: {exc}")
    if not isinstance(value, dict):
        fail(f"{flag} must be a JSON object, got {text!r}")
    return value


def request_body(
    *,
    method: str,
    epsilon: float,
    delta: float,
    dataset: str,
    model: str | None,
    confidence: float,
    canary_kind: str,
    attack: str,
    canaries: int | None = None,
    guesses: int | None = None,
    dpsgd: str | None = None,
    expm: str | None = None,
    expm_nf: str | None = None,
    shadow_models: int | None = None,
    pool: int | None = None,
) -> dict[str, Any]:
    """The body of POST /v1/admin/audits (service.schemas.audits.AuditRequest), one flag
    per field: --model is a kind (logistic, mlp, grud) or a JSON model spec, default the
    dataset's model (service.audits.default_model); --dpsgd, --expm and --expm-nf are the JSON
    options objects; the optional fields not given are left out (the API's defaults)."""
    if model is None:
        spec: dict[str, Any] = {"kind": default_model(dataset).kind}
    elif model.lstrip().startswith("{"):
        spec = json_object("--model", model)
    else:
        spec = {"kind": model}
    given = {
        "canaries": canaries,
        "guesses": guesses,
        "dpsgd": None if dpsgd is None else json_object("--dpsgd", dpsgd),
        "expm": None if expm is None else json_object("--expm", expm),
        "expm_nf": None if expm_nf is None else json_object("--expm-nf", expm_nf),
        "shadow_models": shadow_models,
        "pool": pool,
    }
    return {
        "method": method,
        "epsilon": epsilon,
        "delta": delta,
        "dataset": dataset,
        "model": spec,
        "confidence": confidence,
        "canary_kind": canary_kind,
        "attack": attack,
        **{k: v for k, v in given.items() if v is not None},
    }


def admin_audit(
    method: Annotated[
        str,
        typer.Option(
            help="The method to audit: dpsgd, expm or expm_nf on adult; dpsgd or expm_nf on icu."
        ),
    ],
    epsilon: Annotated[float, typer.Option(help="The claimed ε of the audited plan.")],
    delta: Annotated[float, typer.Option(help="The claimed δ of the audited plan.")],
    canaries: Annotated[
        int | None,
        typer.Option(help="m: canaries, each included w.p. 1/2 (one-run audits; required there)."),
    ] = None,
    dataset: Annotated[
        str,
        typer.Option(
            help="A public dataset bundled with the product: adult (logistic regression), "
            "icu (the synthetic ICU sample, GRU-D), icu3 (its stays with a 3-class outcome, "
            "GRU-D by dpsgd), digits (8 × 8 handwritten digits, 10 "
            "classes: a CNN by dpsgd, --model taking its JSON spec, or logistic regression "
            "or an MLP by dpsgd), or wine (3 classes), digits-table (the digits as 64 "
            "columns, 10 classes) or digits-table-k3 … -k9 (its rows of the first K digits, "
            "K classes), tabular: logistic regression or an MLP by dpsgd, logistic "
            "regression by expm (its Langevin sampler)."
        ),
    ] = "adult",
    model: Annotated[
        str | None,
        typer.Option(
            help="The request's model: a kind (logistic; mlp: dpsgd or expm_nf on adult; grud) "
            'or a JSON model spec, e.g. \'{"kind": "mlp", "hidden": [32]}\' or, on digits, '
            '\'{"kind": "cnn", "conv": [{"channels": 4}]}\'. Default: the '
            "dataset's (GRU-D on icu, else logistic regression).",
            show_default=False,
        ),
    ] = None,
    dpsgd: Annotated[
        str | None,
        typer.Option(
            help="The request's dpsgd options as JSON (method dpsgd, one-run audits), e.g. "
            '\'{"engine": "ghost", "epochs": 1}\'.',
            show_default=False,
        ),
    ] = None,
    expm: Annotated[
        str | None,
        typer.Option(
            help="The request's expm options as JSON (method expm, one-run audits), e.g. "
            '\'{"sampler": "mcmc", "chains": 2}\' for its HMC sampler (default: Langevin).',
            show_default=False,
        ),
    ] = None,
    expm_nf: Annotated[
        str | None,
        typer.Option(
            "--expm-nf",
            help="The request's expm_nf options as JSON (method expm_nf, one-run audits), "
            'e.g. \'{"steps": 200, "n_samples_per_step": 16}\' for a smaller flow run.',
            show_default=False,
        ),
    ] = None,
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
    attack: Annotated[
        AttackChoice,
        typer.Option(
            "--attack",
            help="one_run: the one-run audit with m canaries. lira: LiRA membership "
            "inference with --shadow-models models on a pool of --pool public Adult rows "
            "(dpsgd, expm or expm_nf; no --canaries).",
        ),
    ] = AttackChoice.one_run,
    shadow_models: Annotated[
        int | None,
        typer.Option(
            "--shadow-models",
            help=f"LiRA: M, the models trained (4 to 256; default {LIRA_DEFAULT_MODELS}).",
        ),
    ] = None,
    pool: Annotated[
        int | None,
        typer.Option(help=f"LiRA: public Adult rows in the pool (default {LIRA_DEFAULT_POOL})."),
    ] = None,
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
    """Run a privacy audit (one-run: one training run; LiRA: M) and print ε's lower bound
    and the test's ceiling. Public data only; nothing is charged or released."""
    _positive("epsilon", epsilon)
    if not math.isfinite(delta) or delta < 0:  # δ = 0: expm_nf's pure claim
        fail(f"--delta must be a number ≥ 0, got {delta!r}")
    if not 0 < confidence < 1:
        fail(f"--confidence must be in (0, 1), got {confidence!r}")
    body = request_body(
        method=method,
        epsilon=epsilon,
        delta=delta,
        dataset=dataset,
        model=model,
        confidence=confidence,
        canary_kind=canary_kind.value,
        attack=attack.value,
        canaries=canaries,
        guesses=guesses,
        dpsgd=dpsgd,
        expm=expm,
        expm_nf=expm_nf,
        shadow_models=shadow_models,
        pool=pool,
    )
    if via_api:
        _audit_via_api(Api(url, key), body, timeout)
        return
    if attack == AttackChoice.lira:
        _lira_here(body)
        return
    if canaries is None:
        fail("--canaries is required by a one-run audit")
    if shadow_models is not None or pool is not None:
        fail("--shadow-models and --pool are for LiRA audits (--attack lira) only")
    _one_run_here(body)


def _one_run_here(body: dict[str, Any]) -> None:
    """A one-run audit in-process: the request checked as the API checks it (without the
    worker's time limit), then worker/audits.py's run of it, as the worker's task runs it."""
    from service.audits import validated
    from worker.audits import run_requested_audit

    with _refusals():
        request, _ = validated(AuditRequest.model_validate(body))
        audit = run_requested_audit(request)
    _report(
        audit.bound,
        method=method_words(audit.method, None if request.expm is None else request.expm.sampler),
        model=audit.model,
        dataset=audit.dataset,
        rows=audit.rows,
        epsilon=request.epsilon,
        delta=request.delta,
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
    lira: LiraFigures | None = None,
) -> None:
    if lira is not None:
        typer.echo(lira_sentence(lira, b.confidence))
        typer.echo(f"one-run bound of one held-out target: {audit_sentence(b)}")
    else:
        typer.echo(audit_sentence(b))
    kind = "gradient " if canary_kind == "gradient" else ""
    if lira is not None:
        kind = "pool rows as "
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


MODEL_WORDS = {"logistic": "logistic regression", "mlp": "MLP", "grud": "GRU-D", "cnn": "CNN"}


def method_words(method: str, sampler: str | None) -> str:
    """The method as the report names it: ExpM with its sampler (``expm (mcmc)``), as the
    dashboard's audit list does, so an HMC audit never reads as a Langevin one."""
    return method if sampler is None else f"{method} ({sampler})"


@contextmanager
def _refusals() -> Iterator[None]:
    """What the audit refuses, as the command's one-line error (exit 1)."""
    from service.audits import AuditRefused
    from service.plans import PlanError

    try:
        yield
    except AuditRefused as exc:
        fail(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{where}: {first['msg']} (got {first.get('input')!r})")
    except PlanError as exc:
        fail(f"no plan for this configuration: {exc}")


def _lira_here(body: dict[str, Any]) -> None:
    """A LiRA audit in-process: the request checked as the API checks it (without the
    worker's time limit), then worker/lira.py's run."""
    from service.audits import validated
    from worker.lira import audit_figures, run_lira_audit

    start = time.perf_counter()
    with _refusals():
        request, _ = validated(AuditRequest.model_validate(body))
        result = run_lira_audit(request)
    _report(
        result.one_run,
        method=request.method,
        model="logistic",
        dataset=request.dataset,
        rows=result.pool,
        epsilon=request.epsilon,
        delta=request.delta,
        noise_multiplier=result.plan.get("noise_multiplier"),
        steps=result.plan.get("steps"),
        sampling_rate=result.plan.get("sampling_rate"),
        seconds=time.perf_counter() - start,
        lira=audit_figures(result),
    )


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
        method=method_words(config["method"], (config.get("expm") or {}).get("sampler")),
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
        lira=None if r.get("lira") is None else LiraFigures.model_validate(r["lira"]),
    )
    typer.echo(f"audit {audit['id']} (GET /v1/admin/audits/{audit['id']}, dashboard: Audits)")
