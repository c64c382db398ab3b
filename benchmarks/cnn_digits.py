"""Issue 20 (point 3, first slice): DP-SGD on a small CNN on the bundled digits (1,797 8×8
images, 10 classes), the product's proven exact engine (worker/mechanisms/exact_conv.py,
through the plan the API builds: its default batch and epochs) against stock Opacus
(GradSampleModule per-sample gradients, its DPOptimizer, Poisson sampling) on the same CNN,
expected batch, clip norm, learning rate, steps and noise multiplier σ, in one run, rounds
interleaved, one thread each; beside the same CNN trained without privacy (plain SGD, same
batch and epochs, at the plan's learning rate and at a tenth of it). Reports time per epoch
(median over rounds, and the ratio product / Opacus from the same rounds), peak memory (each
DP-SGD run in a forked child: the resident memory it added, code pages excluded), accuracy on
the training images at each ε (δ = 1e-5), and the plan's quote-time estimate. Writes the head
of benchmarks/results/cnn_digits.md.

    .venv/bin/python benchmarks/cnn_digits.py --rounds 3

With --generated HxWxC (e.g. 28x28x1, 32x32x3), the same comparison on a generated set of that
shape (digits_data.generated_sets: --rows training images, accuracy on --test-rows held-out
ones); --epochs overrides the plan's default. Writes (or replaces) that shape's section of
cnn_digits.md.

    .venv/bin/python benchmarks/cnn_digits.py --generated 28x28x1 --rows 10000 --epochs 2 --rounds 1

With --schedules constant,exponential (issue 20, item 4: decaying against constant noise at
equal ε), the product's engine alone runs under each noise schedule at the same (ε, δ), batch,
epochs and model, each plan built by the API's planner (plan_for_dataset: σ, or σ₀ of
σ_e = σ₀·R^{e/2} per epoch e at --decay R, calibrated so the whole run meets ε), schedules
interleaved within each round (their order alternates between rounds); it reports accuracy
(median, min-max) and time per epoch per schedule, and writes (or replaces) its own section of
cnn_digits.md. Without --schedules, the comparison against Opacus above, as before.

    .venv/bin/python benchmarks/cnn_digits.py --schedules constant,exponential --rounds 3
    .venv/bin/python benchmarks/cnn_digits.py --generated 28x28x1 --rows 10000 --epochs 2 \
        --rounds 2 --schedules constant,exponential --decay 0.5

The public row count is the true one here (registration would use a DP noisy count).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import pickle
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from service.config import Settings
from service.datasets.images import ImageSchema
from service.modelspec import CnnSpec, cnn_geometry
from service.plans import plan_for_dataset
from service.resources import ResourceLimits, plan_resources, resource_refusal
from service.schemas import JobRequest
from worker.mechanisms.registry import MECHANISMS, mechanism_key, run_mechanism
from worker.models import build_module
from worker.noise import rounded_gaussian

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits_data import generated_description, generated_sets, load_digits_set

RESULTS = Path(__file__).resolve().parent / "results" / "cnn_digits.md"
T = TypeVar("T")
CONV = [
    {"channels": 16, "kernel": 3, "padding": 1, "pool": "avg2"},
    {"channels": 32, "kernel": 3, "padding": 1, "pool": "avg2"},
]


def _status_bytes(*fields: str) -> int:
    """The sum of /proc/self/status's ``fields`` (kB) in bytes."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            values[key] = int(rest.split()[0]) * 1024
    return sum(values[f] for f in fields)


def _forked(run: Callable[..., T], *args: Any) -> tuple[T, int]:
    """``run(*args)`` in a forked child (after the parent's data and imports, before any training
    in the parent), and the peak resident memory it added: the child's VmHWM at the end less
    its file-backed and shared pages then (code paged in again after the fork) and less its
    anonymous pages at the start, after glibc's malloc_trim (Linux /proc/self/status; a lower
    bound on the peak anonymous memory the run added)."""
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child() -> None:
        # Free heap pages the parent left resident (glibc keeps them; data generation frees
        # hundreds of MB) go back to the kernel first, so the run cannot reuse them unseen.
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        start = _status_bytes("RssAnon")
        result = run(*args)
        peak = _status_bytes("VmHWM") - _status_bytes("RssFile", "RssShmem") - start
        # plain pickle: torch's own reduction would pass tensors by fds the child takes along
        send.send_bytes(pickle.dumps((result, peak)))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    send.close()  # the child's end only: a child that dies ends recv() with EOFError
    result, peak = pickle.loads(receive.recv_bytes())
    process.join()
    assert process.exitcode == 0, process.exitcode
    return result, peak


