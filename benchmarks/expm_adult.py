"""ExpM+NF on UCI Adult next to DP-SGD and non-private logistic regression (CPU).

Reproduces the Adult experiment of Bridges, Tombs & Stanley, "Are Normalizing Flows the
Key to Unlocking the Exponential Mechanism?" (arXiv:2311.09200): test AUC of logistic
regression for ε ∈ {1e-4, 1e-3, 1e-2, 0.1, 1, 10}.

- ExpM+NF: ``worker.mechanisms.expm_nf.run_expm_nf`` (the production entry point), R
  independently trained flows per ε, S released samples per flow, the AUC of every
  sample; median over the R·S AUCs. Two flow families: the default (planar layers plus a
  learnable elementwise affine layer, initialised at the regulariser-only density) and
  "planar only" (planar layers on a fixed N(0, I) base, no affine layer).
- DP-SGD: Opacus 1.6, Poisson sampling, noise multiplier calibrated with the PRV
  accountant to (ε, δ = 1e-5), logistic regression with BCE.
- Non-private: BCE logistic regression (scikit-learn, lbfgs) and the squared-loss
  ("ℓ²") objective Σ(σ(θx) − y)² + λ‖θ‖² minimised by L-BFGS (the ExpM density's mode).

Also measures the throughput of the flow's batched utility evaluation relative to a plain
``torch.matmul`` of the same shape, in the same process.

Seeds are fixed here so the benchmark is reproducible; production runs seed the generator
from a CSPRNG.

    .venv/bin/python benchmarks/expm_adult.py            # full run (≈ 20 min, 2 cores)
    .venv/bin/python benchmarks/expm_adult.py --quick    # smoke run (≈ 2 min)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.utils.benchmark as tbench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.datasets.tabular import encode, validate_frame  # noqa: E402
from service.modelspec import LogisticSpec  # noqa: E402
from worker.mechanisms.base import TabularTrainingSet  # noqa: E402
from worker.mechanisms.expm_nf import (  # noqa: E402
    ExpmNfParams,
    run_expm_nf,
    squared_error_utility,
)
from worker.models import build_batched  # noqa: E402
from worker.models.logistic import Logistic  # noqa: E402

EPSILONS = (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)
DELTA = 1e-5
RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Adult:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_adult() -> Adult:
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())

    def part(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        raw = pd.read_csv(ROOT / "examples/adult" / name, **schema.read_csv_kwargs())
        table = encode(schema, validate_frame(schema, raw).frame)
        return torch.from_numpy(table.x), torch.from_numpy(table.y)

    xtr, ytr = part("adult.data.gz")
    xte, yte = part("adult.test.gz")
    return Adult(xtr, ytr, xte, yte)


class AucScorer:
    """AUC of many linear models at once on a fixed test set (ties handled exactly).

    Identical test rows get identical scores, so rows are grouped first; distinct rows tie
    only with probability 0 under continuous θ, so one sort per model suffices:
    AUC = Σ_u pos_u·(negatives scored below u + ½·neg_u) / (P·N).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        unique, inverse = torch.unique(x, dim=0, return_inverse=True)
        self.x = unique.double()
        self.pos = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, y.double())
        self.neg = torch.zeros(len(unique), dtype=torch.float64).index_add_(
            0, inverse, 1.0 - y.double()
        )
        self.denominator = float(self.pos.sum() * self.neg.sum())

    def __call__(self, weights: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
        out = []
        for w, b in zip(weights.split(256), bias.split(256), strict=True):
            scores = w.double() @ self.x.T + b.double().unsqueeze(-1)
            order = scores.argsort(dim=1)
            pos, neg = self.pos[order], self.neg[order]
            below = neg.cumsum(1) - neg
            out.append(((pos * (below + 0.5 * neg)).sum(1) / self.denominator).numpy())
        return np.concatenate(out)


# --------------------------------------------------------------------------- ExpM+NF


@dataclass
class ExpmRun:
    variant: str
    epsilon: float
    repeat: int
    wall_s: float
    aucs: np.ndarray
    diagnostics: dict[str, float] = field(default_factory=dict)


VARIANTS: dict[str, dict[str, Any]] = {
    "expm_nf": {},
    "expm_nf_planar_only": {"affine": False, "base_std": 1.0},
    "expm_nf_sylvester": {"flow": "sylvester"},
}
VARIANT_LABELS = {
    "expm_nf": "ExpM+NF (planar + affine, default)",
    "expm_nf_planar_only": "ExpM+NF (planar only, N(0, I) base)",
    "expm_nf_sylvester": "ExpM+NF (Sylvester + affine)",
}
DEFAULT_VARIANTS = ["expm_nf", "expm_nf_planar_only"]


def run_expm(
    data: Adult,
    scorer: AucScorer,
    *,
    variant: str,
    epsilon: float,
    repeat: int,
    samples: int,
    overrides: dict[str, Any],
) -> ExpmRun:
    params = ExpmNfParams(epsilon=epsilon, samples=samples, **{**VARIANTS[variant], **overrides})
    generator = torch.Generator().manual_seed(1000 * repeat + 17)
    start = time.perf_counter()
    out = run_expm_nf(
        spec=LogisticSpec(),
        params=params,
        data=TabularTrainingSet(data.x_train, data.y_train),
        device=torch.device("cpu"),
        generator=generator,
        progress=lambda step, total: None,
    )
    wall = time.perf_counter() - start
    weights = torch.stack([r["linear.weight"][0] for r in out.releases])
    bias = torch.stack([r["linear.bias"][0] for r in out.releases])
    return ExpmRun(variant, epsilon, repeat, wall, scorer(weights, bias), out.enclave_diagnostics)


# ---------------------------------------------------------------------------- DP-SGD


@dataclass
class DpsgdRun:
    epsilon: float
    repeat: int
    auc: float
    wall_s: float
    calibration_s: float
    noise_multiplier: float
    epsilon_spent: float
    error: str = ""


@dataclass(frozen=True)
class DpsgdConfig:
    epochs: int = 5
    batch_size: int = 512
    lr: float = 2.0
    max_grad_norm: float = 1.0


def prv_eps_error(epsilon: float) -> float:
    """The PRV accountant's ε discretisation error (Gopi et al. 2021). Opacus' default 0.01
    (absolute) cannot certify ε < 0.01, and 5% of ε makes the mesh too fine to compute
    below that (hours); so 5% of ε for ε ≥ 0.01 and 50% below (a valid, looser bound:
    the noise is then somewhat larger than a tighter accountant would need)."""
    return (0.05 if epsilon >= 0.01 else 0.5) * epsilon


def calibrate_prv(epsilon: float, sample_rate: float, steps: int) -> tuple[float, float]:
    """(noise multiplier, certified ε upper bound) for (ε, δ) by the PRV accountant."""
    from opacus.accountants import PRVAccountant
    from opacus.accountants.utils import get_noise_multiplier

    sigma = float(
        get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=DELTA,
            sample_rate=sample_rate,
            steps=steps,
            accountant="prv",
            epsilon_tolerance=0.01 * epsilon,
            eps_error=prv_eps_error(epsilon),
        )
    )
    accountant = PRVAccountant()
    accountant.history = [(sigma, sample_rate, steps)]
    return sigma, float(accountant.get_epsilon(DELTA, eps_error=prv_eps_error(epsilon)))


