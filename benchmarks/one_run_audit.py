"""The one-run privacy audit (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846) of every
auditable configuration, as `enclave admin audit` and POST /v1/admin/audits run it
(worker/audits.py): on public Adult, logistic regression by DP-SGD (engines exact, ghost,
jl), by ExpM (proven Langevin sampler; the HMC sampler, asymptotic, as expm_mcmc) and by
ExpM+NF (nominal, δ = 0), the default MLP by DP-SGD (mlp, mlp_ghost); on the bundled
synthetic ICU sample, GRU-D by DP-SGD and by ExpM+NF (slow: left out unless named). For
each, the ε lower bound at each claimed ε, the ceiling the test can show with its m
canaries, and the time per audit (data, one training run, scoring; CPU, one torch thread).

    .venv/bin/python benchmarks/one_run_audit.py --tag methods     # all but SLOW, ε ∈ {0.5, 1, 4}
    .venv/bin/python benchmarks/one_run_audit.py --configs grud_icu_expm_nf --epsilons 1 \
        --tag grud_expm_nf
    .venv/bin/python benchmarks/one_run_audit.py --configs dpsgd --repeats 3   # the first slice
    .venv/bin/python benchmarks/one_run_audit.py --configs dpsgd --epsilons 100 --repeats 2 \
        --tag sanity_eps100
    .venv/bin/python benchmarks/one_run_audit.py --configs dpsgd dpsgd_gradient \
        dpsgd_gradient_q1 --repeats 3 --tag gradient      # white-box gradient canaries
    .venv/bin/python benchmarks/one_run_audit.py --configs dpsgd mlp mlp_ghost expm_mcmc_2 \
        --epsilons 1 --tag mlp_mcmc       # the MLP and the HMC sampler beside DP-SGD's anchor

Gradient canaries (canary_kind "gradient", worker/gradient_canaries.py): m Dirac canary
gradients in the real DP-SGD run (--gradient-canaries, default 100 of logistic regression's
105 parameters on Adult), at the service's default plan (dpsgd_gradient) and at a full-batch
plan (dpsgd_gradient_q1: expected batch = n̂ = n + m/2, so q = 1, 3 epochs), where the
per-canary signal q·√T/σ is largest.

m: --canaries on Adult (default 1,000, the issue's speed line), --icu-canaries on the ICU
sample (default 200: the audit's limit, 10% of its 2,000 stays); fewer canaries cut the
scoring and the ceiling, not the training time. Each repeat is an independent audit (fresh
canaries, coins and training noise); r, the number of guesses, is fixed before any run
(default m/5), so no correction is needed. Writes benchmarks/results/one_run_audit{_TAG}.md
and .json with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enclave.audit_cli import audit_sentence  # noqa: E402
from service.audits import PUBLIC_DATASETS  # noqa: E402
from service.modelspec import GrudSpec, LogisticSpec, MlpSpec, ModelSpec  # noqa: E402
from service.privacy.one_run_audit import epsilon_lower_bound  # noqa: E402
from service.schemas import DpsgdOptions  # noqa: E402
from service.schemas.audits import CanaryKind  # noqa: E402
from service.schemas.expm import ExpmOptions  # noqa: E402
from worker.audits import run_one_run_audit  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
PURE_METHODS = ("expm_nf",)
"""Pure ε-DP claims: audited at δ = 0, as their jobs must ask."""
JL_PROJECTIONS = 8


@dataclass(frozen=True)
class Config:
    dataset: str
    method: str
    model: ModelSpec
    options: DpsgdOptions | None = None
    canary_kind: CanaryKind = "input"
    full_batch: bool = False  # expected batch = n̂ (q = 1), 3 epochs; set per m at run time
    expm: ExpmOptions | None = None  # ExpM's options (its sampler); None: its defaults

    def options_for(self, canaries: int) -> DpsgdOptions | None:
        if not self.full_batch:
            return self.options
        rows = PUBLIC_DATASETS[self.dataset].rows + canaries // 2  # n̂ of the audit's plan
        return DpsgdOptions(batch_size=rows, epochs=3)

    @property
    def engine(self) -> str:
        if self.method != "dpsgd":
            return "" if self.expm is None else self.expm.sampler
        return "exact" if self.options is None else self.options.engine


CONFIGS: dict[str, Config] = {
    "dpsgd": Config("adult", "dpsgd", LogisticSpec()),
    "dpsgd_ghost": Config("adult", "dpsgd", LogisticSpec(), DpsgdOptions(engine="ghost")),
    "dpsgd_jl": Config(
        "adult",
        "dpsgd",
        LogisticSpec(),
        DpsgdOptions(engine="jl", jl_projections=JL_PROJECTIONS),
    ),
    "expm": Config("adult", "expm", LogisticSpec()),  # its default sampler: Langevin (proven)
    "expm_nf": Config("adult", "expm_nf", LogisticSpec()),
    # The exact mechanism's HMC sampler (asymptotic) at its defaults: 8 chains, 500 + 500.
    "expm_mcmc": Config("adult", "expm", LogisticSpec(), expm=ExpmOptions(sampler="mcmc")),
    # The same with 2 chains (the audit releases one): a quarter of the time (~45 min at
    # the defaults by the service's estimate, ~11 min with 2 chains).
    "expm_mcmc_2": Config(
        "adult", "expm", LogisticSpec(), expm=ExpmOptions(sampler="mcmc", chains=2)
    ),
    "mlp": Config("adult", "dpsgd", MlpSpec()),  # the product's default MLP: 16 tanh units
    "mlp_ghost": Config("adult", "dpsgd", MlpSpec(), DpsgdOptions(engine="ghost")),
    "dpsgd_gradient": Config("adult", "dpsgd", LogisticSpec(), canary_kind="gradient"),
    "dpsgd_gradient_q1": Config(
        "adult", "dpsgd", LogisticSpec(), canary_kind="gradient", full_batch=True
    ),
    "grud_icu": Config("icu", "dpsgd", GrudSpec()),
    "grud_icu_expm_nf": Config("icu", "expm_nf", GrudSpec()),
}
"""Every (dataset, method, model, engine) the audit door accepts (service/audits.py's
AUDITABLE), each at the service's defaults."""
SLOW = ("grud_icu_expm_nf", "expm_mcmc", "expm_mcmc_2")
"""Left out by default: ExpM+NF on GRU-D took 8-11 min per audit on the shared 2 cores; the
HMC sampler on Adult is estimated at ~45 min (8 chains) and ~11 min (2 chains)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    ap.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=[c for c in CONFIGS if c not in SLOW],
        help=f"default: all but {', '.join(SLOW)}",
    )
    ap.add_argument("--delta", type=float, default=1e-5, help="δ (0 for expm_nf whatever this is)")
    ap.add_argument("--canaries", type=int, default=1000, help="m on Adult")
    ap.add_argument("--icu-canaries", type=int, default=200, help="m on the ICU sample")
    ap.add_argument(
        "--gradient-canaries", type=int, default=100, help="m of gradient canaries (≤ parameters)"
    )
    ap.add_argument("--guesses", type=int, default=None, help="r; default m/5")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--tag", default="", help="results file suffix")
    args = ap.parse_args()
    command = " ".join(["python benchmarks/one_run_audit.py", shlex.join(sys.argv[1:])]).strip()

    rows = []
    for name in args.configs:
        config = CONFIGS[name]
        canaries = args.icu_canaries if config.dataset == "icu" else args.canaries
        if config.canary_kind == "gradient":
            canaries = args.gradient_canaries
        delta = 0.0 if config.method in PURE_METHODS else args.delta
        for eps in args.epsilons:
            for i in range(args.repeats):
                a = run_one_run_audit(
                    method=config.method,
                    epsilon=eps,
                    delta=delta,
                    canaries=canaries,
                    dataset=config.dataset,
                    guesses=args.guesses,
                    confidence=args.confidence,
                    options=config.options_for(canaries),
                    model=config.model,
                    canary_kind=config.canary_kind,
                    expm=config.expm,
                )
                b = a.bound
                row = {
                    "config": name,
                    "dataset": config.dataset,
                    "method": config.method,
                    "model": config.model.kind,
                    "engine": config.engine,
                    "canary_kind": config.canary_kind,
                    "epsilon": eps,
                    "delta": delta,
                    "repeat": i,
                    "canaries": b.canaries,
                    "guesses": b.guesses,
                    "correct": b.correct,
                    "epsilon_lower_bound": b.epsilon,
                    "ceiling": b.ceiling,
                    "r_ceiling": epsilon_lower_bound(
                        canaries=b.canaries,
                        guesses=b.guesses,
                        correct=b.guesses,
                        confidence=b.confidence,
                        delta=delta,
                    ).epsilon,
                    "confidence": b.confidence,
                    "noise_multiplier": a.noise_multiplier,
                    "steps": a.steps,
                    "sampling_rate": a.sampling_rate,
                    "rows": a.rows,
                    "seconds": a.seconds,
                    "sentence": audit_sentence(b),
                }
                rows.append(row)
                print(
                    f"{name} ε = {eps:g} #{i}: {row['sentence']}; {b.correct}/{b.guesses}; "
                    f"{a.seconds:.2f} s",
                    flush=True,
                )

    meta = {
        "command": command,
        "when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), "
        f"load {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
    }
    suffix = f"_{args.tag}" if args.tag else ""
    (RESULTS / f"one_run_audit{suffix}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    total = sum(r["seconds"] for r in rows)
    lines = [
        "# One-run privacy audit of every auditable configuration",
        "",
        "Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846), Theorem 3.1. Canaries 'input' "
        "(black box): m mislabeled rows (stays, on the ICU sample), each included w.p. 1/2, "
        "ONE training run under the plan the service builds (its defaults unless the config "
        "says), scores = minus each canary's loss under the release. Canaries 'gradient' "
        "(white box, worker/gradient_canaries.py): m Dirac gradient canaries of norm C on "
        "the m quietest parameters, each in w.p. 1/2 and then sampled like a row, in the "
        "real DP-SGD run; scores from the run's summed noisy sums on their parameters less "
        "the public data's expected share (a Gaussian likelihood ratio). Top r/2 guessed in "
        "and bottom r/2 out (r fixed before the runs). worker/audits.py; "
        "service/privacy/one_run_audit.py. Ceiling: the "
        "bound with all m canaries guessed and every guess right, the most this test can "
        "ever show with m canaries (what the API reports); r-ceiling: the most it can show "
        "with the r guesses fixed here (all r right).",
        "",
        f"Command: `{command}`  ",
        f"Run: {meta['when_utc']}; {meta['machine']}; Python {meta['python']}; "
        f"{len(rows)} audits, {total / 60:.1f} min of audit time in all.",
        "",
        "| config | data | method | model | engine | canaries | claimed ε | δ | # | m | r "
        "| v (right) | ε lower bound | ceiling | r-ceiling | σ | steps | q | seconds |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|",
    ]

    def fmt(value: float | None, spec: str) -> str:
        return "—" if value is None else format(value, spec)

    for r in rows:
        lines.append(
            f"| {r['config']} | {r['dataset']} | {r['method']} | {r['model']} "
            f"| {r['engine'] or '—'} | {r['canary_kind']} | {r['epsilon']:g} "
            f"| {r['delta']:g} | {r['repeat']} "
            f"| {r['canaries']} | {r['guesses']} | {r['correct']} "
            f"| {r['epsilon_lower_bound']:.3f} | {r['ceiling']:.3f} | {r['r_ceiling']:.3f} "
            f"| {fmt(r['noise_multiplier'], '.4f')} | {fmt(r['steps'], 'd')} "
            f"| {fmt(r['sampling_rate'], '.5f')} | {r['seconds']:.2f} |"
        )
    (RESULTS / f"one_run_audit{suffix}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote benchmarks/results/one_run_audit{suffix}.md")


if __name__ == "__main__":
    main()
