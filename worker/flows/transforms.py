"""Invertible transforms for normalizing flows, all with one small interface.

Every transform maps a batch ``z`` of shape (N, D) to ``x`` of shape (N, D) and returns
``(x, ladj)`` where ``ladj`` (N,) is log|det ∂x/∂z|. ``inverse`` recovers ``z`` from ``x``:
in closed form where one exists, numerically otherwise (planar and Sylvester layers have
no closed-form inverse, but their invertibility constraints make every inverse a chain of
scalar monotone equations, solved here by bisection to float precision).

``invertibility_margin`` returns a number that is ≥ 0 exactly when the layer's
invertibility constraint holds; the contract tests check it after setting raw parameters
to adversarial values. The constraints are enforced by the parameterisation, so no raw
parameter value can violate them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "SYLVESTER_DIAG_MARGIN",
    "BoxTanh",
    "ElementwiseAffine",
    "HouseholderSylvester",
    "Planar",
    "Transform",
    "solve_y_plus_a_tanh",
]

# Bisection halves the bracket each step; 64 halvings shrink a bracket of width 2|a| + 2
# below float64 resolution for any |a| < 1e3 (wider brackets still converge to ~1e-16·|a|).
_BISECTION_STEPS = 64

# The Sylvester diagonal product r1_ii * r2_ii is kept ≥ −1 + margin, strictly above the
# bound −1/‖h′‖∞ = −1 of van den Berg et al. (2018), so det J ≥ margin^D never rounds to 0.
SYLVESTER_DIAG_MARGIN = 1e-3


def _inv_softplus(y: float) -> float:
    return math.log(math.expm1(y))


def solve_y_plus_a_tanh(rhs: Tensor, a: Tensor) -> Tensor:
    """Solve y + a·tanh(y) = rhs elementwise for y, given a ≥ −1.

    For a ≥ −1 the left side has derivative 1 + a·sech²(y) ≥ tanh²(y) ≥ 0, vanishing at
    one point at most, so it is strictly increasing and the root is unique. Since
    |tanh| ≤ 1 the root lies in [rhs − |a|, rhs + |a|]; bisection on that bracket is
    globally convergent, unlike Newton or fixed-point iteration.
    """
    a = a.expand_as(rhs)
    lo = rhs - a.abs() - 1.0
    hi = rhs + a.abs() + 1.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        above = mid + a * torch.tanh(mid) > rhs
        hi = torch.where(above, mid, hi)
        lo = torch.where(above, lo, mid)
    return 0.5 * (lo + hi)


class Transform(nn.Module, ABC):
    """A bijection of R^D acting on batches of shape (N, D)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError("dim must be ≥ 1")
        self.dim = dim

    @abstractmethod
    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Return (x, log|det ∂x/∂z|) with shapes (N, D) and (N,)."""

    @abstractmethod
    def inverse(self, x: Tensor) -> Tensor:
        """Return z with forward(z)[0] == x (numerically where no closed form exists)."""

    def contains(self, x: Tensor) -> Tensor:
        """(N,) bool: which points lie in the transform's image (all of R^D by default)."""
        return torch.ones(x.shape[0], dtype=torch.bool, device=x.device)

    @abstractmethod
    def invertibility_margin(self) -> Tensor:
        """A scalar that is ≥ 0 iff the layer's invertibility constraint holds."""


class Planar(Transform):
    """Planar flow x = z + û·tanh(wᵀz + b) (Rezende & Mohamed 2015, eq. 10).

    Invertibility needs wᵀû ≥ −1 (Rezende & Mohamed 2015, appendix A.1); it is enforced
    by the reparameterisation û = u + (m(wᵀu) − wᵀu)·w/‖w‖², m(x) = −1 + softplus(x),
    which gives wᵀû = m(wᵀu) > −1 for every raw (u, w).
    log|det J| = log|1 + ûᵀψ(z)| with ψ(z) = tanh′(wᵀz + b)·w (eq. 11–12).
    """

    def __init__(
        self, dim: int, *, init_scale: float = 0.1, generator: torch.Generator | None = None
    ) -> None:
        super().__init__(dim)
        self.w = nn.Parameter(torch.randn(dim, generator=generator) * init_scale)
        self.u = nn.Parameter(torch.randn(dim, generator=generator) * init_scale)
        self.b = nn.Parameter(torch.zeros(()))

    def u_hat(self) -> Tensor:
        wu = self.w @ self.u
        m = -1.0 + F.softplus(wu)
        # clamp only guards w = 0 exactly (then the correction term is 0·w = 0 anyway).
        return self.u + (m - wu) * self.w / (self.w @ self.w).clamp_min(1e-30)

    def w_dot_u_hat(self) -> Tensor:
        """wᵀû = m(wᵀu) in closed form: exact, where the dot product would round below −1."""
        m = -1.0 + F.softplus(self.w @ self.u)
        return torch.where(self.w @ self.w > 0, m, torch.zeros_like(m))

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        h = torch.tanh(z @ self.w + self.b)
        x = z + h.unsqueeze(-1) * self.u_hat()
        ladj = torch.log((1.0 + (1.0 - h.square()) * self.w_dot_u_hat()).abs())
        return x, ladj

    def inverse(self, x: Tensor) -> Tensor:
        # With y = wᵀz + b: wᵀx + b = y + (wᵀû)·tanh(y), a monotone scalar equation.
        y = solve_y_plus_a_tanh(x @ self.w + self.b, self.w_dot_u_hat())
        return x - torch.tanh(y).unsqueeze(-1) * self.u_hat()

    def invertibility_margin(self) -> Tensor:
        return 1.0 + self.w_dot_u_hat()