def _accuracy(module: torch.nn.Module, x: torch.Tensor, labels: np.ndarray) -> float:
    with torch.no_grad():
        return float((module(x).argmax(dim=1).numpy() == labels).mean())


def _product(plan: Any, spec: Any, data: Any) -> tuple[float, dict[str, torch.Tensor]]:
    start = time.perf_counter()
    out = run_mechanism(
        plan=plan, spec=spec, data=data, device=torch.device("cpu"), progress=lambda *_: None
    )
    return time.perf_counter() - start, out.releases[0]


def _opacus(
    spec: CnnSpec, m: dict[str, Any], x: torch.Tensor, y: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor]]:
    """Stock Opacus 1.6: GradSampleModule, DPOptimizer (clip C, noise σ·C, expected batch
    q·n̂), Poisson sampling at q, the plan's steps, SGD at the plan's learning rate."""
    from opacus import PrivacyEngine

    module = build_module(spec, x.shape[1])
    optimizer = torch.optim.SGD(module.parameters(), lr=m["learning_rate"])
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y.long()), batch_size=int(m["batch_size"])
    )
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=module,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=m["noise_multiplier"],
            max_grad_norm=m["max_grad_norm"],
            poisson_sampling=True,
        )
    loss_fn = torch.nn.CrossEntropyLoss(reduction="mean")
    start = time.perf_counter()
    steps = 0
    while steps < m["steps"]:
        for xb, yb in loader:
            if steps == m["steps"]:
                break
            optimizer.zero_grad()
            if len(xb):
                loss_fn(model(xb), yb).backward()
            optimizer.step()
            steps += 1
    return time.perf_counter() - start, module.state_dict()


def _non_private(
    spec: CnnSpec, m: dict[str, Any], x: torch.Tensor, y: torch.Tensor, test: Any, lr: float
) -> float:
    module = build_module(spec, x.shape[1])
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    for _ in range(m["epochs"]):
        order = torch.randperm(len(x), generator=gen)
        for idx in order.split(int(m["batch_size"])):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(x[idx]), y[idx].long()).backward()
            optimizer.step()
    return _accuracy(module, torch.from_numpy(test.x), test.labels)


def _shape(text: str) -> tuple[int, int, int]:
    h, w, c = (int(v) for v in text.lower().split("x"))
    return h, w, c


SCHEDULES = ("constant", "exponential")


def _convs(spec: CnnSpec) -> str:
    layers = cnn_geometry(spec)
    c, h, w = layers[-1].pooled
    return (
        "; ".join(
            f"conv {g.c_in}→{g.c_out} {g.kernel}×{g.kernel} pad {g.padding}, ReLU"
            + (", avg 2×2" if g.pool else "")
            for g in layers
        )
        + f"; Linear {c * h * w}→10"
    )


