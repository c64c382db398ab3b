"""The regularised exponential mechanism for logistic regression, sampled by unadjusted
Langevin steps whose privacy is proven for the run that executes (method ``expm``,
sampler ``"langevin"``; the plan is service/methods/expm.py:_expm_langevin_plan).

Target (Gopi, Lee & Liu 2022): π(θ) ∝ exp(−k·(Σᵢ ℓᵢ(θ) + μ‖θ‖²/2)), ℓᵢ the logistic loss
of row i. The unadjusted Langevin algorithm (ULA) from θ₀ = 0 runs, for t = 1 … T,

    θ ← θ − (lr/n̂)·(G(θ) + N + μ·θ),

where G(θ) = Σᵢ (σ(θ·xᵢ) − yᵢ)·(xᵢ, 1) is the gradient sum of the logistic losses and N
Gaussian noise; with η·k = lr/n̂ and the noise's std σ·√B on G this is ULA at inverse
temperature k = 2n̂/(lr·σ²·B) (the plan reports it).

Why the release is (ε, δ)-DP for the T steps that ran — not only in the limit, and
whether or not the chain mixed:

1. **Exact integer sum** (:func:`gradient_sum`): features are truncated once onto the grid
   2^-c (x_int ∈ [0, 2^c], bias 2^c) and every row's residual r = σ̃(θ̃·x) − y ∈ [−1, 1]
   onto 2^-a each step (|r_int| ≤ 2^a). Row i contributes the integer vector r_int·x_int,
   of ℓ2 norm ≤ 2^(a+c)·√B, where ‖(x, 1)‖² ≤ B is the public schema's bound; the worker
   checks ‖x_int‖² ≤ B·2^(2c) exactly in integers before any step. The sum over rows is
   exact (float64 partial sums of integers below 2^53, then int64). Adding or removing one
   row changes the sum by exactly that row's vector — *provided every other row's vector
   is the same in both sums*, i.e. a row's r_int depends on that row and the public state
   alone, bit for bit, whatever else is in the batch. (Issue 25: with float logits θ·x from
   a matrix product, BLAS picked kernels by batch size, and adding one row moved another
   row's r_int by one unit in 31 of 40 crafted trials, by up to (1 + 9.1e-6)·Δ in all.)
   That is made true by construction, assuming only IEEE-754 correct rounding:

   * θ̃ = θ on the grid 2^-b (round, clamp to ±2^m, both exact: fixed_point.py),
     so the logit's numerator x_int·θ_int is a sum of P integer products, each
     ≤ 2^c·2^m, with P·2^(c+m) ≤ 2^52: every float64 partial sum is an integer below
     2^53, exact in any order, and z = (x_int·θ_int)·2^-(c+b) is exact (a power of two);
   * σ̃(z) (:func:`~worker.mechanisms.fixed_point.sigmoid_basic`) is computed elementwise
     from IEEE basic operations only (+, −, ×, ÷ on float64, each correctly rounded, so
     the same bits in any lane, position or batch size; eager torch runs each operation
     as its own kernel, so no FMA contraction joins two of them): exp(−|z|) by a Horner
     polynomial and squarings, then 1/(1 + e) or e/(1 + e). It is not the correctly
     rounded logistic function (no IEEE operation is); the proof needs only that it is a
     fixed function of z with values in [0, 1], which division of e ≥ 0 by 1 + e ≥ e
     guarantees (correctly rounded quotients of 0 ≤ x ≤ y lie in [0, 1]). Its error
     against σ (below 1.4e-15 absolute) changes the target the chain approximates by far
     less than the residual grid 2^-a does;
   * r_int = trunc((σ̃ − y)·2^a): a correctly rounded subtraction of values in [0, 1] and
     an exact scaling and truncation.

   So ℓ2 sensitivity Δ = 2^(a+c)·√B, from IEEE-754 correct rounding alone.
2. **Integer noise** round(σ·Δ·Z) per coordinate (:func:`worker.noise.rounded_gaussian`)
   added exactly: S + round(sZ) = round(S + sZ), a post-processing of the Gaussian
   mechanism with noise multiplier σ, with no floating-point channel (Mironov 2012); the
   sampler's pmf gap is charged in the plan (PmfSlackEvent).
3. Step t's input is θ_{t−1}, a function of earlier noisy sums only, so the T steps are an
   adaptive composition of T Gaussian mechanisms: the full-batch (q = 1) case of the
   subsampled Gaussian event the plan charges. The release θ_T is a post-processing.

The random number of rows changes nothing above: the mechanism never divides by the
loaded row count, only by the public n̂.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from service.modelspec import ModelSpec
from worker.mechanisms.base import MechanismOutput, PlanMismatch, ProgressFn, TabularTrainingSet
from worker.mechanisms.dpsgd import NoiseStream
from worker.mechanisms.fixed_point import quantised_theta, sigmoid_basic, theta_bits
from worker.mechanisms.guards import nonnegative_finite, positive_finite
from worker.models import build_module
from worker.noise import secure_rng

# Rows per float64 partial sum: ≤ 2^20 rows of entries ≤ 2^32 stay below 2^53 (exact).
_CHUNK_ROWS = 1 << 20


@dataclass(frozen=True)
class LangevinParams:
    """The plan's public values that the run may depend on (and nothing else)."""

    steps: int
    learning_rate: float
    l2: float
    public_n_rows: int
    parameters: int
    row_norm_sq_bound: int
    residual_bits: int
    feature_bits: int
    noise_multiplier: float

    def __post_init__(self) -> None:
        positive_finite(
            "expm langevin",
            steps=self.steps,
            learning_rate=self.learning_rate,
            public_n_rows=self.public_n_rows,
            parameters=self.parameters,
            row_norm_sq_bound=self.row_norm_sq_bound,
            noise_multiplier=self.noise_multiplier,
        )
        nonnegative_finite(
            "expm langevin",
            l2=self.l2,
            residual_bits=self.residual_bits,
            feature_bits=self.feature_bits,
        )

    @classmethod
    def from_plan(cls, mechanism: dict[str, Any]) -> LangevinParams:
        if mechanism.get("sampler") != "langevin":
            raise PlanMismatch(f"unknown ExpM sampler {mechanism.get('sampler')!r}")
        params = cls(
            steps=int(mechanism["steps"]),
            learning_rate=float(mechanism["learning_rate"]),
            l2=float(mechanism["l2"]),
            public_n_rows=int(mechanism["public_n_rows"]),
            parameters=int(mechanism["parameters"]),
            row_norm_sq_bound=int(mechanism["row_norm_sq_bound"]),
            residual_bits=int(mechanism["residual_bits"]),
            feature_bits=int(mechanism["feature_bits"]),
            noise_multiplier=float(mechanism["noise_multiplier"]),
        )
        if params.residual_bits + params.feature_bits > 32:
            raise PlanMismatch("the Langevin grid is wider than its exact-sum bound")
        return params

    @property
    def sensitivity(self) -> float:
        """Δ: the ℓ2 bound of one row's integer gradient, in grid units."""
        return 2.0 ** (self.residual_bits + self.feature_bits) * math.sqrt(self.row_norm_sq_bound)


