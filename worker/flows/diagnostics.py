"""How well a flow q approximates an unnormalised target p̃ (enclave-only diagnostics).

Everything here is derived from private rows when p̃ is an ExpM density: the numbers stay
in the admin's enclave log and never reach an analyst.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ImportanceDiagnostics:
    """Self-normalised importance sampling of p̃ with proposal q, from M draws x_j ~ q.

    - ``log_z``: log Ẑ = log (1/M) Σ_j w_j with w_j = p̃(x_j)/q(x_j). Unbiased in Z (not in
      log Z); an underestimate when q misses mass of p.
    - ``elbo``: mean_j log w_j ≤ log Z. ``−elbo`` is the reverse-KL training loss.
    - ``reverse_kl``: KL(q‖p) ≈ log Ẑ − elbo (≥ 0 by Jensen).
    - ``ess``: Kish's effective sample size (Σw)²/Σw² ∈ [1, M]; ``ess_fraction`` = ess/M.
      A small fraction means q is a poor proposal for p (typically: q too narrow).
    """

    log_z: float
    elbo: float
    reverse_kl: float
    ess: float
    ess_fraction: float
    n_draws: int


def importance_diagnostics(log_p_tilde: Tensor, log_q: Tensor) -> ImportanceDiagnostics:
    """Diagnostics from log p̃(x_j) and log q(x_j) for x_j ~ q (both shape (M,))."""
    if log_p_tilde.shape != log_q.shape or log_q.dim() != 1 or log_q.numel() == 0:
        raise ValueError("log_p_tilde and log_q must be non-empty vectors of the same length")
    log_w = (log_p_tilde.double() - log_q.double()).detach()
    m = log_w.numel()
    finite = torch.isfinite(log_w)
    if not bool(finite.all()):
        # A non-finite weight makes every estimate meaningless; report it as such.
        nan = math.nan
        return ImportanceDiagnostics(nan, nan, nan, nan, nan, m)
    lse = torch.logsumexp(log_w, 0)
    log_z = float(lse - math.log(m))
    elbo = float(log_w.mean())
    ess = float(torch.exp(2.0 * lse - torch.logsumexp(2.0 * log_w, 0)))
    return ImportanceDiagnostics(
        log_z=log_z,
        elbo=elbo,
        reverse_kl=log_z - elbo,
        ess=ess,
        ess_fraction=ess / m,
        n_draws=m,
    )


@dataclass(frozen=True)
class GridComparison:
    """q against the exactly normalised p on a regular grid (problems with 1–3 parameters).

    p is normalised on the grid (its mass outside must be negligible: choose the bounds so).
    ``q_mass`` is Σ q(x_i)·ΔV, q's mass on the grid (≈ 1 when q is a density that lives
    there). ``tv`` = ½ Σ |p_i − q_i| + ½ (1 − q_mass)⁺ counts q's off-grid mass as error;
    ``kl_pq`` / ``kl_qp`` are KL on the grid with q renormalised there.
    """

    tv: float
    kl_pq: float
    kl_qp: float
    q_mass: float
    n_points: int


def grid_points(bounds: Sequence[tuple[float, float]], points_per_dim: int) -> tuple[Tensor, float]:
    """Cell centres of a regular grid (float64, shape (points^D, D)) and the cell volume."""
    if not 1 <= len(bounds) <= 3:
        raise ValueError("grid comparisons are for 1–3 parameters")
    axes = []
    volume = 1.0
    for lo, hi in bounds:
        if not hi > lo:
            raise ValueError("each bound must be (lo, hi) with hi > lo")
        step = (hi - lo) / points_per_dim
        axes.append(lo + step * (torch.arange(points_per_dim, dtype=torch.float64) + 0.5))
        volume *= step
    mesh = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh], dim=-1), volume


def grid_comparison(
    log_p_tilde: Callable[[Tensor], Tensor],
    log_q: Callable[[Tensor], Tensor],
    bounds: Sequence[tuple[float, float]],
    *,
    points_per_dim: int = 100,
    chunk: int = 16384,
) -> GridComparison:
    """Compare q with the exact density p ∝ exp(log_p_tilde) on a grid.

    Both callables take points of shape (M, D) in float64 and return (M,) log-densities.
    """
    points, volume = grid_points(bounds, points_per_dim)
    with torch.no_grad():
        lp = torch.cat([log_p_tilde(c).double() for c in points.split(chunk)])
        lq = torch.cat([log_q(c).double() for c in points.split(chunk)])
    p = torch.softmax(lp, 0)
    q_cells = torch.exp(lq) * volume
    q_mass = float(q_cells.sum())
    tv = 0.5 * float((p - q_cells).abs().sum()) + 0.5 * max(0.0, 1.0 - q_mass)
    log_q_norm = torch.log_softmax(lq, 0)
    log_p = torch.log_softmax(lp, 0)
    q_norm = log_q_norm.exp()
    kl_pq = float(torch.where(p > 0, p * (log_p - log_q_norm), 0.0).sum())
    kl_qp = float(torch.where(q_norm > 0, q_norm * (log_q_norm - log_p), 0.0).sum())
    return GridComparison(tv=tv, kl_pq=kl_pq, kl_qp=kl_qp, q_mass=q_mass, n_points=len(points))
