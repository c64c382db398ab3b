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

**K ≥ 3 classes** (multinomial logistic regression; the plan's ``classes``): θ is the
(d + 1) × K matrix of the K weight rows and biases, ℓᵢ the cross-entropy of the softmax,
whose gradient is (p − e_y) ⊗ (xᵢ, 1). Everything above holds column by column, with
these changes:

* the logit numerators x_int·θ_int are K dot products of the same P = d + 1 integer terms
  (θ's grid from :func:`~worker.mechanisms.fixed_point.theta_bits` of d + 1, not of the
  K·(d + 1) parameters), each exact as above;
* p̃ = :func:`~worker.mechanisms.exact_softmax.softmax_basic` of the exact logits (the row
  maximum, one subtraction, exp from basic operations, a sum in the fixed class order, one
  quotient per entry: the same bits for a row in any batch), p̃_k ∈ [0, 1];
* r_int,k = trunc((p̃_k − [k = y])·2^a): a subtraction (exact for k ≠ y; correctly rounded
  into [−1, 0] for k = y), an exact scaling and a truncation toward zero, so
  |r_int,k|·2^-a ≤ |p̃_k − [k = y]|;
* **the residual bound ‖r_int‖² ≤ 2·2^(2a), from correct rounding alone.** For exact
  probabilities ‖p − e_y‖² = Σ_k p_k² − 2p_y + 1 ≤ 2 − 2p_y ≤ 2 (p_k² ≤ p_k, Σ p_k = 1);
  the floats p̃ need not sum to 1, so the argument is made on the grid. Write
  q_k = |r_int,k|·2^-a ∈ [0, 1] (a multiple of 2^-a). Then q_k² ≤ q_k, so
  ‖q‖² ≤ q_y + Σ_{k≠y} q_k ≤ 1 + Σ_{k≠y} q_k, and q_k ≤ p̃_k for k ≠ y. With u = 2^-53,
  s̃ = fl(((e_0 + e_1) + …) + e_{K−1}) ≥ (Σ e_k)·(1 − u)^(K−1) (K − 1 correctly rounded
  additions of non-negative terms) and p̃_k = fl(e_k/s̃) ≤ (e_k/s̃)·(1 + u), so
  Σ_k p̃_k ≤ (1 + u)/(1 − u)^(K−1) < 1 + 2^-40 for K ≤ 2^12
  (:data:`~worker.mechanisms.exact_softmax.MAX_CLASSES`), below 1 + 2^-a (a ≤ 16).
  Σ_{k≠y} q_k is a multiple of 2^-a that is ≤ Σ_k p̃_k < 1 + 2^-a, hence ≤ 1, and
  ‖q‖² ≤ 2. The worker also checks Σ_k r_int,k² ≤ 2^(2a+1) on every row of every step,
  exactly (integers ≤ 2^32, K ≤ 2^12 of them: sums below 2^53), and fails closed
  (:class:`~worker.mechanisms.guards.GuardFailed`) if a row ever exceeded it, which the
  argument above says it cannot: the failure reveals nothing about a row;
* row i's integer vector r_int ⊗ x_int has ℓ2 norm ‖r_int‖·‖x_int‖ ≤ 2^(a+c)·√(2B) = Δ
  (the plan's ``residual_norm_sq_bound`` 2, which the worker refuses to read as anything
  else), and its entries are ≤ 2^(a+c) ≤ 2^32 as before, so the column sums over ≤ 2^20
  rows are exact;
* labels must be class indices 0 … K − 1 (checked before any step, like the binary
  labels' [0, 1]); the noise is K·(d + 1) independent integer Gaussians per step.

So each step is the Gaussian mechanism of sensitivity Δ with noise multiplier σ, and items
2 and 3 hold unchanged.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from service.modelspec import ModelSpec
from worker.ieee_jit import ieee_njit
from worker.mechanisms.base import MechanismOutput, PlanMismatch, ProgressFn, TabularTrainingSet
from worker.mechanisms.dpsgd import NoiseStream
from worker.mechanisms.exact_softmax import MAX_CLASSES, softmax_basic
from worker.mechanisms.fixed_point import (
    quantised_theta,
    sigmoid_basic,
    sigmoid_element,
    theta_bits,
)
from worker.mechanisms.guards import GuardFailed, nonnegative_finite, positive_finite
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
    classes: int = 1
    """1 for a binary target (one sigmoid output), else K ≥ 3 (softmax)."""

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
        if "accounting" in mechanism:  # charged otherwise: langevin_hidden.py's chain
            raise PlanMismatch("not a composition-charged Langevin plan")
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
            classes=int(mechanism.get("classes", 1)),
        )
        if params.residual_bits + params.feature_bits > 32:
            raise PlanMismatch("the Langevin grid is wider than its exact-sum bound")
        if params.classes != 1 and not 3 <= params.classes <= MAX_CLASSES:
            raise PlanMismatch(f"the Langevin sampler takes 3 to {MAX_CLASSES} classes")
        if (params.classes != 1 and params.residual_bits > 16) or (
            params.parameters % params.classes
        ):
            raise PlanMismatch("the Langevin plan's grid or parameter count does not fit")
        # The worker's own residual bound (module docstring), never a smaller one.
        if int(mechanism.get("residual_norm_sq_bound", 1)) != params.residual_norm_sq_bound:
            raise PlanMismatch("the plan's residual bound is not the sampler's")
        return params

    @property
    def residual_norm_sq_bound(self) -> int:
        """‖r‖² ≤ this (in units of 2^(2a)): |σ − y|² ≤ 1, or ‖p − e_y‖² ≤ 2 for K classes."""
        return 1 if self.classes == 1 else 2

    @property
    def inputs(self) -> int:
        """d + 1: the features and the bias, per class."""
        return self.parameters // self.classes

    @property
    def sensitivity(self) -> float:
        """Δ: the ℓ2 bound of one row's integer gradient, in grid units (√(2B) for K
        classes: module docstring)."""
        norm_sq = self.residual_norm_sq_bound * self.row_norm_sq_bound
        return 2.0 ** (self.residual_bits + self.feature_bits) * math.sqrt(norm_sq)


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


def _softmax_residuals(
    numerators: torch.Tensor,
    y64: torch.Tensor,
    *,
    feature_bits: int,
    residual_bits: int,
    theta_bits: int,
) -> torch.Tensor:
    """K classes: r_int,k = trunc(2^a·(p̃_k − [k = y])) (rows, K) from the exact logit
    numerators (rows, K), p̃ = exact_softmax.softmax_basic (the module docstring, "K
    classes"); then the exact check Σ_k r_int,k² ≤ 2^(2a+1) of every row, failing closed
    (:class:`GuardFailed`). ``y64`` holds class indices in [0, K) (checked by the caller)."""
    logits = numerators * 2.0 ** -(feature_bits + theta_bits)  # exact: a power of two
    p = softmax_basic(logits)
    target = torch.zeros_like(p).scatter_(1, y64.to(torch.int64).unsqueeze(1), 1.0)
    r_int = torch.trunc((p - target) * 2.0**residual_bits)
    # Integers ≤ 2^(2a) ≤ 2^32, at most 2^12 per row: the sums are exact below 2^53.
    if bool(((r_int * r_int).sum(dim=1) > 2.0 ** (2 * residual_bits + 1)).any()):
        raise GuardFailed("expm langevin: a row's softmax residual exceeds its bound")
    return r_int


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
    function of row i and θ̃ alone, bit for bit (module docstring). With θ_int a (d + 1, K)
    matrix (K classes) the (rows, K) softmax residuals instead, y the class indices."""
    numerators = x_int @ theta_int  # integers below 2^53: exact in any order
    residuals = _residuals if theta_int.dim() == 1 else _softmax_residuals
    return residuals(
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
    threads 6-20× slower than one (benchmarks/results/expm_proven_speed.md).

    ``one_hot`` (CPU only): the public schema's one-hot blocks of features (start, length),
    each row holding 2^c in at most one column of a block and 0 elsewhere (one-hot over the
    declared levels; all zeros for a level outside them), checked exactly here (a row that
    breaks it is refused, :class:`PlanMismatch`). Each block then has length + 1 states per
    row (a level, or none), and the blocks are grouped (:func:`_block_groups`, from the
    public lengths alone) so that a group's joint states number at most
    :data:`_TABLE_CELLS`; a row's group columns are stored as one cell index per group
    instead of dense columns. A numerator's group term is table[cell], the table holding
    for every joint state 2^c·(the sum of its blocks' θ entries, 0 for none), built each
    step by a gather and a sum over ≤ :data:`_TABLE_CELLS` states; a block's gradient
    entries are 2^c·Σ_{rows at level l} r: a bincount of the integer residuals by cell
    (partial sums below 2^53: ≤ 2^20 rows of |r| ≤ 2^32 in all), each cell's sum then
    added to its blocks' columns (the table's transpose), then an exact power-of-two
    scaling. The same exact integers as the dense products, in another order, so the same
    bits; the work is n gathers and n additions per group, plus the tables', whatever the
    rows hold (the groups and n are what the dense path's work depends on too). On Adult (8
    categorical columns, 3 groups) a step's gradient sum took 0.65× the CPU time of one
    gather and bincount per block, 2.0 against 3.1 ms (benchmarks/results/expm_hidden.md,
    "Speed"). A binary target's step with blocks runs as one compiled call
    (:meth:`_binary_part_sum`, :func:`_binary_cells_kernel`: the tables, numerators,
    residuals, cell sums and their transpose, the same operations per row, so the same
    bits; the numpy methods stay the K-class path and the reference the tests compare it
    with): 0.63 against 1.11 ms per step on Adult (1 thread)."""

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
        classes: int = 1,
        one_hot: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.parameters = int(x_int.shape[1])
        self._blocks = (
            tuple((int(a), int(b)) for a, b in one_hot) if x_int.device.type == "cpu" else ()
        )
        self._groups = _block_groups(self._blocks)
        # Per group, (blocks, cells): the θ column of each block at each joint state (P for
        # none), made once: every step's tables and their transposes read them.
        self._table_columns = [self._group_columns(members) for members in self._groups]
        self._group_shapes = [
            tuple(self._blocks[b][1] + 1 for b in members) for members in self._groups
        ]
        self._group_sizes = [math.prod(shape) for shape in self._group_shapes]
        self._cells = max(self._group_sizes, default=0)  # ≤ _TABLE_CELLS but a wide block's
        # The same, as one (groups, blocks, cells) array for the compiled binary step, P
        # (θ_ext's 0, the discarded column) where a group has fewer blocks or cells.
        self._packed_columns = np.full(
            (len(self._groups), max(map(len, self._groups), default=0), self._cells),
            self.parameters,
            dtype=np.intp,
        )
        for g, table_columns in enumerate(self._table_columns):
            members, size = table_columns.shape
            self._packed_columns[g, :members, :size] = table_columns
        # One index tensor, made once: the steps' products read it every time.
        self._dense_columns = torch.tensor(_dense_columns(self.parameters, self._blocks))
        self._unit = 2.0**feature_bits
        self.classes = classes
        self._residuals = _residuals if classes == 1 else _softmax_residuals
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
        # Per part (≤ 2^20 rows, the exact-sum bound): (forward, backward, labels), and with
        # one-hot blocks each part's cell indices (forward/backward then hold the rest).
        self._chunks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._structured: list[np.ndarray] = []
        for start, end in itertools.pairwise(edges):
            if end == start:
                continue
            xs = x_int[start:end]
            if self._blocks:
                self._structured.append(self._prepare_blocks(xs))
                xs = xs[:, self._dense_columns]
            columns = xs.T.contiguous()  # (d + 1, rows)
            if self.sparse:
                forward, backward = _csr(xs.contiguous()), _csr(columns)
            else:
                forward, backward = columns.T, columns
            self._chunks.append((forward, backward, y64[start:end]))

    def _group_columns(self, members: tuple[int, ...]) -> np.ndarray:
        """(len(members), cells): for each joint state of the group (row-major over its
        blocks' states, as :meth:`_prepare_blocks` numbers them), each block's θ column:
        start + level, or P (θ_ext's extra 0) for none."""
        shape = [self._blocks[b][1] + 1 for b in members]
        states = np.indices(shape).reshape(len(members), -1)
        out = np.empty_like(states, dtype=np.intp)
        for i, b in enumerate(members):
            start, length = self._blocks[b]
            out[i] = np.where(states[i] < length, start + states[i], self.parameters)
        return out

    def _prepare_blocks(self, xs: torch.Tensor) -> np.ndarray:
        """(groups, rows): each row's cell per group of one-hot blocks, the row-major index
        of its blocks' states (a block's level, or its length for an all-zero block), after
        checking exactly that every block is one-hot (values 0 or 2^c, at most one 2^c per
        row)."""
        x = xs.numpy()
        states = []
        for start, length in self._blocks:
            block = x[:, start : start + length]
            ones = block == self._unit
            if not bool(np.all(ones | (block == 0.0))) or bool(np.any(ones.sum(axis=1) > 1)):
                raise PlanMismatch("a one-hot block of the schema is not one-hot in the rows")
            states.append(np.where(ones.any(axis=1), ones.argmax(axis=1), length))
        cells = np.zeros((len(self._groups), x.shape[0]), dtype=np.intp)
        for g, members in enumerate(self._groups):
            for b in members:
                cells[g] *= self._blocks[b][1] + 1
                cells[g] += states[b]
        return cells

    def _numerators(self, part: int, theta_int: torch.Tensor) -> torch.Tensor:
        """x_int·θ_int for one part's rows: the dense product, plus each group's table
        entry at the row's cell, the table holding 2^c·Σ over the group's blocks of θ at
        the cell's state (θ_ext[P] = 0 for none). Exact integers, the dense product's
        value: an entry sums at most P integers |θ_j|·2^c ≤ 2^(c+m) (P·2^(c+m) ≤ 2^52,
        module docstring), in any order."""
        forward = self._chunks[part][0]
        if not self._blocks:
            return forward @ theta_int
        theta = theta_int.numpy()
        extended = np.concatenate([theta, np.zeros_like(theta[:1])])  # θ_ext[P] = 0
        extended *= self._unit  # exact: a power of two
        cells = self._structured[part]
        total = (forward @ theta_int[self._dense_columns]).numpy()
        for g, table_columns in enumerate(self._table_columns):
            table = extended[table_columns].sum(axis=0)  # (cells, *θ's trailing shape)
            total += table[cells[g]]
        return torch.from_numpy(total)

    def _backward(self, part: int, r_int: torch.Tensor) -> torch.Tensor:
        """Σ over one part's rows of r_int,i·x_int,i, float64 integers below 2^53: the dense
        product for the other columns; per group, a bincount of the residuals by cell, then
        :meth:`_from_cells`."""
        backward = self._chunks[part][1]
        if not self._blocks:
            return backward @ r_int
        r = r_int.numpy()
        cells = self._structured[part]
        columns = r.reshape(r.shape[0], -1)
        counts = np.empty((len(self._groups), self._cells, columns.shape[1]))
        for g, size in enumerate(self._group_sizes):
            for k in range(columns.shape[1]):
                counts[g, :size, k] = np.bincount(cells[g], weights=columns[:, k], minlength=size)
        out = self._from_cells(counts, (backward @ r_int).numpy())
        return torch.from_numpy(out.reshape((self.parameters, *r.shape[1:])))

    def _from_cells(self, counts: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """(P, K) float64: the gradient sum from each group's sums of the residuals by cell
        (``counts`` (groups, ≥ cells, K), integers below 2^53) and the dense columns' sums
        (``dense`` (dense columns, K)). A block's column for level l sums the cells whose
        state of that block is l (the numerators' table, transposed): the group's cells as
        an array of its blocks' states (:meth:`_prepare_blocks`' row-major order) summed over
        the other blocks' axes, the last state (none) dropped, then scaled by 2^c (exact:
        integer partial sums below 2^53, a power of two), so each row adds 2^c·r to one
        column per block."""
        trailing = counts.shape[2]
        out = np.empty((self.parameters, trailing), dtype=np.float64)
        for g, (members, shape) in enumerate(zip(self._groups, self._group_shapes, strict=True)):
            cube = counts[g, : self._group_sizes[g]].reshape((*shape, trailing))
            for axis, b in enumerate(members):
                start, length = self._blocks[b]
                others = tuple(i for i in range(len(shape)) if i != axis)
                level_sums = cube.sum(axis=others) if others else cube
                out[start : start + length] = level_sums[:length] * self._unit
        out[self._dense_columns.numpy()] = dense.reshape(-1, trailing)
        return out

    def residuals(self, theta_int: torch.Tensor) -> torch.Tensor:
        """r_int of every row (float64), as :func:`row_residuals` gives them."""
        parts = [
            self._residuals(self._numerators(i, theta_int), ys, **self._kw)
            for i, (_, _, ys) in enumerate(self._chunks)
        ]
        if not parts:
            shape = (0,) if self.classes == 1 else (0, self.classes)
            return torch.zeros(shape, dtype=torch.float64, device=self.device)
        return torch.cat(parts)

    def _part_sum(self, part: int, theta_int: torch.Tensor) -> torch.Tensor:
        ys = self._chunks[part][2]
        if self._blocks and self.classes == 1 and ys.dtype == torch.float64:
            fused = self._binary_part_sum(part, theta_int)
            if fused is not None:
                return fused
        r_int = self._residuals(self._numerators(part, theta_int), ys, **self._kw)
        # Integers below 2^53 throughout: exact in any order.
        return self._backward(part, r_int).round().to(torch.int64)

    def _binary_part_sum(self, part: int, theta_int: torch.Tensor) -> torch.Tensor | None:
        """:meth:`_part_sum` for a binary target with one-hot blocks in one compiled call
        (:func:`_binary_cells_kernel`: the tables, the numerators, the residuals, their sums
        by cell and the cells' sums by column), then the dense columns' product: the same
        exact integers and, per row, the same IEEE operations as :meth:`_numerators`,
        :func:`_residuals` and :meth:`_backward`, so the same bits. None where a numerator
        was NaN (a NaN θ_int): the caller then takes the numpy path, whose NaN handling this
        does not repeat."""
        _, backward, ys = self._chunks[part]
        theta = theta_int.numpy()
        extended = np.concatenate([theta, np.zeros_like(theta[:1])])  # θ_ext[P] = 0
        extended *= self._unit  # exact: a power of two
        columns = backward.numpy()
        residuals = np.empty(columns.shape[1], dtype=np.float64)
        sums = np.zeros(self.parameters + 1, dtype=np.float64)
        b = self._kw
        if _binary_cells_kernel(
            columns,
            theta[self._dense_columns.numpy()],
            extended,
            self._packed_columns,
            self._structured[part],
            ys.numpy(),
            2.0 ** -(b["feature_bits"] + b["theta_bits"]),
            2.0 ** b["residual_bits"],
            residuals,
            np.empty(self._packed_columns[:, 0].shape, dtype=np.float64),
            np.zeros(self._packed_columns[:, 0].shape, dtype=np.float64),
            sums,
        ):
            return None
        out = sums[: self.parameters]
        out *= self._unit  # exact: a power of two
        out[self._dense_columns.numpy()] = columns @ residuals
        # Integers below 2^53 throughout: exact in any order.
        return torch.from_numpy(out).round().to(torch.int64)

    def binary_cells_inputs(self) -> tuple[Any, ...] | None:
        """For a binary target with one-hot blocks and float64 labels in one part: the
        arguments of :func:`_binary_cells_kernel` that do not change from step to step
        (the dense columns, their indices, the packed table columns, the cells, the labels,
        the two scalings, and each step's scratch: residuals, tables, cell sums, gradient
        sums, the dense θ and θ_ext), for :func:`lattice_steps_kernel`; None otherwise
        (the caller then steps through :meth:`gradient_sum`)."""
        if len(self._chunks) != 1 or not self._blocks or self.classes != 1:
            return None
        _, backward, ys = self._chunks[0]
        if ys.dtype != torch.float64:
            return None
        columns = backward.numpy()
        dense = np.ascontiguousarray(self._dense_columns.numpy(), dtype=np.intp)
        tables = self._packed_columns[:, 0].shape
        b = self._kw
        return (
            columns,
            dense,
            self._packed_columns,
            self._structured[0],
            ys.numpy(),
            2.0 ** -(b["feature_bits"] + b["theta_bits"]),
            2.0 ** b["residual_bits"],
            self._unit,
            np.empty(columns.shape[1], dtype=np.float64),
            np.empty(tables, dtype=np.float64),
            np.empty(tables, dtype=np.float64),
            np.empty(self.parameters + 1, dtype=np.float64),
            np.empty(dense.shape[0], dtype=np.float64),
            np.empty(self.parameters + 1, dtype=np.float64),
        )

    def gradient_sum(
        self, theta_int: torch.Tensor, *, pool: ThreadPoolExecutor | None = None
    ) -> torch.Tensor:
        """Σᵢ r_int,i·x_int,i exactly, as int64 (shape (d + 1,), or (d + 1, K) for K
        classes with θ_int (d + 1, K)); the parts on ``pool``'s threads where given (the
        same int64 values: each part's sum is exact)."""
        shape = (self.parameters,) if self.classes == 1 else (self.parameters, self.classes)
        total = torch.zeros(shape, dtype=torch.int64, device=self.device)
        parts = range(len(self._chunks))
        if pool is not None and len(self._chunks) > 1:
            sums = list(pool.map(lambda part: self._part_sum(part, theta_int), parts))
        else:
            sums = [self._part_sum(part, theta_int) for part in parts]
        for part in sums:
            total += part
        return total


@ieee_njit
def _binary_cells_kernel(
    columns: np.ndarray,
    theta: np.ndarray,
    extended: np.ndarray,
    table_columns: np.ndarray,
    cells: np.ndarray,
    y: np.ndarray,
    logit_scale: float,
    residual_scale: float,
    r: np.ndarray,
    tables: np.ndarray,
    counts: np.ndarray,
    sums: np.ndarray,
) -> bool:  # pragma: no cover - compiled (numba runs this source as machine code)
    """One part's step for a binary target with one-hot blocks (:class:`ExactRowSums`), as
    simple loops: each group's table (the sum of 2^c·θ_ext over its blocks' columns at each
    cell, ``table_columns`` (groups, blocks, cells) padded with P, θ_ext[P] = 0); the rows'
    numerators into ``r`` (the dense columns' products, then each group's table entry at
    the row's cell); in place r_int = trunc((σ̃(num·2^-(c+b)) − y)·2^a) (worker/ieee_jit.py:
    one IEEE operation per source operation, no FMA;
    :func:`~worker.mechanisms.fixed_point.sigmoid_element`, then :func:`_residuals`'
    subtraction, exact scaling and truncation); the residuals' sums by cell per group into
    ``counts`` (zeros on entry); each cell's sum added to its blocks' columns of ``sums``
    (P + 1, zeros on entry; column P discarded), unscaled. Every value but σ̃'s is an exact
    integer below 2^53 (the class docstring), the same in any order. Returns whether a
    numerator was NaN (``counts`` and ``sums`` are then left unfilled)."""
    groups, members, size = table_columns.shape
    for g in range(groups):
        for c in range(size):
            total = 0.0
            for m in range(members):
                total += extended[table_columns[g, m, c]]
            tables[g, c] = total
    rows = r.shape[0]
    r[:] = 0.0
    for j in range(columns.shape[0]):
        t = theta[j]
        for i in range(rows):
            r[i] += columns[j, i] * t
    for g in range(groups):
        for i in range(rows):
            r[i] += tables[g, cells[g, i]]
    nan = False
    for i in range(rows):
        x = r[i]
        nan |= x != x
        r[i] = np.trunc((sigmoid_element(x * logit_scale) - y[i]) * residual_scale)
    if nan:
        return True
    for g in range(groups):
        for i in range(rows):
            counts[g, cells[g, i]] += r[i]
        for m in range(members):
            for c in range(size):
                sums[table_columns[g, m, c]] += counts[g, c]
    return False


@ieee_njit
def lattice_steps_kernel(
    x: np.ndarray,
    noise: np.ndarray,
    rho: float,
    g: float,
    limit: float,
    columns: np.ndarray,
    dense: np.ndarray,
    table_columns: np.ndarray,
    cells: np.ndarray,
    y: np.ndarray,
    logit_scale: float,
    residual_scale: float,
    unit: float,
    r: np.ndarray,
    tables: np.ndarray,
    counts: np.ndarray,
    sums: np.ndarray,
    theta: np.ndarray,
    extended: np.ndarray,
) -> int:  # pragma: no cover - compiled (numba runs this source as machine code)
    """Consecutive steps of the hidden-iterate chain (worker/mechanisms/langevin_hidden.py)
    for a binary target with one-hot blocks in one part, one step per row of ``noise``
    (steps, P) int64, updating the lattice point ``x`` (P,) float64 in place; the other
    arguments are :meth:`ExactRowSums.binary_cells_inputs`. Per step, the same values and
    IEEE operations as the chain's numpy loop around :meth:`ExactRowSums.gradient_sum`
    (one part: :meth:`~ExactRowSums._binary_part_sum`), so the same bits:

    * θ_ext = (x, 0)·2^c and the dense θ = x[dense] (exact: a power-of-two scaling, copies);
    * G: :func:`_binary_cells_kernel` (zeroed cell and gradient sums), the block columns'
      sums scaled by 2^c, the dense columns' sums Σᵢ columns[k, i]·r_i (integer products and
      partial sums below 2^53: exact in any order, the GEMV's value), each entry then
      through int64 and back (an exact integer: its value, −0 read as +0, as
      ``.round().to(torch.int64)`` and ``astype(np.float64)`` do);
    * v = rint(fl(fl(ρ·x) − fl(g·G))) (np.round to 0 decimals is rint, ties to even), then
      v + N with N's int64 converted to float64 (exact below 2^53), clamped to
      [−limit, limit] (np.clip's value: min then max, no NaN reaches it).

    Returns the number of steps done: all of them, or the index of a step whose numerator
    was NaN, which is left undone (x as before it) for the caller's numpy path."""
    steps, parameters = noise.shape
    rows = r.shape[0]
    for step in range(steps):
        for j in range(parameters):
            extended[j] = x[j] * unit
        extended[parameters] = 0.0
        for k in range(dense.shape[0]):
            theta[k] = x[dense[k]]
        counts[:] = 0.0
        sums[:] = 0.0
        if _binary_cells_kernel(
            columns,
            theta,
            extended,
            table_columns,
            cells,
            y,
            logit_scale,
            residual_scale,
            r,
            tables,
            counts,
            sums,
        ):
            return step
        for j in range(parameters):
            sums[j] *= unit
        for k in range(dense.shape[0]):
            # four partial sums (exact integers: any order), for the loop's latency
            s0 = 0.0
            s1 = 0.0
            s2 = 0.0
            s3 = 0.0
            i = 0
            while i + 4 <= rows:
                s0 += columns[k, i] * r[i]
                s1 += columns[k, i + 1] * r[i + 1]
                s2 += columns[k, i + 2] * r[i + 2]
                s3 += columns[k, i + 3] * r[i + 3]
                i += 4
            while i < rows:
                s0 += columns[k, i] * r[i]
                i += 1
            sums[dense[k]] = (s0 + s1) + (s2 + s3)
        for j in range(parameters):
            gradient = float(np.int64(sums[j]))
            v = np.rint(x[j] * rho - gradient * g)
            v = v + float(noise[step, j])
            x[j] = max(min(v, limit), -limit)
    return steps


_TABLE_CELLS = 4096
"""At most this many joint states per group of one-hot blocks (:func:`_block_groups`): a
group's float64 table and bincount (32 KiB) stay in a core's L1 cache."""


def _block_groups(blocks: tuple[tuple[int, int], ...]) -> tuple[tuple[int, ...], ...]:
    """The one-hot blocks (indices into ``blocks``, each group in increasing order) grouped
    so that each group's joint states (a block has length + 1: a level, or none) number at
    most :data:`_TABLE_CELLS` (a block with more is a group alone): first fit, the blocks
    taken by decreasing length (ties by position). A function of the public lengths only."""
    groups: list[list[int]] = []
    cells: list[int] = []
    for b in sorted(range(len(blocks)), key=lambda b: (-blocks[b][1], b)):
        states = blocks[b][1] + 1
        for g, size in enumerate(cells):
            if size * states <= _TABLE_CELLS:
                groups[g].append(b)
                cells[g] = size * states
                break
        else:
            groups.append([b])
            cells.append(states)
    return tuple(tuple(sorted(g)) for g in groups)


def _dense_columns(parameters: int, blocks: tuple[tuple[int, int], ...]) -> list[int]:
    """The columns outside the one-hot blocks (the bias column included), in order."""
    inside = {j for start, length in blocks for j in range(start, start + length)}
    if any(j >= parameters - 1 for j in inside):
        raise PlanMismatch("a one-hot block lies outside the features")
    return [j for j in range(parameters) if j not in inside]


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
    """Σᵢ r_int,i·x_int,i exactly, as int64 (shape (d + 1,), or (d + 1, K) for a (d + 1, K)
    θ_int), r_int from :func:`row_residuals` at the quantised θ̃ = θ_int·2^-b. (One call; a
    run prepares :class:`ExactRowSums` once and calls its method every step.)"""
    sums = ExactRowSums(
        x_int,
        y,
        feature_bits=feature_bits,
        residual_bits=residual_bits,
        theta_bits=theta_bits,
        classes=1 if theta_int.dim() == 1 else int(theta_int.shape[1]),
    )
    return sums.gradient_sum(theta_int)


def checked_rows(
    data: TabularTrainingSet,
    *,
    device: torch.device,
    feature_bits: int,
    norm_sq_bound: int,
    parameters: int,
    classes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_int, y) on ``device``: the features on their grid (:func:`quantised_features`,
    the norm bound checked exactly) and the labels, after the checks every proof here needs
    before a step: the parameter count, labels in [0, 1] (binary: |σ − y| ≤ 1) or class
    indices in [0, K). Raises :class:`PlanMismatch`."""
    x_int = quantised_features(
        data.x.to(device), feature_bits=feature_bits, norm_sq_bound=norm_sq_bound
    )
    if x_int.shape[1] * classes != parameters:
        raise PlanMismatch("the model's parameter count differs from the plan's")
    y = data.y.to(device)
    if classes == 1:
        # |σ(·) − y| ≤ 1, the residual bound of the sensitivity, needs labels in [0, 1].
        if y.shape[0] and not bool(((y >= 0) & (y <= 1)).all()):
            raise PlanMismatch("labels outside [0, 1]")
    elif y.shape[0]:
        yd = y.double()
        index = (yd == torch.floor(yd)) & (yd >= 0) & (yd < classes)
        if not bool(index.all()):
            raise PlanMismatch("labels outside the declared classes")
    return x_int, y


@contextmanager
def threaded_row_sums(
    data: TabularTrainingSet,
    *,
    device: torch.device,
    feature_bits: int,
    residual_bits: int,
    theta_bits: int,
    norm_sq_bound: int,
    parameters: int,
    classes: int,
    one_part_binary_cells: bool = False,
) -> Iterator[tuple[ExactRowSums, ThreadPoolExecutor | None]]:
    """A release's prepared sums and the threads to compute them on, for both Langevin
    chains: the rows after :func:`checked_rows`, in :class:`ExactRowSums` with as many parts
    as the worker's threads (ENCLAVE_WORKER_THREADS, a public setting; one off the CPU) and
    the data's public one-hot blocks; with several threads, a pool of them and torch at one
    intra-op thread while the block runs.

    ``one_part_binary_cells``: where :meth:`ExactRowSums.binary_cells_inputs` can apply (a
    binary target, one-hot blocks, the rows within one part's 2^20), one part and no pool
    whatever the worker's threads, for the hidden chain's compiled steps
    (:func:`lattice_steps_kernel`). The same sums: each part's is an exact integer, so one
    part's sum is two parts' added (the class docstring). The choice reads the public
    schema and setting and the row count, as the split into parts does already."""
    x_int, y = checked_rows(
        data,
        device=device,
        feature_bits=feature_bits,
        norm_sq_bound=norm_sq_bound,
        parameters=parameters,
        classes=classes,
    )
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    if (
        one_part_binary_cells
        and classes == 1
        and data.one_hot_blocks
        and int(x_int.shape[0]) <= _CHUNK_ROWS
    ):
        threads = 1
    sums = ExactRowSums(
        x_int,
        y,
        feature_bits=feature_bits,
        residual_bits=residual_bits,
        theta_bits=theta_bits,
        parts=threads,
        classes=classes,
        one_hot=data.one_hot_blocks or (),
    )
    del x_int  # the prepared copy is all the steps read
    with ExitStack() as stack:
        pool = None
        if threads > 1:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=threads))
            stack.enter_context(single_threaded_kernels())
        yield sums, pool


def sample_langevin(
    *,
    params: LangevinParams,
    data: TabularTrainingSet,
    device: torch.device,
    progress: ProgressFn,
    done: int = 0,
    total: int | None = None,
) -> torch.Tensor:
    """One release: θ_T (d + 1,) float64 on the CPU, weights then bias; for K classes
    (d + 1, K), column k class k's weights then bias."""
    total = params.steps if total is None else total
    b, m = theta_bits(feature_bits=params.feature_bits, parameters=params.inputs)
    noise = NoiseStream(rng=secure_rng(), size=params.parameters, steps=params.steps)
    scale = params.noise_multiplier * params.sensitivity
    unit = 2.0 ** -(params.residual_bits + params.feature_bits)
    step_size = params.learning_rate / params.public_n_rows
    shape = (params.parameters,) if params.classes == 1 else (params.inputs, params.classes)
    theta = torch.zeros(shape, dtype=torch.float64, device=device)
    with threaded_row_sums(
        data,
        device=device,
        feature_bits=params.feature_bits,
        residual_bits=params.residual_bits,
        theta_bits=b,
        norm_sq_bound=params.row_norm_sq_bound,
        parameters=params.parameters,
        classes=params.classes,
    ) as (sums, pool):
        for step in range(1, params.steps + 1):
            summed = sums.gradient_sum(quantised_theta(theta, bits=b, limit_bits=m), pool=pool)
            step_noise = noise.draw(scale=scale, same_scale_ahead=params.steps - step + 1)
            step_noise = torch.as_tensor(step_noise, device=device).reshape(shape)
            noisy = (summed + step_noise).double() * unit
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
    """`samples` independent chains (each charged by the plan), as logistic state dicts
    (binary or K-class: linear.weight (K, d), linear.bias (K,))."""
    params = LangevinParams.from_plan(mechanism)

    def chain(done: int, total: int) -> torch.Tensor:
        return sample_langevin(
            params=params, data=data, device=device, progress=progress, done=done, total=total
        )

    return logistic_releases(
        spec=spec,
        data=data,
        classes=params.classes,
        samples=samples,
        steps=params.steps,
        chain=chain,
    )


def logistic_releases(
    *,
    spec: ModelSpec,
    data: TabularTrainingSet,
    classes: int,
    samples: int,
    steps: int,
    chain: Callable[[int, int], torch.Tensor],
) -> MechanismOutput:
    """`samples` runs of ``chain(done, total)`` (θ as (d + 1,) or (d + 1, K)) as logistic
    state dicts, after checking that the model is the plan's logistic regression."""
    module = build_module(spec, int(data.x.shape[1]))
    names = [k for k, _ in module.named_parameters()]
    if names != ["linear.weight", "linear.bias"]:
        raise PlanMismatch("the Langevin sampler is for logistic regression only")
    outputs = int(getattr(module, "classes", 1))
    if outputs != classes:
        raise PlanMismatch("the model's classes differ from the plan's")
    releases = []
    for i in range(samples):
        theta = chain(i * steps, samples * steps)
        if classes == 1:
            weight, bias = theta[:-1].reshape(1, -1), theta[-1:]
        else:
            weight, bias = theta[:-1].T, theta[-1]
        releases.append(
            {"linear.weight": weight.float().clone(), "linear.bias": bias.float().clone()}
        )
    return MechanismOutput(releases=releases)
