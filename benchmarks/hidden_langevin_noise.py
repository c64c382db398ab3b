"""Noise of the proven Langevin sampler on Adult: composition (today's charge) against the
converging hidden-iterate bound (service/privacy/hidden_langevin.py), issue 24.

A calculation, not a run of the sampler: for Adult's public constants as plan_langevin
takes them (n̂ = the training rows, B = row_norm_sq_bound(schema)), at δ = 1e-5 and
ε ∈ {1e-3, 1e-2, 1e-1, 1}, for each regulariser l2 with the step η = 1/β (the bound
needs η < 2/β; the product's default lr = 2.0 violates it, β = (n̂·B/4 + l2)/n̂), it
prints for K steps:

* σ (composition, PLD): the noise multiplier today's charge needs, K Gaussian steps at
  q = 1 calibrated by PLD as plan_langevin does (without its pmf-slack event). K-fold
  composition of the Gaussian mechanism with σ is exactly the Gaussian mechanism with
  σ/√K (Dong, Roth & Su 2022, Cor. 3.3), so σ_K = √K·σ₁: it is computed from one PLD
  calibration at K = 1 and checked against calibrate_noise_multiplier(steps=K) at the
  default K;
* σ (composition, RDP): the same with the RDP conversion the hidden bound uses
  (σ₁ by hidden_langevin.noise_for_epsilon at K = 1, where A = 1, on its orders up to
  2^24: CALIBRATION_ORDERS stop at 1024 and cannot reach ε = 1e-3 below σ = 1e4);
* σ (hidden, RDP): hidden_langevin.noise_for_epsilon (RDP → (ε, δ) by epsilon_from_rdp);
* k: the inverse temperature of the target exp(−k·(Σℓ + l2‖θ‖²/2)) that the chain
  samples (up to discretisation), k = 2n̂/(η·B·σ²) (service/methods/expm.py), for both
  charges, and k of the exact mechanism (Gopi, Lee & Liu 2022's μ-GDP, plan_mcmc's
  k = l2·μ²/B with μ = 1/σ₁ by PLD), the ceiling the chain can approach;
* the grid factor (1 + 2n̂E/L)² the bound takes for the worker's fixed-point gradient
  at the grid bits plan_langevin would choose for the hidden σ (residual bits a from
  langevin_grid_bits, θ bits b from theta_bits; E per module docstring, n_max = n̂),
  NOT included in the hidden σ column (a fixed point: a depends on σ);
* time at 1.37 ms per step (benchmarks/results/expm_proven.md: 300 steps in 0.41 s on
  Adult, 2 threads).

K: the plan's default (100 for ε < 1, 300 at ε = 1), and K_mix = ⌈ln(100)/(−ln c)⌉, the
steps after which the chain's worst-case W2 distance to its own stationary law has
shrunk 100-fold by the synchronous-coupling contraction c = 1 − ηλ, λ = l2/n̂ (public
constants only; the data's curvature makes the real chain mix faster, but no public
bound shows it).

    .venv/bin/python benchmarks/hidden_langevin_noise.py [--no-write]

Results: benchmarks/results/hidden_langevin_noise.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from expm_adult import load_adult  # noqa: E402

from service.datasets.kinds import load_schema_yaml  # noqa: E402
from service.methods.common import PlanError  # noqa: E402
from service.methods.expm import (  # noqa: E402
    DEFAULT_LANGEVIN_STEPS,
    DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON,
    langevin_grid_bits,
    row_norm_sq_bound,
)
from service.privacy.calibrate import calibrate_noise_multiplier  # noqa: E402
from service.privacy.calibrate.common import NOISE_MULTIPLIER_MAX  # noqa: E402
from service.privacy.hidden_langevin import (  # noqa: E402
    logistic_regression_problem,
    noise_for_epsilon,
)
from worker.mechanisms.fixed_point import theta_bits  # noqa: E402

DELTA = 1e-5
EPSILONS = (1e-3, 1e-2, 1e-1, 1.0)
L2S = (1.0, 30.0, 300.0)
SECONDS_PER_STEP = 0.41 / 300
SIGMA_ERROR = 1.4e-15  # σ̃'s error against the logistic function (worker/mechanisms/langevin.py)


def grid_factor(*, sigma: float, n: int, parameters: int, bound: int) -> str:
    """(1 + 2nE/L)² at the plan's grid for σ, E/L = (2^-a + √(P·B)·2^-(b+1)/4 + 1.4e-15)."""
    try:
        a, c = langevin_grid_bits(noise_multiplier=sigma, norm_sq_bound=bound)
    except PlanError:
        return "no grid (σ too large)"
    b, _ = theta_bits(feature_bits=c, parameters=parameters)
    per_row = 2.0**-a + math.sqrt(parameters * bound) * 2.0 ** -(b + 1) / 4.0 + SIGMA_ERROR
    return f"{(1.0 + 2.0 * n * per_row) ** 2:.2f} (a = {a})"