def run_dpsgd(
    data: Adult,
    *,
    epsilon: float,
    repeat: int,
    config: DpsgdConfig,
    sigma: float,
    calibration_s: float,
    epsilon_spent: float,
) -> DpsgdRun:
    from opacus import PrivacyEngine
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(7919 * repeat + 3)
    model = Logistic(data.x_train.shape[1])
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data.x_train, data.y_train),
        batch_size=config.batch_size,
    )
    start = time.perf_counter()
    engine = PrivacyEngine(accountant="prv")
    model, optimiser, loader = engine.make_private(
        module=model,
        optimizer=optimiser,
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=config.max_grad_norm,
        poisson_sampling=True,
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(config.epochs):
        for xb, yb in loader:
            optimiser.zero_grad()
            if len(xb):
                loss_fn(model(xb), yb).backward()
            optimiser.step()
    wall = time.perf_counter() - start
    with torch.no_grad():
        scores = model(data.x_test).numpy()
    auc = float(roc_auc_score(data.y_test.numpy(), scores))
    return DpsgdRun(epsilon, repeat, auc, wall, calibration_s, sigma, epsilon_spent)


# ----------------------------------------------------------------------- non-private


@dataclass
class NonPrivate:
    name: str
    auc: float
    wall_s: float


def nonprivate_bce(data: Adult) -> NonPrivate:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    start = time.perf_counter()
    clf = LogisticRegression(max_iter=5000).fit(data.x_train.numpy(), data.y_train.numpy())
    wall = time.perf_counter() - start
    auc = roc_auc_score(data.y_test.numpy(), clf.decision_function(data.x_test.numpy()))
    return NonPrivate("non-private logistic regression (BCE, sklearn lbfgs, C=1)", auc, wall)


def nonprivate_squared(data: Adult, l2: float) -> NonPrivate:
    """argmin Σ(σ(θx) − y)² + λ‖θ‖²: the mode of the ExpM density (for every ε)."""
    from sklearn.metrics import roc_auc_score

    model = build_batched(LogisticSpec(), data.x_train.shape[1])
    theta = torch.zeros(1, model.n_params, requires_grad=True)
    optimiser = torch.optim.LBFGS([theta], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = -squared_error_utility(model, theta, data.x_train, data.y_train, l2=l2).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    start = time.perf_counter()
    for _ in range(5):
        optimiser.step(closure)  # type: ignore[no-untyped-call]
    wall = time.perf_counter() - start
    with torch.no_grad():
        scores = model.logits(theta, data.x_test)[0].numpy()
    name = f"non-private squared loss + λ‖θ‖² (λ={l2:g}, L-BFGS; the ExpM mode)"
    return NonPrivate(name, float(roc_auc_score(data.y_test.numpy(), scores)), wall)


# ------------------------------------------------------------------------ throughput


def throughput(data: Adult, n_samples: int, batch: int) -> dict[str, float]:
    """Batched utility of N parameter vectors on b rows vs torch.matmul (N, d) × (d, b)."""
    model = build_batched(LogisticSpec(), data.x_train.shape[1])
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(n_samples, model.n_params, generator=g)
    xb, yb = data.x_train[:batch].contiguous(), data.y_train[:batch].contiguous()
    w = theta[:, :-1].contiguous()
    xt = xb.T.contiguous()
    util = tbench.Timer(
        "squared_error_utility(model, theta, xb, yb, l2=1.0)",
        globals={
            "squared_error_utility": squared_error_utility,
            "model": model,
            "theta": theta,
            "xb": xb,
            "yb": yb,
        },
    ).blocked_autorange(min_run_time=1.0)
    mm = tbench.Timer(
        "torch.matmul(w, xt)", globals={"torch": torch, "w": w, "xt": xt}
    ).blocked_autorange(min_run_time=1.0)
    return {
        "N": n_samples,
        "b": batch,
        "utility_ms": util.median * 1e3,
        "matmul_ms": mm.median * 1e3,
        # Throughput ratio = (evaluations/s of the utility) / (evaluations/s of the matmul).
        "ratio": mm.median / util.median,
    }


# --------------------------------------------------------------------------- report


def _defaults_text() -> str:
    fields = asdict(ExpmNfParams(epsilon=1.0))
    fields.pop("epsilon")
    fields.pop("samples")
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def _fmt_eps(e: float) -> str:
    return f"{e:g}"


def write_plot(
    path: Path,
    expm: list[ExpmRun],
    dpsgd: list[DpsgdRun],
    baselines: list[NonPrivate],
    epsilons: list[float],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if any(r.variant == v for r in expm)]
    groups = [*variants, *(["dpsgd"] if dpsgd else [])]
    width = 0.8 / len(groups)
    colours = {
        "expm_nf": "tab:blue",
        "expm_nf_planar_only": "tab:orange",
        "expm_nf_sylvester": "tab:purple",
        "dpsgd": "tab:green",
    }
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for gi, group in enumerate(groups):
        data: list[list[float]] = []
        for e in epsilons:
            if group == "dpsgd":
                vals = [r.auc for r in dpsgd if r.epsilon == e and not r.error]
            else:
                vals = [
                    float(a) for r in expm if r.variant == group and r.epsilon == e for a in r.aucs
                ]
            data.append(vals if vals else [math.nan])
        pos = np.arange(len(epsilons)) + (gi - (len(groups) - 1) / 2) * width
        bp = ax.boxplot(
            data,
            positions=pos,
            widths=width * 0.9,
            patch_artist=True,
            showfliers=False,
            manage_ticks=False,
            medianprops={"color": "black"},
        )
        for box in bp["boxes"]:
            box.set_facecolor(colours[group])
            box.set_alpha(0.6)
        label = "DP-SGD (Opacus, PRV, δ=1e-5)" if group == "dpsgd" else VARIANT_LABELS[group]
        ax.plot([], [], color=colours[group], lw=8, alpha=0.6, label=label)
    for b, style in zip(baselines, ["--", ":"], strict=False):
        ax.axhline(b.auc, color="k", ls=style, lw=1, label=f"{b.name}: {b.auc:.3f}")
    ax.axhline(0.5, color="grey", lw=0.5)
    ax.set_xticks(np.arange(len(epsilons)), [_fmt_eps(e) for e in epsilons])
    ax.set_xlabel("ε (nominal for ExpM+NF)")
    ax.set_ylabel("test AUC")
    ax.set_title("UCI Adult, logistic regression: ExpM+NF vs DP-SGD vs non-private")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(
    path: Path,
    *,
    command: str,
    args: argparse.Namespace,
    expm: list[ExpmRun],
    dpsgd: list[DpsgdRun],
    baselines: list[NonPrivate],
    tput: list[dict[str, float]],
    dp_config: DpsgdConfig,
    expm_overrides: dict[str, Any],
    total_s: float,
    data: Adult,
) -> str:
    ref = baselines[0].auc
    lines = [
        "# ExpM+NF on UCI Adult (logistic regression), CPU",
        "",
        f"Command: `{command}`  ",
        f"Machine: {platform.platform()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}; total wall time {total_s / 60:.1f} min.  ",
        f"Data: train {data.x_train.shape[0]} rows (adult.data), test {data.x_test.shape[0]} "
        f"rows (adult.test), d = {data.x_train.shape[1]} (public-schema encoding).  ",
        f"ExpM+NF: {args.repeats} flows per ε × {args.samples} released samples each; "
        f"ExpmNfParams defaults {_defaults_text()}"
        + (f", overridden by {json.dumps(expm_overrides)}" if expm_overrides else "")
        + "; variants change only the fields shown in their label "
        + f"({json.dumps({k: VARIANTS[k] for k in args.variants})}). "
        "ε is **nominal** for ExpM+NF: the flow only approximates the exponential "
        "mechanism's density.  ",
        (
            "DP-SGD: not run (--skip-dpsgd)."
            if args.skip_dpsgd
            else f"DP-SGD: {args.dpsgd_repeats} runs per ε, {dp_config.epochs} epochs, Poisson "
            f"batch {dp_config.batch_size}, SGD lr {dp_config.lr}, clip "
            f"{dp_config.max_grad_norm}, PRV-calibrated noise, δ = {DELTA:g}."
        ),
        "",
        "## Non-private references",
        "",
        "| model | test AUC | wall time (s) |",
        "|---|---|---|",
    ]
    lines += [f"| {b.name} | {b.auc:.4f} | {b.wall_s:.2f} |" for b in baselines]
    lines += [
        "",
        "## Test AUC by ε",
        "",
        'Median AUC with the [25%, 75%] quantiles in brackets; "% NP" = median / non-private '
        f"BCE AUC ({ref:.4f}). ExpM+NF statistics are over all released samples of all flows; "
        "wall time is per flow (training, enclave diagnostics and drawing the samples).",
        "",
    ]
    header = "| ε |"
    sep = "|---|"
    for v in VARIANTS:
        if any(r.variant == v for r in expm):
            header += f" {VARIANT_LABELS[v]}: AUC | % NP | s/flow |"
            sep += "---|---|---|"
    header += " DP-SGD: AUC | % NP | s/run | σ |"
    sep += "---|---|---|---|"
    lines += [header, sep]
    for e in args.epsilons:
        row = f"| {_fmt_eps(e)} |"
        for v in VARIANTS:
            runs = [r for r in expm if r.variant == v and r.epsilon == e]
            if not any(r.variant == v for r in expm):
                continue
            if runs:
                a = np.concatenate([r.aucs for r in runs])
                q1, med, q3 = np.percentile(a, [25, 50, 75])
                wall = np.median([r.wall_s for r in runs])
                row += f" {med:.3f} [{q1:.3f}, {q3:.3f}] | {100 * med / ref:.0f}% | {wall:.1f} |"
            else:
                row += " – | – | – |"
        dp = [r for r in dpsgd if r.epsilon == e and not r.error]
        if dp:
            a = np.array([r.auc for r in dp])
            q1, med, q3 = np.percentile(a, [25, 50, 75])
            row += (
                f" {med:.3f} [{q1:.3f}, {q3:.3f}] | {100 * med / ref:.0f}% | "
                f"{np.median([r.wall_s for r in dp]):.1f} | {dp[0].noise_multiplier:.4g} |"
            )
        else:
            err = next((r.error for r in dpsgd if r.epsilon == e), "not run")
            row += f" – ({err}) | – | – | – |"
        lines.append(row)
    lines += [
        "",
        "## How close is the flow to the exponential mechanism? (enclave diagnostics)",
        "",
        "Medians over the flows. `final loss` = reverse-KL objective on all rows "
        "(KL(q‖p) − log Z); `KL` = its importance-sampling estimate of KL(q‖p) (1024 draws; "
        "an underestimate when q misses mass); `ESS` = effective sample fraction of the "
        "weights p̃/q (1 = q is p; ≪ 1 = q is far from p, usually too narrow).",
        "",
        "`KL ≥` is a lower bound that does not trust a flow's own samples: KL(q‖p) = "
        "final loss + log Z ≥ final loss + max log Ẑ, the max over every flow trained for "
        "that ε in this run (log Ẑ underestimates log Z on average, by Jensen).",
        "",
        "| variant | ε | final loss | KL(q‖p) IS est. | KL ≥ | ESS fraction | log Z est. |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        for e in args.epsilons:
            runs = [r for r in expm if r.variant == v and r.epsilon == e]
            if not runs:
                continue

            def med(key: str, runs: list[ExpmRun] = runs) -> float:
                return float(np.median([r.diagnostics.get(key, math.nan) for r in runs]))

            best_log_z = max(
                (r.diagnostics.get("log_z", -math.inf) for r in expm if r.epsilon == e),
                default=math.nan,
            )
            lines.append(
                f"| {VARIANT_LABELS[v]} | {_fmt_eps(e)} | {med('final_loss'):.2f} | "
                f"{med('reverse_kl'):.2f} | {med('final_loss') + best_log_z:.2f} | "
                f"{med('ess_fraction'):.3f} | {med('log_z'):.2f} |"
            )
    lines += [
        "",
        "## Utility-evaluation throughput",
        "",
        "`squared_error_utility` (logits by one matmul, sigmoid, squared error, regulariser) "
        "for N parameter vectors on b rows, against a bare `torch.matmul` of the same "
        "(N, d) × (d, b) shape, timed in this run (median of torch.utils.benchmark). "
        "Ratio = utility throughput / matmul throughput.",
        "",
        "| N | b | utility (ms) | matmul (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t['N']:.0f} | {t['b']:.0f} | {t['utility_ms']:.3f} | {t['matmul_ms']:.3f} | "
        f"{t['ratio']:.2f} |"
        for t in tput
    ]
    lines.append("")
    text = "\n".join(lines)
    path.write_text(text)
    return text


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (≈ 2 min)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--repeats", type=int, default=None, help="flows per ε (full: 5)")
    parser.add_argument("--samples", type=int, default=None, help="samples per flow (full: 1000)")
    parser.add_argument("--dpsgd-repeats", type=int, default=None, help="full: 5")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="override flow training steps")
    parser.add_argument("--skip-dpsgd", action="store_true", help="ExpM+NF only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--prefix", default="expm_adult", help="result file name prefix")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.samples = args.samples or (200 if args.quick else 1000)
    args.dpsgd_repeats = args.dpsgd_repeats or (1 if args.quick else 5)
    overrides: dict[str, Any] = {}
    if args.steps or args.quick:
        overrides["steps"] = args.steps or 300
    dp_config = DpsgdConfig(epochs=1) if args.quick else DpsgdConfig()
    command = ".venv/bin/python benchmarks/expm_adult.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    data = load_adult()
    scorer = AucScorer(data.x_test, data.y_test)
    print(f"$ {command}", flush=True)

    baselines = [nonprivate_bce(data), nonprivate_squared(data, l2=ExpmNfParams(1.0).l2)]
    for b in baselines:
        print(f"{b.name}: AUC {b.auc:.4f} ({b.wall_s:.2f} s)", flush=True)

    tput = [throughput(data, 64, 1024), throughput(data, 1024, data.x_train.shape[0])]
    for t in tput:
        print(
            f"throughput N={t['N']:.0f} b={t['b']:.0f}: utility {t['utility_ms']:.3f} ms, "
            f"matmul {t['matmul_ms']:.3f} ms, ratio {t['ratio']:.2f}",
            flush=True,
        )

    expm: list[ExpmRun] = []
    for variant in args.variants:
        for e in args.epsilons:
            for r in range(args.repeats):
                run = run_expm(
                    data,
                    scorer,
                    variant=variant,
                    epsilon=e,
                    repeat=r,
                    samples=args.samples,
                    overrides=overrides,
                )
                expm.append(run)
                print(
                    f"{variant} ε={_fmt_eps(e)} flow {r}: median AUC {np.median(run.aucs):.3f} "
                    f"wall {run.wall_s:.1f} s ESS {run.diagnostics.get('ess_fraction', 0):.3f} "
                    f"KL {run.diagnostics.get('reverse_kl', 0):.2f}",
                    flush=True,
                )

    dpsgd: list[DpsgdRun] = []
    n = data.x_train.shape[0]
    sample_rate = dp_config.batch_size / n
    steps = int(dp_config.epochs / sample_rate)
    for e in [] if args.skip_dpsgd else args.epsilons:
        t0 = time.perf_counter()
        try:
            sigma, spent = calibrate_prv(e, sample_rate, steps)
        except Exception as exc:  # report, don't hide: e.g. PRV cannot certify this ε
            msg = f"calibration failed: {exc}"
            print(f"dpsgd ε={_fmt_eps(e)}: {msg}", flush=True)
            dpsgd.append(
                DpsgdRun(
                    e,
                    0,
                    math.nan,
                    math.nan,
                    time.perf_counter() - t0,
                    math.nan,
                    math.nan,
                    error=msg,
                )
            )
            continue
        calibration_s = time.perf_counter() - t0
        for r in range(args.dpsgd_repeats):
            dp_run = run_dpsgd(
                data,
                epsilon=e,
                repeat=r,
                config=dp_config,
                sigma=sigma,
                calibration_s=calibration_s,
                epsilon_spent=spent,
            )
            dpsgd.append(dp_run)
            print(
                f"dpsgd ε={_fmt_eps(e)} run {r}: AUC {dp_run.auc:.3f} σ={sigma:.4g} "
                f"wall {dp_run.wall_s:.1f} s (calibration {calibration_s:.1f} s) "
                f"ε spent {dp_run.epsilon_spent:.4g}",
                flush=True,
            )

    total = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_plot(args.out / f"{args.prefix}_auc.png", expm, dpsgd, baselines, args.epsilons)
    report = write_report(
        args.out / f"{args.prefix}.md",
        command=command,
        args=args,
        expm=expm,
        dpsgd=dpsgd,
        baselines=baselines,
        tput=tput,
        dp_config=dp_config,
        expm_overrides=overrides,
        total_s=total,
        data=data,
    )
    raw = {
        "command": command,
        "baselines": [vars(b) for b in baselines],
        "throughput": tput,
        "expm": [
            {
                **{k: v for k, v in vars(r).items() if k != "aucs"},
                "auc_quantiles": dict(
                    zip(
                        ["q05", "q25", "q50", "q75", "q95"],
                        np.percentile(r.aucs, [5, 25, 50, 75, 95]).tolist(),
                        strict=True,
                    )
                ),
            }
            for r in expm
        ],
        "dpsgd": [vars(r) for r in dpsgd],
        "dpsgd_config": vars(dp_config),
        "total_s": total,
    }
    (args.out / f"{args.prefix}.json").write_text(json.dumps(raw, indent=1, default=float))
    print(report)


if __name__ == "__main__":
    main()
