"""Convergence diagnostics of several MCMC chains: rank-normalised split-R̂ and bulk ESS.

Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization, folding, and
localization: an improved R̂ for assessing convergence of MCMC", Bayesian Analysis 16(2):
split each chain in halves, replace the draws by the normal scores of their pooled ranks,
and compute Gelman–Rubin's R̂ (bulk) and, on |x − median|, the same again (tail); R̂ is
the larger. Bulk ESS is the effective sample size of the rank-normalised split chains,
with autocorrelations combined over chains and truncated by Geyer's initial monotone
sequence (the estimator of Stan and ArviZ, written out here to avoid ArviZ's xarray/h5py
dependencies for two functions).

Everything here is derived from private rows when applied to the ExpM chains: the values
belong in MechanismOutput.enclave_diagnostics (the enclave's log), never in an API
response.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats

Draws = npt.NDArray[np.float64]


def _check(draws: Draws) -> Draws:
    x = np.asarray(draws, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 4:
        raise ValueError(f"draws must be (chains, draws ≥ 4), got shape {x.shape}")
    return x


def _split(x: Draws) -> Draws:
    """(chains, n) → (2·chains, n // 2): first and last halves (the middle draw of an odd n
    is dropped)."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale_columns(x: Draws) -> Draws:
    """Normal scores of the pooled ranks (Blom's offset 3/8, as Vehtari et al. 2021) of
    each coordinate ``x[:, :, j]`` at once, ``x`` shaped (chains, n, coords): ranks pooled
    over (chains, n) per coordinate (``rankdata`` along one axis ranks each column alone;
    averaged ties are exact halves) and one elementwise ``ndtri`` pass, so a coordinate's
    scores do not depend on the others."""
    pooled = x.reshape(-1, x.shape[2])
    ranks = stats.rankdata(pooled, method="average", axis=0)
    z = stats.norm.ppf((ranks - 0.375) / (pooled.shape[0] + 0.25))
    return np.asarray(z, dtype=np.float64).reshape(x.shape)


def _rhat(x: Draws) -> float:
    """Gelman–Rubin R̂ of (chains, n) draws (Gelman et al., BDA3, eq. 11.4)."""
    n = x.shape[1]
    between = n * float(np.var(x.mean(axis=1), ddof=1))
    within = float(np.mean(np.var(x, axis=1, ddof=1)))
    if within == 0.0:
        return math.inf if between > 0.0 else math.nan
    return math.sqrt(((n - 1) / n * within + between / n) / within)


def split_rhat(draws: Draws) -> float:
    """Rank-normalised split-R̂ of one scalar, ``draws`` shaped (chains, draws): the max of
    the bulk and the folded (tail) R̂. About 1 for chains that agree; ≥ 1.01 is the usual
    warning. (:func:`rhat_and_ess_by_coordinate` of the one coordinate.)"""
    return rhat_and_ess_by_coordinate(_check(draws)[:, :, None])[0][0]


def rhat_and_ess_by_coordinate(draws: Draws) -> tuple[list[float], list[float]]:
    """:func:`split_rhat` (the max of the bulk and the folded R̂) and :func:`ess_bulk` of
    every coordinate of ``draws`` shaped (chains, draws, coords): the normal scores of all
    coordinates from one ranking and one ``ndtri`` pass, then each coordinate's R̂ and ESS
    from a contiguous copy of its scores. A chain's diagnostics rank every coordinate: one
    ranking per coordinate spent three quarters of a small HMC release in scipy's per-call
    overheads."""
    x = np.asarray(draws, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"draws must be (chains, draws, coords), got shape {x.shape}")
    if x.shape[2] == 0:
        return [], []
    _check(x[:, :, 0])
    bulk = _z_scale_columns(_split(x))
    folded = np.abs(x - np.median(x, axis=(0, 1)))
    tail = _z_scale_columns(_split(folded))
    rhats, esses = [], []
    for j in range(x.shape[2]):
        b = np.ascontiguousarray(bulk[:, :, j])
        rhats.append(max(_rhat(b), _rhat(np.ascontiguousarray(tail[:, :, j]))))
        esses.append(_ess(b))
    return rhats, esses


def _autocov(x: Draws) -> Draws:
    """Biased autocovariances of each row at lags 0 … n − 1 (FFT)."""
    n = x.shape[1]
    centred = x - x.mean(axis=1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(centred, n=size, axis=1)
    return np.fft.irfft(f * np.conj(f), n=size, axis=1)[:, :n] / n


def _ess(x: Draws) -> float:
    """ESS of (chains, n) draws with Geyer's initial monotone sequence (Stan's estimator)."""
    chains, n = x.shape
    acov = _autocov(x)
    mean_var = float(np.mean(acov[:, 0])) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus += float(np.var(x.mean(axis=1), ddof=1))
    if var_plus == 0.0:
        return math.nan
    rho = np.zeros(n)
    even, odd = 1.0, 1.0 - (mean_var - float(np.mean(acov[:, 1]))) / var_plus
    rho[0], rho[1] = even, odd
    t = 1
    while t < n - 3 and even + odd > 0.0:
        even = 1.0 - (mean_var - float(np.mean(acov[:, t + 1]))) / var_plus
        odd = 1.0 - (mean_var - float(np.mean(acov[:, t + 2]))) / var_plus
        if even + odd >= 0.0:
            rho[t + 1], rho[t + 2] = even, odd
        t += 2
    max_t = t - 2
    if even > 0.0:
        rho[max_t + 1] = even
    t = 1  # make the sums of pairs monotone (Geyer 1992)
    while t <= max_t - 2:
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = rho[t + 2] = (rho[t - 1] + rho[t]) / 2.0
        t += 2
    total = chains * n
    tau = -1.0 + 2.0 * float(np.sum(rho[: max_t + 1])) + float(np.sum(rho[max_t + 1 : max_t + 2]))
    return total / max(tau, 1.0 / math.log10(total))


def ess_bulk(draws: Draws) -> float:
    """Bulk effective sample size of one scalar, ``draws`` shaped (chains, draws): about
    chains × draws for independent draws, less for autocorrelated chains.
    (:func:`rhat_and_ess_by_coordinate` of the one coordinate.)"""
    return rhat_and_ess_by_coordinate(_check(draws)[:, :, None])[1][0]