def quantised_features(x: torch.Tensor, *, feature_bits: int, norm_sq_bound: int) -> torch.Tensor:
    """(n, d + 1) float64 holding the integers trunc(x·2^c) and the bias column 2^c (a
    view of one column-major array, the layout :class:`ExactRowSums` reads).

    Raises :class:`PlanMismatch` unless every entry of x lies in [0, 1] and every row's
    ‖x_int‖² ≤ B·2^(2c), both checked exactly: x·2^c and its truncation are exact (a
    power-of-two scaling of a float32 widened to float64, then an integer part), each
    square is an integer ≤ 2^(2c) ≤ 2^32 and a row's sum of P ≤ 2^20 of them an integer
    below 2^53, exact in float64 in any order; the bound B·2^(2c) is an exact float below
    2^53, and from 2^53 on (rounded or not) it exceeds every such sum, as it should.
    """
    scale = 2.0**feature_bits
    n, d = int(x.shape[0]), int(x.shape[1])
    if not 0 <= feature_bits <= 16 or d + 1 > 1 << 20:
        raise PlanMismatch("the Langevin feature grid is outside its exact-sum bounds")
    # aminmax propagates NaN and NaN fails both comparisons, so a NaN is refused here; the
    # norm test below is written to refuse it as well (NaN ≤ bound is false).
    if n:
        low, high = torch.aminmax(x)
        if not (float(low) >= 0.0 and float(high) <= 1.0):
            raise PlanMismatch("encoded features outside [0, 1]")
    columns = torch.empty((d + 1, n), dtype=torch.float64, device=x.device)
    # In x's own float32: x·2^c (≤ 2^c ≤ 2^16, a power-of-two scaling) and its truncation
    # are exact there too, and widening to float64 is exact; + 0.0 turns a −0.0 input's
    # −0.0 into +0.0, as the integer conversion did before.
    narrow = x.T.contiguous()
    if narrow.dtype not in (torch.float32, torch.float64):  # 2^16 overflows a float16
        narrow = narrow.float()
    columns[:d] = torch.trunc(narrow * scale) + 0.0
    columns[d] = scale
    norm_sq = (columns * columns).sum(dim=0)
    if n and not bool((norm_sq <= float(norm_sq_bound << (2 * feature_bits))).all()):
        raise PlanMismatch("an encoded row exceeds the schema's norm bound")
    return columns.T


