"""Issue 20: the proven ExpM (method ``expm``, sampler ``langevin``) for multinomial logistic
regression on the bundled digits (1,797 8×8 images, 10 classes): the plan the API would
build (default steps and l2 from the ε, learning rate 2; K·(d + 1) = 650 parameters,
sensitivity 2^(a+c)·√(2B)), at ε = 1 and 8 (δ = 1e-5), each ε run ``--repeats`` times (the
noise comes from the enclave's secure generator, so every run differs); accuracy on the
training images. ``--steps`` overrides the default steps (a public choice).

    .venv/bin/python benchmarks/expm_multiclass_digits.py --repeats 5

The public row count is the true 1,797 here (registration would use a DP noisy count).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from service.modelspec import LogisticSpec
from service.plans import plan_for_dataset
from service.schemas import ExpmOptions, JobRequest
from worker.mechanisms.registry import run_mechanism

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_data import load_digits_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--steps", type=int, nargs="+", default=[0], help="0: the default")
    args = parser.parse_args()
    torch.set_num_threads(1)
    digits = load_digits_set()
    x, labels, data, public = digits.x, digits.labels, digits.data, digits.public
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| ε | δ | steps | l2 | σ | accuracy per run | median | seconds per run |")
    print("|---|---|---|---|---|---|---|---|")
    for eps in args.epsilons:
        for steps in args.steps:
            request = JobRequest(
                dataset="digits",
                method="expm",
                epsilon=eps,
                delta=1e-5,
                model=LogisticSpec(),
                expm=ExpmOptions(steps=steps or None),
            )
            plan = plan_for_dataset(request, n_rows=len(labels), public_schema=public)
            m = plan.mechanism
            assert plan.guarantee == "proven" and m["classes"] == 10 and m["parameters"] == 650
            accuracies, seconds = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = run_mechanism(
                    plan=plan,
                    spec=LogisticSpec(classes=10),
                    data=data,
                    device=torch.device("cpu"),
                    progress=lambda *_: None,
                )
                seconds.append(time.perf_counter() - start)
                state = out.releases[0]
                w = state["linear.weight"].double().numpy()
                b = state["linear.bias"].double().numpy()
                accuracies.append(float(((x @ w.T + b).argmax(axis=1) == labels).mean()))
            print(
                f"| {eps:g} | 1e-5 | {m['steps']} | {m['l2']:g} | {m['noise_multiplier']:.1f} | "
                f"{', '.join(f'{a:.3f}' for a in accuracies)} | {np.median(accuracies):.3f} | "
                f"{np.median(seconds):.2f} |"
            )


if __name__ == "__main__":
    main()
