"""`enclave admin audit`: the one-run privacy audit (Steinke, Nasr & Jagielski 2023,
arXiv:2305.08846) of a method and configuration, run here, in-process, on a public dataset
bundled with the product (worker/audits.py). Nothing is charged to any budget and nothing
is released: the admin reads the figure, with the largest figure the same test could
show beside it, because a small lower bound is not a proof of privacy."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from pydantic import ValidationError

from enclave.errors import fail
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


def admin_audit(
    method: Annotated[str, typer.Option(help="The method to audit (auditable: dpsgd).")],
    epsilon: Annotated[float, typer.Option(help="The claimed ε of the audited plan.")],
    delta: Annotated[float, typer.Option(help="The claimed δ of the audited plan.")],
    canaries: Annotated[int, typer.Option(help="m: canaries, each included w.p. 1/2.")],
    dataset: Annotated[
        str, typer.Option(help="A public dataset bundled with the product.")
    ] = "adult",
    guesses: Annotated[
        int | None, typer.Option(help="r: guesses made (top r/2 and bottom r/2). Default m/5.")
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence of the bound.")] = 0.95,
) -> None:
    """Run a one-run privacy audit (one training run) and print ε's lower bound and the
    test's ceiling. Public data only; nothing is charged or released."""
    _positive("epsilon", epsilon)
    _positive("delta", delta)
    if not 0 < confidence < 1:
        fail(f"--confidence must be in (0, 1), got {confidence!r}")
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
        )
    except AuditRefused as exc:
        fail(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"{where}: {first['msg']} (got {first.get('input')!r})")
    except PlanError as exc:
        fail(f"no plan for this configuration: {exc}")
    b = audit.bound
    typer.echo(audit_sentence(b))
    typer.echo(
        f"{b.correct} of {b.guesses} guesses right on {b.canaries:,} canaries; "
        f"{audit.method} logistic regression on {audit.dataset} ({audit.rows:,} rows), "
        f"claimed ε = {epsilon:g}, δ = {delta:g}; σ = {audit.noise_multiplier:.4g}, "
        f"{audit.steps} steps at q = {audit.sampling_rate:.4g}; {audit.seconds:.1f} s; "
        "nothing charged"
    )