class HouseholderSylvester(Transform):
    """Householder Sylvester flow x = z + Q R₁ tanh(R₂ Qᵀ z + b) (van den Berg et al. 2018).

    Q (D×D, orthogonal) is a product of ``reflections`` Householder matrices
    H = I − 2vvᵀ/‖v‖² (van den Berg et al. 2018, §3.2; Tomczak & Welling 2016); R₁ and R₂
    are upper triangular. By Sylvester's determinant identity (eq. 5) and triangularity,
    det J = Π_i (1 + h′(·)_i r₁ᵢᵢ r₂ᵢᵢ) (eq. 8). Invertibility needs r₁ᵢᵢ r₂ᵢᵢ > −1/‖h′‖∞
    = −1 for h = tanh (Theorem 2). Parameterisation: r₂ᵢᵢ = softplus(·) + 1e-3 > 0 (its
    sign is redundant: flipping row i of R₂, b_i and column i of R₁ leaves x unchanged
    because tanh is odd) and the product pᵢ = r₁ᵢᵢ r₂ᵢᵢ = −1 + margin + softplus(·), so
    r₁ᵢᵢ = pᵢ / r₂ᵢᵢ and the constraint holds for every raw value.
    """

    _strict_upper: Tensor

    def __init__(
        self,
        dim: int,
        *,
        reflections: int | None = None,
        init_scale: float = 0.01,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(dim)
        self.reflections = dim if reflections is None else reflections
        if self.reflections < 1:
            raise ValueError("reflections must be ≥ 1")
        self.v = nn.Parameter(torch.randn(self.reflections, dim, generator=generator))
        self.r1_off = nn.Parameter(torch.randn(dim, dim, generator=generator) * init_scale)
        self.r2_off = nn.Parameter(torch.randn(dim, dim, generator=generator) * init_scale)
        # Start with pᵢ = 0 (R₁ diagonal 0) and r₂ᵢᵢ = 1: close to the identity map.
        self.p_raw = nn.Parameter(torch.full((dim,), _inv_softplus(1.0 - SYLVESTER_DIAG_MARGIN)))
        self.r2_diag_raw = nn.Parameter(torch.full((dim,), _inv_softplus(1.0 - 1e-3)))
        self.b = nn.Parameter(torch.zeros(dim))
        self.register_buffer("_strict_upper", torch.ones(dim, dim).triu(1), persistent=False)

    def q(self) -> Tensor:
        """Q = H_1 H_2 ⋯ H_K with H_k = I − 2 v_k v_kᵀ / ‖v_k‖².

        All K reflections are built in one batched op and multiplied as a balanced tree
        (log₂K batched matmuls), which is much faster than K sequential small ops.
        """
        v = self.v / self.v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        eye = torch.eye(self.dim, dtype=v.dtype, device=v.device)
        mats = eye - 2.0 * v.unsqueeze(-1) * v.unsqueeze(-2)  # (K, D, D)
        while mats.shape[0] > 1:
            if mats.shape[0] % 2:
                mats = torch.cat([mats, eye.unsqueeze(0)])
            mats = torch.bmm(mats[0::2], mats[1::2])  # keeps the order H_1 H_2 ⋯ H_K
        return mats[0]

    def diagonals(self) -> tuple[Tensor, Tensor]:
        """(p, r₂ diag) with p = r₁ᵢᵢ r₂ᵢᵢ ≥ −1 + margin and r₂ᵢᵢ > 0."""
        r2_diag = F.softplus(self.r2_diag_raw) + 1e-3
        p = -1.0 + SYLVESTER_DIAG_MARGIN + F.softplus(self.p_raw)
        return p, r2_diag

    def triangulars(self) -> tuple[Tensor, Tensor, Tensor]:
        p, r2_diag = self.diagonals()
        mask = self._strict_upper
        r1 = self.r1_off * mask + torch.diag(p / r2_diag)
        r2 = self.r2_off * mask + torch.diag(r2_diag)
        return r1, r2, p

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        q = self.q()
        r1, r2, p = self.triangulars()
        h = torch.tanh((z @ q) @ r2.T + self.b)  # rows: R₂ Qᵀ z + b
        x = z + (h @ r1.T) @ q.T
        ladj = torch.log((1.0 + (1.0 - h.square()) * p).abs()).sum(-1)
        return x, ladj

    def inverse(self, x: Tensor) -> Tensor:
        # In the rotated frame ẑ = Qᵀz the map is ẑ' = ẑ + R₁ tanh(R₂ẑ + b); both R are upper
        # triangular, so coordinate i depends only on ẑ_i..ẑ_{D-1}: back-substitution, each
        # step a monotone scalar equation y + pᵢ tanh(y) = rhs with y = (R₂ẑ + b)ᵢ.
        q = self.q()
        r1, r2, p = self.triangulars()
        target = x @ q
        n = x.shape[0]
        z_hat = torch.zeros_like(target)
        h = torch.zeros_like(target)
        for i in reversed(range(self.dim)):
            t_i = target[:, i] - h[:, i + 1 :] @ r1[i, i + 1 :]
            c_i = z_hat[:, i + 1 :] @ r2[i, i + 1 :] + self.b[i]
            y = solve_y_plus_a_tanh(r2[i, i] * t_i + c_i, p[i].expand(n))
            z_hat[:, i] = (y - c_i) / r2[i, i]
            h[:, i] = torch.tanh(y)
        return z_hat @ q.T

    def invertibility_margin(self) -> Tensor:
        p, r2_diag = self.diagonals()
        return torch.minimum((1.0 + p).min(), r2_diag.min())


class ElementwiseAffine(Transform):
    """x = μ + s ⊙ z with s = exp(ρ), ρ clamped to ±30 so s stays finite and > 0 for any raw
    value; log|det J| = Σ ρ.

    Planar and Sylvester layers change scale only along a few directions; this layer lets
    the flow match per-coordinate scales that differ from the base's by orders of
    magnitude (log-scale parameterisation: Adam moves ρ additively, s multiplicatively).
    """

    _MAX_LOG_SCALE = 30.0

    def __init__(self, dim: int, *, init_scale: float = 1.0) -> None:
        super().__init__(dim)
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError("init_scale must be a positive finite number")
        self.loc = nn.Parameter(torch.zeros(dim))
        self.log_scale = nn.Parameter(torch.full((dim,), math.log(init_scale)))

    def clamped_log_scale(self) -> Tensor:
        return self.log_scale.clamp(-self._MAX_LOG_SCALE, self._MAX_LOG_SCALE)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        rho = self.clamped_log_scale()
        return self.loc + torch.exp(rho) * z, rho.sum().expand(z.shape[0])

    def inverse(self, x: Tensor) -> Tensor:
        return (x - self.loc) * torch.exp(-self.clamped_log_scale())

    def invertibility_margin(self) -> Tensor:
        return torch.exp(self.clamped_log_scale()).min()


class BoxTanh(Transform):
    """x = R·tanh(z): a bijection of R^D onto the open box (−R, R)^D, the public parameter
    domain of a flow whose target lives on that box (issue 13). No parameters.

    log|det ∂x/∂z| = Σ log(R·(1 − tanh²z)) = Σ [log R + 2·(log 2 − z − softplus(−2z))],
    the last form exact for large |z| where 1 − tanh² underflows.
    """

    def __init__(self, dim: int, *, radius: float) -> None:
        super().__init__(dim)
        if not (radius > 0 and math.isfinite(radius)):
            raise ValueError("radius must be a positive finite number")
        self.radius = radius

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        log_dtanh = 2.0 * (math.log(2.0) - z - F.softplus(-2.0 * z))
        ladj = (math.log(self.radius) + log_dtanh).sum(dim=-1)
        return self.radius * torch.tanh(z), ladj

    def inverse(self, x: Tensor) -> Tensor:
        return torch.atanh(x / self.radius)

    def contains(self, x: Tensor) -> Tensor:
        return (x.abs() < self.radius).all(dim=-1)

    def invertibility_margin(self) -> Tensor:
        return torch.tensor(self.radius)
