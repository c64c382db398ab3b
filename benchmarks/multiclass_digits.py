"""Issue 20: DP-SGD multinomial logistic regression on the bundled digits (1,797 8×8 images,
10 classes), the plan the API would build (default batch and epochs, the exact softmax
engine, proven), at ε = 1 and 8 (δ = 1e-5): accuracy on the training images, each ε run
``--repeats`` times (the noise comes from the enclave's secure generator, so every run
differs), beside non-private multinomial logistic regression (scikit-learn, its default L2
penalty C = 1) on the same encoding.

    .venv/bin/python benchmarks/multiclass_digits.py --repeats 3

The public row count is the true 1,797 here (registration would use a DP noisy count).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from service.modelspec import LogisticSpec
from service.plans import plan_for_dataset
from service.schemas import JobRequest
from worker.mechanisms.registry import run_mechanism

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_data import load_digits_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    args = parser.parse_args()
    torch.set_num_threads(1)
    digits = load_digits_set()
    x, labels, data, public = digits.x, digits.labels, digits.data, digits.public
    print("| ε | δ | batch | epochs | steps | σ | accuracy per run | seconds per run |")
    print("|---|---|---|---|---|---|---|---|")
    for eps in args.epsilons:
        request = JobRequest(
            dataset="digits", method="dpsgd", epsilon=eps, delta=1e-5, model=LogisticSpec()
        )
        plan = plan_for_dataset(request, n_rows=len(labels), public_schema=public)
        assert plan.guarantee == "proven" and plan.model["classes"] == 10
        m = plan.mechanism
        accuracies, seconds = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = run_mechanism(
                plan=plan,
                spec=request.model,
                data=data,
                device=torch.device("cpu"),
                progress=lambda *_: None,
            )
            seconds.append(time.perf_counter() - start)
            state = out.releases[0]
            w, b = state["linear.weight"].double().numpy(), state["linear.bias"].double().numpy()
            accuracies.append(float(((x @ w.T + b).argmax(axis=1) == labels).mean()))
        print(
            f"| {eps:g} | 1e-5 | {m['batch_size']} | {m['epochs']} | {m['steps']} | "
            f"{m['noise_multiplier']:.3f} | {', '.join(f'{a:.3f}' for a in accuracies)} | "
            f"{np.median(seconds):.1f} |"
        )
    baseline = LogisticRegression(max_iter=2000).fit(x, labels)
    print(f"\nnon-private (scikit-learn, L2 C = 1): accuracy {baseline.score(x, labels):.3f}")


if __name__ == "__main__":
    main()