def fmt(x: float) -> str:
    return f"{x:.4g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    start = time.perf_counter()
    data = load_adult()
    schema = load_schema_yaml((ROOT / "examples/adult/schema.yaml").read_text())
    n, d = data.x_train.shape
    n = int(n)
    bound = row_norm_sq_bound(schema)
    parameters = int(d) + 1
    lines = [
        "# Proven Langevin on Adult: noise by composition vs the converging hidden-iterate bound",
        "",
        "Command: `.venv/bin/python benchmarks/hidden_langevin_noise.py` (a calculation from "
        f"public constants: n̂ = {n}, B = {bound}, P = {parameters}; δ = {DELTA:g}; "
        "η = 1/β, β = (n̂·B/4 + l2)/n̂, n_max = n̂). Columns: see the script's docstring. "
        "σ(comp) columns over 1e4 are refused by today's calibration (NOISE_MULTIPLIER_MAX). "
        "The grid factor is NOT in σ(hidden): it multiplies σ(hidden)² (RDP) and is what the "
        "worker's fixed-point gradient would cost today.",
        "",
    ]
    sigma_pld_1: dict[float, float] = {}
    sigma_rdp_1: dict[float, float] = {}
    for eps in EPSILONS:
        sigma_pld_1[eps] = calibrate_noise_multiplier(
            sampling_rate=1.0, steps=1, epsilon=eps, delta=DELTA, accountant="pld", rel_tol=1e-4
        )
        # RDP, one Gaussian step: the hidden calibration at K = 1 (A = 1), orders to 2^24.
        one = logistic_regression_problem(
            public_n_rows=n, row_norm_sq_bound=bound, l2=1.0, learning_rate=0.1
        )
        sigma_rdp_1[eps] = noise_for_epsilon(
            problem=one, steps=1, epsilon=eps, delta=DELTA
        ).noise_multiplier
    # The √K identity against the product's own calibration at the default K.
    check = []
    for eps in EPSILONS:
        k_default = DEFAULT_LANGEVIN_STEPS if eps >= 1 else DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON
        try:
            direct = calibrate_noise_multiplier(
                sampling_rate=1.0, steps=k_default, epsilon=eps, delta=DELTA, accountant="pld"
            )
            check.append(
                f"ε = {eps:g}, K = {k_default}: calibrate(steps=K) = {fmt(direct)}, "
                f"√K·σ₁ = {fmt(math.sqrt(k_default) * sigma_pld_1[eps])}"
            )
        except ValueError as exc:
            check.append(f"ε = {eps:g}, K = {k_default}: calibrate(steps=K) refused ({exc})")
    lines += [
        "Composition check (PLD, q = 1): "
        + "; ".join(check)
        + ". (√K·σ₁ is up to 0.4 % below the product's own calibration at K, whose PLD "
        "discretisation is pessimistic: the σ comp PLD column slightly favours composition.)",
        "",
    ]
    for l2 in L2S:
        eta = n / (n * bound / 4.0 + l2)  # 1/β, β = (n_max·B/4 + l2)/n̂ with n_max = n̂
        problem = logistic_regression_problem(
            public_n_rows=n, row_norm_sq_bound=bound, l2=l2, learning_rate=eta
        )
        c = problem.contraction
        k_mix = math.ceil(math.log(100.0) / -math.log1p(-problem.contraction_gap))
        lines += [
            f"## l2 = {l2:g}: η = {eta:.4g}, c = 1 − {problem.contraction_gap:.3g}, "
            f"(1 + c)/(1 − c) = {(1 + c) / problem.contraction_gap:.4g}, K_mix = {k_mix}",
            "",
            "| ε | K | time | A(c, K) | σ comp PLD | σ comp RDP | σ hidden RDP "
            "| k comp PLD | k hidden | k exact ExpM | grid factor at σ hidden |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for eps in EPSILONS:
            k_default = DEFAULT_LANGEVIN_STEPS if eps >= 1 else DEFAULT_LANGEVIN_STEPS_SMALL_EPSILON
            k_exact = l2 / (bound * sigma_pld_1[eps] ** 2)
            for steps in (k_default, k_mix):
                comp_pld = math.sqrt(steps) * sigma_pld_1[eps]
                comp_rdp = math.sqrt(steps) * sigma_rdp_1[eps]
                hidden = noise_for_epsilon(problem=problem, steps=steps, epsilon=eps, delta=DELTA)
                sigma_h = hidden.noise_multiplier

                def temperature(sigma: float, eta: float = eta) -> float:
                    return 2.0 * n / (eta * bound * sigma**2)

                refused = " (refused)" if comp_pld > NOISE_MULTIPLIER_MAX else ""
                lines.append(
                    f"| {eps:g} | {steps} | {steps * SECONDS_PER_STEP:.3g} s "
                    f"| {fmt(hidden.amplification)} | {fmt(comp_pld)}{refused} | {fmt(comp_rdp)} "
                    f"| {fmt(sigma_h)} | {fmt(temperature(comp_pld))} "
                    f"| {fmt(temperature(sigma_h))} | {fmt(k_exact)} "
                    f"| {grid_factor(sigma=sigma_h, n=n, parameters=parameters, bound=bound)} |"
                )
        lines.append("")
    lines += [
        "Reading (holds for the table above):",
        "",
        "* At the plan's default K (100 or 300) the two charges are the same (A(c, K) ≈ K: "
        "K ≪ 1/(1 − c)); the hidden σ is 8–22 % *above* today's only because RDP "
        "converts to (ε, δ) less tightly than PLD (the gap grows as ε shrinks). "
        "The k at these K are nominal: after ηK ≈ 30 the chain is far from the "
        "stationary law whose temperature k describes "
        "(that is why they exceed the exact mechanism's k).",
        "* At K_mix the hidden bound needs σ² smaller by K/A(c, K) ≈ 2.35 than composition "
        "with the same conversion, so its k is 1.6–2.0× that of composition by PLD and "
        "0.69–0.87× the exact mechanism's k (the rest is RDP vs PLD conversion and c^K); "
        "composition is refused there (σ > 1e4) at ε = 1e-3 for every l2 and at ε = 0.01 "
        "for l2 ≤ 30.",
        "* K_mix is a public worst case from λ = l2/n̂ alone: 486k steps (≈ 11 min) at "
        "l2 = 1, 16k (22 s) at l2 = 30, 1.6k (2.2 s) at l2 = 300; the utility cost of a "
        "large l2 is not measured here.",
        "* The grid factor shows the worker's arithmetic cannot take this bound as it is: "
        "its residual grid 2^-a is coarsened as σ grows (noise range 2^40), and n̂·2^-a is "
        "then far above 1, multiplying the RDP by up to 1.4e4.",
        "",
        f"Computed in {time.perf_counter() - start:.1f} s (including loading Adult).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (ROOT / "benchmarks/results/hidden_langevin_noise.md").write_text(text)


if __name__ == "__main__":
    main()
