"""Noise calibration: speed (cold and warm) and tightness, both accountants (issue 12).

    .venv/bin/python benchmarks/calibration.py [--repeats 3]

Grid: ε ∈ {0.01, 0.1, 1, 10} nats, q = 256/30162, δ = 1e-5, T ∈ {354, 3540} steps,
accountant ∈ {pld, rdp}. For each cell:

* cold: a fresh Python subprocess imports service.privacy.calibrate (import time reported
  apart) and times its first ``calibrate`` call (median over --repeats subprocesses);
* warm: in this process, the same call again (a cache hit; median of 2000), and the call
  with the cache cleared (``uncached``: the steady-state compute time; median of 5);
* tightness: the gap of σ to the tightest σ we can compute: for PLD a plain geometric
  bisection (to 1e-5) on the same PLD at an 8× finer interval, for RDP a bisection on the
  full CALIBRATION_ORDERS grid (every order, rdp.py's per-order functions);
* independent check (PLD rows): dp_accounting's PLDAccountant at the same interval gives
  ε(σ) ≤ target and ε(σ/1.01) > target;
* ledger: the (ε, δ) that the charged RDP curve (the ledger's grid ORDERS) converts to
  (CKS), shown next to the stated ε.

Writes benchmarks/results/calibration.md.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from service.privacy import calibrate as cal
from service.privacy.calibrate import epsilon as cal_epsilon
from service.privacy.calibrate import noise as cal_noise
from service.privacy.calibrate.fast_pld import GaussianParts, fast_pld_epsilon
from service.privacy.events import PoissonSubsampledGaussianEvent
from service.privacy.orders import CALIBRATION_ORDERS, ORDERS
from service.privacy.rdp import epsilon_from_rdp

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
Q = 256 / 30162
DELTA = 1e-5
EPSILONS = (0.01, 0.1, 1.0, 10.0)
STEPS = (354, 3540)
ACCOUNTANTS = ("pld", "rdp")

COLD = """
import json, sys, time
t0 = time.perf_counter()
from service.privacy.calibrate import calibrate
t1 = time.perf_counter()
r = calibrate(sampling_rate={q!r}, steps={steps}, epsilon={eps!r}, delta={delta!r},
              accountant={acc!r})
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_s": t2 - t1, "sigma": r.noise_multiplier}}))
"""


def cold(acc: str, steps: int, eps: float, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        code = COLD.format(q=Q, steps=steps, eps=eps, delta=DELTA, acc=acc)
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    sigmas = {r["sigma"] for r in runs}
    if len(sigmas) != 1:
        raise SystemExit(f"non-deterministic σ across processes: {sigmas}")
    return {
        "import_ms": 1e3 * statistics.median(r["import_s"] for r in runs),
        "first_ms": 1e3 * statistics.median(r["first_s"] for r in runs),
        "sigma": runs[0]["sigma"],
    }


def timed(fn: object, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bisect(eps_of: object, target: float, lo: float, hi: float, tol: float = 1e-5) -> float:
    """Plain geometric bisection (the old method): smallest σ in [lo, hi] with ε ≤ target."""
    while hi / lo > 1.0 + tol:
        mid = math.sqrt(lo * hi)
        if eps_of(mid) <= target:  # type: ignore[operator]
            hi = mid
        else:
            lo = mid
    return hi


def tightest(acc: str, steps: int, eps: float, sigma: float) -> float:
    if acc == "pld":
        h = cal.pld_value_discretization(epsilon=eps, steps=steps) / 8.0

        def eps_of(s: float) -> float:
            parts = GaussianParts(gaussians=((Q, s, steps),), slack_tau=0.0)
            return fast_pld_epsilon(parts, DELTA, h)

    else:

        def eps_of(s: float) -> float:
            ev = PoissonSubsampledGaussianEvent(sampling_rate=Q, noise_multiplier=s, steps=steps)
            rdp = ev.rdp(CALIBRATION_ORDERS).tolist()
            return epsilon_from_rdp(rdp=rdp, orders=CALIBRATION_ORDERS, delta=DELTA)

    return bisect(eps_of, eps, sigma * 0.95, sigma * 1.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for acc in ACCOUNTANTS:
        for steps in STEPS:
            for eps in EPSILONS:
                kwargs = {
                    "sampling_rate": Q,
                    "steps": steps,
                    "epsilon": eps,
                    "delta": DELTA,
                    "accountant": acc,
                }
                c = cold(acc, steps, eps, args.repeats)
                cal_noise._calibrate_cached.cache_clear()
                res = cal.calibrate(**kwargs)  # type: ignore[arg-type]
                if res.noise_multiplier != c["sigma"]:
                    raise SystemExit("cache-miss σ differs from the subprocess's σ")
                warm_s = timed(lambda kw=kwargs: cal.calibrate(**kw), 2000)  # type: ignore[arg-type]
                if cal.calibrate(**kwargs).noise_multiplier != res.noise_multiplier:  # type: ignore[arg-type]
                    raise SystemExit("cache-hit σ differs from the cache-miss σ")

                def uncached(kw: dict[str, object] = kwargs) -> None:
                    cal_noise._calibrate_cached.cache_clear()
                    cal.calibrate(**kw)  # type: ignore[arg-type]

                uncached_s = timed(uncached, 5)
                sigma = res.noise_multiplier
                tight = tightest(acc, steps, eps, sigma)
                event = PoissonSubsampledGaussianEvent(
                    sampling_rate=Q, noise_multiplier=sigma, steps=steps
                )
                ledger = epsilon_from_rdp(
                    rdp=event.rdp(ORDERS).tolist(), orders=ORDERS, delta=DELTA
                )
                row: dict[str, Any] = {
                    "acc": acc,
                    "steps": steps,
                    "eps": eps,
                    "sigma": sigma,
                    "stated": res.epsilon,
                    "evals": res.evaluations,
                    "fell_back": res.fell_back,
                    "import_ms": c["import_ms"],
                    "cold_ms": c["first_ms"],
                    "warm_us": 1e6 * warm_s,
                    "uncached_ms": 1e3 * uncached_s,
                    "tight": tight,
                    "gap": sigma / tight - 1.0,
                    "ledger": ledger,
                    "dpa": None,
                    "dpa_low": None,
                }
                if acc == "pld":
                    h = cal.pld_value_discretization(epsilon=eps, steps=steps)
                    for key, s in (("dpa", sigma), ("dpa_low", sigma / 1.01)):
                        row[key] = cal_epsilon._dp_accounting_dpsgd_epsilon(
                            sampling_rate=Q, noise_multiplier=s, steps=steps, delta=DELTA, vdi=h
                        )
                rows.append(row)
                print(json.dumps(row), flush=True)
    write(rows, args.repeats)


def write(rows: list[dict[str, Any]], repeats: int) -> None:
    lines = [
        f"# Noise calibration benchmark ({platform.machine()}, {_cores()} cores)",
        "",
        f"Command: `.venv/bin/python benchmarks/calibration.py --repeats {repeats}`",
        "",
        f"q = 256/30162, δ = {DELTA:g}. cold = first `calibrate` call in a fresh process "
        f"(median of {repeats} processes; the import of service.privacy.calibrate, numpy and "
        "scipy included, is the `import` column); warm = the same call again (cache hit); "
        "uncached = the call with the cache cleared, in a warm process. gap = σ / σ_tight − 1, "
        "σ_tight = bisection to 1e-5 on the same PLD at an 8× finer interval (pld) or on "
        "the full CALIBRATION_ORDERS grid (rdp). dp_acc = dp_accounting's PLDAccountant at the "
        "same interval, at σ and at σ/1.01. ledger ε = the charged RDP curve (ORDERS) "
        "converted at δ (CKS): what the ledger's curve amounts to, next to the stated ε.",
        "",
        "| acc | T | target ε | σ | stated ε | evals | cold ms | import ms | warm µs "
        "| uncached ms | σ_tight | gap | dp_acc ε(σ) | dp_acc ε(σ/1.01) | ledger ε |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        dpa = "—" if r["dpa"] is None else f"{r['dpa']:.5g}"
        dpa_low = "—" if r["dpa_low"] is None else f"{r['dpa_low']:.5g}"
        acc = f"{r['acc']}{' (fell back)' if r['fell_back'] else ''}"
        lines.append(
            f"| {acc} | {r['steps']} | {r['eps']:g} | {r['sigma']:.6g} | {r['stated']:.5g} "
            f"| {r['evals']} | {r['cold_ms']:.1f} | {r['import_ms']:.0f} | {r['warm_us']:.1f} "
            f"| {r['uncached_ms']:.1f} | {r['tight']:.6g} | {100 * r['gap']:+.3f} % "
            f"| {dpa} | {dpa_low} | {r['ledger']:.4g} |"
        )
    worst_cold = max(float(r["cold_ms"]) for r in rows)
    worst_warm = max(float(r["warm_us"]) for r in rows)
    worst_gap = max(float(r["gap"]) for r in rows)
    lines += [
        "",
        f"Worst cold {worst_cold:.1f} ms (goal ≤ 50 ms), worst warm {worst_warm:.1f} µs "
        f"(goal ≤ 1 ms), worst gap to the tightest σ {100 * worst_gap:+.3f} % (goal ≤ 1 %).",
        "",
    ]
    (RESULTS / "calibration.md").write_text("\n".join(lines), encoding="utf-8")


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