def _schedules(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(names) - set(SCHEDULES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"schedules are among {', '.join(SCHEDULES)}: {text!r}")
    return names


def _request(
    name: str, eps: float, epochs: int | None, schedule: str | None = None, decay: float = 0.0
) -> JobRequest:
    """The API's request for the benchmark's CNN: default batch, ``epochs`` (None: the plan's
    default), and with ``schedule`` given, that noise schedule (R = ``decay`` if exponential)."""
    options: dict[str, Any] = {} if epochs is None else {"epochs": epochs}
    if schedule == "exponential":
        options |= {"noise_schedule": "exponential", "noise_decay": decay}
    return JobRequest.model_validate(
        {
            "dataset": name,
            "method": "dpsgd",
            "epsilon": eps,
            "delta": 1e-5,
            "model": {"kind": "cnn", "conv": CONV},
            **({"dpsgd": options} if options else {}),
        }
    )


def _compare_schedules(
    args: argparse.Namespace, digits: Any, test: Any, load_before: tuple[float, ...]
) -> None:
    """The product's engine under each of ``args.schedules`` at equal (ε, δ), batch, epochs and
    model (see the module's docstring); writes its section of cnn_digits.md."""
    public, x_test = digits.public, torch.from_numpy(test.x)
    lines = [
        "| ε | schedule | batch | epochs | steps | σ first epoch | σ last epoch | s/epoch "
        "(median) | accuracy median | accuracy min-max | accuracy per round |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    spec: CnnSpec | None = None
    for eps in args.epsilons:
        plans = {}
        for schedule in args.schedules:
            request = _request(public["name"], eps, args.epochs, schedule, args.decay)
            try:
                plan = plan_for_dataset(request, n_rows=len(digits.labels), public_schema=public)
            except ValueError as exc:  # PlanError (a ValueError): the refusal is the finding
                raise SystemExit(f"ε = {eps:g}, {schedule}: the planner refuses it: {exc}") from exc
            assert plan.guarantee == "proven"
            MECHANISMS[mechanism_key(plan)].resolve()  # its imports before the forks
            plans[schedule] = (request, plan)
        seconds: dict[str, list[float]] = {s: [] for s in args.schedules}
        accuracy: dict[str, list[float]] = {s: [] for s in args.schedules}
        for r in range(args.rounds):
            order = args.schedules if r % 2 == 0 else args.schedules[::-1]
            for schedule in order:
                request, plan = plans[schedule]
                spec = CnnSpec.model_validate(plan.model)
                (wall, state), _ = _forked(_product, plan, request.model, digits.data)
                module = build_module(spec, digits.x.shape[1])
                module.load_state_dict(state)
                seconds[schedule].append(wall / plan.mechanism["epochs"])
                accuracy[schedule].append(_accuracy(module, x_test, test.labels))
                print(
                    f"ε = {eps:g} {schedule}: {seconds[schedule][-1]:.3f} s/epoch, "
                    f"accuracy {accuracy[schedule][-1]:.3f}",
                    flush=True,
                )
        for schedule in args.schedules:
            m = plans[schedule][1].mechanism
            sigmas = m.get("noise_multipliers") or [m["noise_multiplier"]]
            acc = accuracy[schedule]
            name = schedule if schedule == "constant" else f"exponential, R = {args.decay:g}"
            lines.append(
                f"| {eps:g} | {name} | {m['batch_size']} | {m['epochs']} | {m['steps']} | "
                f"{sigmas[0]:.3f} | {sigmas[-1]:.3f} | "
                f"{statistics.median(seconds[schedule]):.3f} | "
                f"{statistics.median(acc):.3f} | {min(acc):.3f}-{max(acc):.3f} | "
                f"{', '.join(f'{a:.3f}' for a in acc)} |"
            )
    load_after = os.getloadavg()
    assert spec is not None
    params = plans[args.schedules[0]][1].mechanism["parameters"]
    if args.generated is None:
        what = "digits"
        where = f"Accuracy on the {len(digits.labels):,} training images"
    else:
        gh, gw, gc = args.generated
        what = f"generated {gh}×{gw}×{gc} images"
        where = (
            f"Data: {generated_description(args.rows, args.test_rows, args.generated)} "
            f"Accuracy on the {args.test_rows:,} held-out images"
        )
    heading = f"## Constant against decaying noise at equal ε: {what}"
    epochs = "default epochs" if args.epochs is None else f"epochs {args.epochs}"
    text = "\n".join(
        [
            heading,
            "",
            "Command: `.venv/bin/python benchmarks/cnn_digits.py " + " ".join(sys.argv[1:]) + "`",
            f"Machine: {os.cpu_count()} cores, shared; load average {load_before[0]:.1f} before, "
            f"{load_after[0]:.1f} after; torch {torch.__version__}, one thread.",
            "",
            f"The product's exact engine only, the CNN of the sections above ({_convs(spec)}; "
            f"{params} parameters), default batch, {epochs}, clip C = 1, lr = 1, "
            "δ = 1e-5; each schedule's plan from the API's planner (plan_for_dataset): "
            "constant σ, or σ_e = σ₀·R^{e/2} in epoch e with σ₀ calibrated on the whole "
            "schedule's history at the same (ε, δ) (service/privacy/schedules.py). "
            f"{where}, one per run; rounds: {args.rounds}, schedules interleaved within each "
            "round (order alternating between rounds); time per epoch is the run's wall time "
            "over its epochs (a forked child per run), median over rounds.",
            "",
            *lines,
            "",
        ]
    )
    print(text)
    if not args.no_write:
        _write(heading, text)


def _write(heading: str | None, text: str) -> None:
    """Replace the section of cnn_digits.md under ``heading`` (a '## ' line), or the file's
    head before its first '## ' section when None; a new section goes at the end."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    parts = old.split("\n## ")
    head, sections = parts[0], ["## " + p for p in parts[1:]]
    if heading is None:
        head = text.rstrip("\n") + "\n"
    else:
        body = text.rstrip("\n") + "\n"
        hit = [i for i, sec in enumerate(sections) if sec.splitlines()[0] == heading]
        if hit:
            sections[hit[0]] = body
        else:
            sections.append(body)
    RESULTS.write_text("\n".join([head, *sections]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--generated", type=_shape, default=None, metavar="HxWxC")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--test-rows", type=int, default=2_000)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument(
        "--schedules",
        type=_schedules,
        default=None,
        metavar="constant,exponential",
        help="compare the product's noise schedules at equal ε (no Opacus run)",
    )
    parser.add_argument("--decay", type=float, default=0.8, help="R of the exponential schedule")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from opacus import PrivacyEngine  # noqa: F401  (imported before the forks, not in each)

    # The noise sampler's numba kernels load from numba's cache at first use (~2 s): once
    # here, as in a worker that has run a job before, not in each forked run.
    rounded_gaussian(np.random.default_rng(0), scale=1e3, size=1000)

    if args.generated is None:
        digits = test = load_digits_set()
    else:
        digits, test = generated_sets(args.rows, args.test_rows, args.generated)
    labels, data, public = digits.labels, digits.data, digits.public
    x = torch.from_numpy(digits.x)
    y = torch.from_numpy(labels.astype(np.float32))
    x_test = torch.from_numpy(test.x)
    load_before = os.getloadavg()
    if args.schedules is not None:
        _compare_schedules(args, digits, test, load_before)
        return
    lines = [
        "| ε | batch | epochs | steps | σ | product s/epoch | Opacus s/epoch | product / Opacus | "
        "product peak MB | Opacus peak MB | product / Opacus | "
        "product accuracy | Opacus accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    spec_used: CnnSpec | None = None
    plan_m: dict[str, Any] = {}
    settings = Settings()
    limits = ResourceLimits(settings.job_time_limit_s, settings.worker_memory_bytes)
    schema = ImageSchema.model_validate(public)
    estimates = []
    for eps in args.epsilons:
        request = _request(public["name"], eps, args.epochs)
        plan = plan_for_dataset(request, n_rows=len(labels), public_schema=public)
        assert plan.guarantee == "proven"
        MECHANISMS[mechanism_key(plan)].resolve()  # its imports before the forks, not in each
        estimate = plan_resources(plan, schema=schema)
        refusal = resource_refusal(plan, schema=schema, limits=limits)
        estimates.append(
            f"ε = {eps:g}: {estimate.seconds:.0f} s, {(estimate.memory_bytes or 0) / 1e6:.0f} MB; "
            + ("admitted" if refusal is None else f"the API refuses it: “{refusal}”")
        )
        spec = CnnSpec.model_validate(plan.model)
        spec_used, m = spec, plan.mechanism
        plan_m = dict(m)
        ours_t, theirs_t, ours_a, theirs_a, ratios = [], [], [], [], []
        ours_mb, theirs_mb, mem_ratios = [], [], []
        for _ in range(args.rounds):  # interleaved: product, then Opacus, each round
            (seconds, state), peak = _forked(_product, plan, request.model, data)
            module = build_module(spec, x.shape[1])
            module.load_state_dict(state)
            ours_t.append(seconds / m["epochs"])
            ours_mb.append(peak / 1e6)
            ours_a.append(_accuracy(module, x_test, test.labels))
            (seconds_o, state_o), peak_o = _forked(_opacus, spec, m, x, y)
            module.load_state_dict(state_o)
            theirs_t.append(seconds_o / m["epochs"])
            theirs_mb.append(peak_o / 1e6)
            theirs_a.append(_accuracy(module, x_test, test.labels))
            ratios.append(ours_t[-1] / theirs_t[-1])
            mem_ratios.append(ours_mb[-1] / theirs_mb[-1])
            print(
                f"ε = {eps:g}: product {ours_t[-1]:.3f} s/epoch {ours_mb[-1]:.1f} MB "
                f"acc {ours_a[-1]:.3f}; Opacus {theirs_t[-1]:.3f} s/epoch {theirs_mb[-1]:.1f} MB "
                f"acc {theirs_a[-1]:.3f}",
                flush=True,
            )
        lines.append(
            f"| {eps:g} | {m['batch_size']} | {m['epochs']} | {m['steps']} | "
            f"{m['noise_multiplier']:.3f} | {statistics.median(ours_t):.3f} | "
            f"{statistics.median(theirs_t):.3f} | {statistics.median(ratios):.2f}× | "
            f"{statistics.median(ours_mb):.1f} | {statistics.median(theirs_mb):.1f} | "
            f"{statistics.median(mem_ratios):.2f}× | "
            f"{', '.join(f'{a:.3f}' for a in ours_a)} | {', '.join(f'{a:.3f}' for a in theirs_a)} |"
        )
    assert spec_used is not None
    # At the plan's lr (clipped and noisy steps are small) plain SGD can fail to learn
    # (28×28: chance), so also at a tenth of it.
    lrs = [plan_m["learning_rate"], plan_m["learning_rate"] / 10]
    clear = [_non_private(spec_used, plan_m, x, y, test, lr) for lr in lrs]
    load_after = os.getloadavg()
    params = plan_m["parameters"]
    if args.generated is None:
        heading = None
        title = "# DP-SGD on a CNN, digits: the exact convolution engine against stock Opacus"
        where = f"Accuracy on the {len(labels):,} training images"
        epochs = "default batch and epochs"
    else:
        gh, gw, gc = args.generated
        heading = title = f"## Generated {gh}×{gw}×{gc} images: the same comparison"
        where = (
            f"Data: {generated_description(args.rows, args.test_rows, args.generated)} "
            f"Accuracy on the {args.test_rows:,} held-out images"
        )
        epochs = "default batch" + ("" if args.epochs is None else f", epochs {args.epochs}")
    text = "\n".join(
        [
            title,
            "",
            "Command: `.venv/bin/python benchmarks/cnn_digits.py " + " ".join(sys.argv[1:]) + "`",
            f"Machine: {os.cpu_count()} cores, shared; load average {load_before[0]:.1f} before, "
            f"{load_after[0]:.1f} after; torch {torch.__version__}, one thread for both.",
            "",
            f"CNN: {_convs(spec_used)} ({params} parameters). The API's plan "
            f"({epochs} for a CNN, clip C = 1, lr = 1, δ = 1e-5); Opacus runs the same "
            "expected batch, Poisson rate, σ, C, lr and number of steps. "
            f"{where}, one per round (rounds: {args.rounds}, interleaved); time per epoch is "
            "the run's wall time over its epochs, median over rounds. Peak MB: each DP-SGD "
            "run in a forked child, its peak resident memory (VmHWM) less its file-backed "
            "pages and its anonymous memory at the start after malloc_trim(0) "
            "(/proc/self/status), median over rounds.",
            "",
            *lines,
            "",
            "The plan's quote-time estimate (service.resources.plan_resources, for the whole "
            f"job) under the default limits ({limits.seconds:g} s, "
            f"{limits.memory_bytes / 2**30:g} GiB): " + "; ".join(estimates) + ".",
            "",
            "Non-private, the same CNN, plain SGD (same batch and epochs): accuracy "
            + ", ".join(f"{a:.3f} at lr {lr:g}" for a, lr in zip(clear, lrs, strict=True))
            + ".",
            "",
            "The product's engine is the proven one (float64 fixed-point grids, per-row "
            "gradients materialised exactly, integer sums); Opacus computes float32 per-sample "
            "gradients with no batch-independence guarantee (issue 25).",
            "",
        ]
    )
    print(text)
    if not args.no_write:
        _write(heading, text)


if __name__ == "__main__":
    main()