def _residuals(
    numerators: torch.Tensor,
    y64: torch.Tensor,
    *,
    feature_bits: int,
    residual_bits: int,
    theta_bits: int,
) -> torch.Tensor:
    """r_int = trunc(2^a·(σ̃(numerator·2^-(c+b)) − y)) elementwise: the one definition of a
    row's residual from its exact logit numerator (the same IEEE operations on every path:
    on the CPU numpy's ufuncs, each one correctly rounded or exact operation per element, in
    place on σ̃'s fresh result; elsewhere torch's)."""
    if numerators.device.type == "cpu" and y64.dtype == torch.float64:
        logits = numerators.detach().double().numpy() * 2.0 ** -(feature_bits + theta_bits)
        out = sigmoid_basic(torch.from_numpy(logits)).numpy()
        np.subtract(out, y64.detach().numpy(), out=out)
        np.multiply(out, 2.0**residual_bits, out=out)  # exact: a power of two
        np.trunc(out, out=out)
        return torch.from_numpy(out)
    residual = sigmoid_basic(numerators * 2.0 ** -(feature_bits + theta_bits)) - y64
    return torch.trunc(residual * 2.0**residual_bits)


def row_residuals(
    x_int: torch.Tensor,
    y: torch.Tensor,
    theta_int: torch.Tensor,
    *,
    feature_bits: int,
    residual_bits: int,
    theta_bits: int,
) -> torch.Tensor:
    """r_int,i = trunc(2^a·(σ̃(θ̃·xᵢ) − yᵢ)) per row, float64 integers in [−2^a, 2^a]: a
    function of row i and θ̃ alone, bit for bit (module docstring)."""
    numerators = x_int @ theta_int  # integers below 2^53: exact in any order
    return _residuals(
        numerators,
        y.double(),
        feature_bits=feature_bits,
        residual_bits=residual_bits,
        theta_bits=theta_bits,
    )


