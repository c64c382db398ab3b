"""The one-run privacy audit (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846) of DP-SGD
logistic regression on public Adult, as `enclave admin audit` runs it (worker/audits.py):
the ε lower bound at each claimed ε, the ceiling the test can show with m canaries, and
the time per audit (one training run + scoring, CPU, one torch thread).

    .venv/bin/python benchmarks/one_run_audit.py                      # ε ∈ {0.5, 1, 4}, m = 1000
    .venv/bin/python benchmarks/one_run_audit.py --epsilons 100 --repeats 2 --tag sanity

Each repeat is an independent audit (fresh canaries, coins and training noise); r, the
number of guesses, is fixed before any run (default m/5), so no correction is needed.
Writes benchmarks/results/one_run_audit{_TAG}.md and .json with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enclave.audit_cli import audit_sentence  # noqa: E402
from worker.audits import run_one_run_audit  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 4.0])
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--guesses", type=int, default=None, help="r; default m/5")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--tag", default="", help="results file suffix")
    args = ap.parse_args()
    command = " ".join(["python benchmarks/one_run_audit.py", shlex.join(sys.argv[1:])]).strip()

    rows = []
    for eps in args.epsilons:
        for i in range(args.repeats):
            a = run_one_run_audit(
                method="dpsgd",
                epsilon=eps,
                delta=args.delta,
                canaries=args.canaries,
                guesses=args.guesses,
                confidence=args.confidence,
            )
            b = a.bound
            row = {
                "epsilon": eps,
                "delta": args.delta,
                "repeat": i,
                "canaries": b.canaries,
                "guesses": b.guesses,
                "correct": b.correct,
                "epsilon_lower_bound": b.epsilon,
                "ceiling": b.ceiling,
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
                f"ε = {eps:g} #{i}: {row['sentence']}; {b.correct}/{b.guesses}; {a.seconds:.2f} s",
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
    lines = [
        "# One-run privacy audit of DP-SGD logistic regression on Adult",
        "",
        "Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846), Theorem 3.1, black-box: m "
        "mislabeled Adult rows as canaries, each included w.p. 1/2, ONE training run under "
        "the plan the service builds, scores = minus each canary's loss, top r/2 guessed "
        "in and bottom r/2 out (r fixed before the runs). worker/audits.py; "
        "service/privacy/one_run_audit.py.",
        "",
        f"Command: `{command}`  ",
        f"Run: {meta['when_utc']}; {meta['machine']}; Python {meta['python']}.",
        "",
        "| claimed ε | δ | repeat | m | r | v (right) | ε lower bound | ceiling (m of m right) "
        "| σ | steps | q | seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['epsilon']:g} | {r['delta']:g} | {r['repeat']} | {r['canaries']} "
            f"| {r['guesses']} | {r['correct']} | {r['epsilon_lower_bound']:.3f} "
            f"| {r['ceiling']:.3f} | {r['noise_multiplier']:.4f} | {r['steps']} "
            f"| {r['sampling_rate']:.5f} | {r['seconds']:.2f} |"
        )
    (RESULTS / f"one_run_audit{suffix}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote benchmarks/results/one_run_audit{suffix}.md")


if __name__ == "__main__":
    main()