def _csr(dense: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return dense.to_sparse_csr()


class ExactRowSums:
    """The features of one release prepared once for the two exact products of every step:
    numerators x_int·θ_int per row, and Σᵢ r_int,i·x_int,i (:meth:`gradient_sum`).

    Only the storage and the split of the rows differ from :func:`row_residuals` and
    :func:`gradient_sum`'s plain products, never the arithmetic: both products are sums of
    integer products whose partial sums are integers below 2^53 (module docstring), so
    every order of summation, with or without FMA, any split of the rows into parts, and
    skipping the zero products, gives the same exact values; a row's residual is then
    :func:`_residuals` of that value (σ̃ reads a numerator 0 the same whatever its sign),
    and the parts' float64 sums are integers below 2^53 added exactly in int64.

    The storage: one column-major copy per part (both products then run as
    column-combination GEMVs), whatever the data: a compressed-sparse-rows copy
    (``sparse=True``) is only for callers whose density is public, because a sparse
    product's time grows with the number of nonzero entries, a count of the private rows
    (Adult's numeric zeros) that a job's duration would show. Labels are converted to
    float64 once, not every step.

    The parts: ``parts`` row ranges of equal size (each at most 2^20 rows, the exact-sum
    bound), a split that depends on the row count and the public setting only. With a
    ``pool``, :meth:`gradient_sum` computes the parts on its threads at once, each with
    single-threaded kernels (the caller holds torch at one intra-op thread:
    :func:`single_threaded_kernels`): one join per step instead of an OpenMP parallel
    region per kernel, which on a 2-core machine shared with other processes made two
    threads 6-20× slower than one (benchmarks/results/expm_proven_speed.md)."""

    def __init__(
        self,
        x_int: torch.Tensor,
        y: torch.Tensor,
        *,
        feature_bits: int,
        residual_bits: int,
        theta_bits: int,
        sparse: bool = False,
        parts: int = 1,
    ) -> None:
        self.parameters = int(x_int.shape[1])
        self.device = x_int.device
        self._kw = {
            "feature_bits": feature_bits,
            "residual_bits": residual_bits,
            "theta_bits": theta_bits,
        }
        self.sparse = sparse and x_int.device.type == "cpu"
        y64 = y.double()
        n = int(x_int.shape[0])
        count = max(1, parts, -(-n // _CHUNK_ROWS))
        edges = [n * i // count for i in range(count + 1)]
        # Per part (≤ 2^20 rows, the exact-sum bound): (forward, backward, labels).
        self._chunks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for start, end in itertools.pairwise(edges):
            if end == start:
                continue
            xs = x_int[start:end]
            columns = xs.T.contiguous()  # (d + 1, rows)
            if self.sparse:
                forward, backward = _csr(xs.contiguous()), _csr(columns)
            else:
                forward, backward = columns.T, columns
            self._chunks.append((forward, backward, y64[start:end]))

    def residuals(self, theta_int: torch.Tensor) -> torch.Tensor:
        """r_int of every row (float64), as :func:`row_residuals` gives them."""
        parts = [_residuals(forward @ theta_int, ys, **self._kw) for forward, _, ys in self._chunks]
        if not parts:
            return torch.zeros(0, dtype=torch.float64, device=self.device)
        return torch.cat(parts)

    def _part_sum(
        self, chunk: tuple[torch.Tensor, torch.Tensor, torch.Tensor], theta_int: torch.Tensor
    ) -> torch.Tensor:
        forward, backward, ys = chunk
        r_int = _residuals(forward @ theta_int, ys, **self._kw)
        # Integers below 2^53 throughout: exact in any order.
        return (backward @ r_int).round().to(torch.int64)

    def gradient_sum(
        self, theta_int: torch.Tensor, *, pool: ThreadPoolExecutor | None = None
    ) -> torch.Tensor:
        """Σᵢ r_int,i·x_int,i exactly, as int64 (shape (d + 1,)); the parts on ``pool``'s
        threads where given (the same int64 values: each part's sum is exact)."""
        total = torch.zeros(self.parameters, dtype=torch.int64, device=self.device)
        if pool is not None and len(self._chunks) > 1:
            sums = list(pool.map(lambda chunk: self._part_sum(chunk, theta_int), self._chunks))
        else:
            sums = [self._part_sum(chunk, theta_int) for chunk in self._chunks]
        for part in sums:
            total += part
        return total


@contextmanager
def single_threaded_kernels() -> Iterator[None]:
    """torch at one intra-op thread for the block, then its setting back (the process
    runs one job at a time; :class:`ExactRowSums` spreads its parts over Python threads
    instead)."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def gradient_sum(
    x_int: torch.Tensor,
    y: torch.Tensor,
    theta_int: torch.Tensor,
    *,
    feature_bits: int,
    residual_bits: int,
    theta_bits: int,
) -> torch.Tensor:
    """Σᵢ r_int,i·x_int,i exactly, as int64 (shape (d + 1,)), r_int from
    :func:`row_residuals` at the quantised θ̃ = θ_int·2^-b. (One call; a run prepares
    :class:`ExactRowSums` once and calls its method every step.)"""
    sums = ExactRowSums(
        x_int, y, feature_bits=feature_bits, residual_bits=residual_bits, theta_bits=theta_bits
    )
    return sums.gradient_sum(theta_int)


def sample_langevin(
    *,
    params: LangevinParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int = 0,
    total: int | None = None,
) -> torch.Tensor:
    """One release: θ_T (d + 1,) float64 on the CPU, weights then bias."""
    total = params.steps if total is None else total
    x_int = quantised_features(
        data.x.to(device), feature_bits=params.feature_bits, norm_sq_bound=params.row_norm_sq_bound
    )
    if x_int.shape[1] != params.parameters:
        raise PlanMismatch("the model's parameter count differs from the plan's")
    y = data.y.to(device)
    # |σ(·) − y| ≤ 1, the residual bound of the sensitivity, needs labels in [0, 1].
    if y.shape[0] and not bool(((y >= 0) & (y <= 1)).all()):
        raise PlanMismatch("labels outside [0, 1]")
    noise = NoiseStream(rng=secure_rng(), size=params.parameters, steps=params.steps)
    scale = params.noise_multiplier * params.sensitivity
    unit = 2.0 ** -(params.residual_bits + params.feature_bits)
    step_size = params.learning_rate / params.public_n_rows
    b, m = theta_bits(feature_bits=params.feature_bits, parameters=params.parameters)
    # As many parts as the worker's threads (ENCLAVE_WORKER_THREADS), a public setting.
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    sums = ExactRowSums(
        x_int,
        y,
        feature_bits=params.feature_bits,
        residual_bits=params.residual_bits,
        theta_bits=b,
        parts=threads,
    )
    del x_int  # the prepared copy is all the steps read
    theta = torch.zeros(params.parameters, dtype=torch.float64, device=device)
    with ExitStack() as stack:
        pool = None
        if threads > 1:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=threads))
            stack.enter_context(single_threaded_kernels())
        for step in range(1, params.steps + 1):
            summed = sums.gradient_sum(quantised_theta(theta, bits=b, limit_bits=m), pool=pool)
            step_noise = noise.draw(scale=scale, same_scale_ahead=params.steps - step + 1)
            noisy = (summed + torch.as_tensor(step_noise, device=device)).double() * unit
            theta = theta - step_size * (noisy + params.l2 * theta)
            progress(done + step, total)
    return theta.cpu()


def run_expm_langevin(
    *,
    spec: ModelSpec,
    mechanism: dict[str, Any],
    samples: int,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
) -> MechanismOutput:
    """`samples` independent chains (each charged by the plan), as logistic state dicts."""
    params = LangevinParams.from_plan(mechanism)
    module = build_module(spec, int(data.x.shape[1]))
    names = [k for k, _ in module.named_parameters()]
    if names != ["linear.weight", "linear.bias"]:
        raise PlanMismatch("the Langevin sampler is for logistic regression only")
    releases = []
    for i in range(samples):
        theta = sample_langevin(
            params=params,
            data=data,
            device=device,
            progress=progress,
            done=i * params.steps,
            total=samples * params.steps,
        )
        releases.append(
            {
                "linear.weight": theta[:-1].reshape(1, -1).float().clone(),
                "linear.bias": theta[-1:].float().clone(),
            }
        )
    return MechanismOutput(releases=releases)
