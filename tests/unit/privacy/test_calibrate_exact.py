"""The quote-latency rewrites of issue 26 compute the same floats as the code they replace:
each is compared bit for bit with a reference that is the replaced code, kept here."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from service.privacy import rdp
from service.privacy.calibrate import noise as cal_noise
from service.privacy.calibrate.common import NOISE_MULTIPLIER_MAX, NOISE_MULTIPLIER_MIN
from service.privacy.calibrate.pld_steps import log_gaussian_delta


def _gdp_sigma_step_by_step(
    *, sampling_rate: float, steps: int, epsilon: float, delta: float
) -> float:
    """The starting guess as computed before: 48 bisection steps, one point at a time."""
    log_delta = math.log(delta)
    eps_arr = np.array([epsilon])
    lo, hi = math.log(1e-8), math.log(1e4)
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        if float(log_gaussian_delta(eps_arr, math.exp(mid))[0]) > log_delta:
            hi = mid
        else:
            lo = mid
    mu = math.exp(0.5 * (lo + hi))
    if sampling_rate == 1.0:
        sigma = math.sqrt(steps) / mu
    else:
        sigma = 1.0 / math.sqrt(math.log1p(mu * mu / (sampling_rate * sampling_rate * steps)))
    return min(max(sigma, NOISE_MULTIPLIER_MIN), NOISE_MULTIPLIER_MAX)


@settings(max_examples=300, deadline=None)
@given(
    q=st.one_of(st.just(1.0), st.floats(1e-6, 1.0)),
    steps=st.integers(1, 50_000),
    log_eps=st.floats(-7.0, 6.0),
    log_delta=st.floats(-40.0, -0.1),
)
def test_gdp_start_is_the_step_by_step_bisection(
    q: float, steps: int, log_eps: float, log_delta: float
) -> None:
    kw = {
        "sampling_rate": q,
        "steps": steps,
        "epsilon": math.exp(log_eps),
        "delta": math.exp(log_delta),
    }
    assert cal_noise._gdp_sigma(**kw) == _gdp_sigma_step_by_step(**kw)  # type: ignore[arg-type]


def _bisection_step_by_step(epsilon: float, delta: float) -> tuple[float, float]:
    """The 48-step bisection's last (lo, hi), one point at a time."""
    log_delta = math.log(delta)
    eps_arr = np.array([epsilon])
    lo, hi = math.log(1e-8), math.log(1e4)
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        if float(log_gaussian_delta(eps_arr, math.exp(mid))[0]) > log_delta:
            hi = mid
        else:
            lo = mid
    return lo, hi


@settings(max_examples=200, deadline=None)
@given(
    log_eps=st.floats(-7.0, 6.0),
    log_delta=st.floats(-40.0, -0.1),
    guess=st.one_of(st.floats(-25.0, 12.0), st.just(math.log(1e-8)), st.just(math.log(1e4))),
)
def test_guessed_walk_follows_the_values_whatever_the_guess(
    log_eps: float, log_delta: float, guess: float
) -> None:
    """The path a (here arbitrary, mostly wrong) estimate of the root predicts is only a
    guess: the walk ends where the step-by-step bisection does."""
    epsilon, delta = math.exp(log_eps), math.exp(log_delta)
    lo, hi = math.log(1e-8), math.log(1e4)
    walked = cal_noise._walk_guessed(epsilon, math.log(delta), lo, hi, guess, 48)
    assert walked == _bisection_step_by_step(epsilon, delta)


def test_root_guess_is_close_on_a_selection_search() -> None:
    """The estimate that saves the evaluations: near the root on the per-training ε of a
    selection search (a speed property; a miss would cost time, not a different μ)."""
    for i in range(20):
        epsilon, delta = 0.3 + 0.0137 * i, 1e-6
        guess = cal_noise._gdp_root_guess(epsilon, math.log(delta), -18.42, 9.21)
        assert guess is not None
        lo, hi = _bisection_step_by_step(epsilon, delta)
        assert abs(guess - 0.5 * (lo + hi)) < 1e-9


def _integer_terms_before(q: float, sigma: float, alpha: int) -> np.ndarray:
    """The terms of rdp._log_a_int's series as it computed them inline (before issue 26)."""
    k = np.arange(alpha + 1, dtype=np.float64)
    return (
        rdp._log_abs_binom(float(alpha), k)
        + k * math.log(q)
        + (alpha - k) * math.log1p(-q)
        + (k * k - k) / (2.0 * sigma * sigma)
    )


@settings(max_examples=300, deadline=None)
@given(
    log_q=st.floats(-12.0, -0.001),
    log_sigma=st.floats(-4.6, 5.0),
    alpha=st.one_of(st.sampled_from([2, 3, 4, 5, 8, 16, 32, 64, 128, 256]), st.integers(2, 1100)),
)
def test_logsumexp_is_scipys_bit_for_bit(log_q: float, log_sigma: float, alpha: int) -> None:
    """The integer-order series (rdp._log_a_int's terms) summed as scipy sums them."""
    terms = _integer_terms_before(math.exp(log_q), math.exp(log_sigma), alpha)
    _assert_scipys(terms)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.floats(-1e4, 1e4, allow_nan=False).map(lambda x: round(x, 1)),
        min_size=1,
        max_size=300,
    )
)
def test_logsumexp_with_ties_and_any_values(values: list[float]) -> None:
    a = np.array(values, dtype=np.float64)
    _assert_scipys(a)


def _assert_scipys(a: np.ndarray) -> None:
    """rdp._logsumexp(a) is scipy's logsumexp up to its last step, log1p(s) + log m + max:
    ours takes log1p from the C library, scipy from numpy, whose AVX-512 kernels differ in
    the last bits; the sum's rounding then moves the result by an ulp of its largest term."""
    ours, scipys = rdp._logsumexp(a), float(special.logsumexp(a))
    if _NUMPY_LOG1P_IS_LIBM:
        assert ours == scipys
    else:
        assert abs(ours - scipys) <= 2.0 * math.ulp(max(abs(float(np.max(a))), 1.0))


def _log1p_agrees() -> bool:
    x = np.random.default_rng(0).uniform(0.0, 64.0, 20_000)
    return bool(np.array_equal(np.log1p(x), np.array([math.log1p(v) for v in x.tolist()])))


_NUMPY_LOG1P_IS_LIBM = _log1p_agrees()


def _log_a_frac_before(q: float, sigma: float, alpha: float) -> float:
    """rdp._log_a_frac as it was before its (α, n)-only parts were cached and its zero
    terms left out of the exact sums."""
    z0 = sigma * sigma * (math.log1p(-q) - math.log(q)) + 0.5
    n_min = max(math.ceil(alpha), math.ceil(z0), math.ceil(alpha - z0)) + 1
    if n_min > rdp._MAX_FRAC_TERMS:
        return rdp._log_a_interpolated(q, sigma, alpha)
    log_q, log_1mq = math.log(q), math.log1p(-q)
    two_s2 = 2.0 * sigma * sigma
    tail_const = alpha * log_1mq - z0 * z0 / two_s2
    mills = sigma / math.sqrt(2.0 * math.pi)
    stop_gap = math.log(1e-10 * (alpha - 1.0))
    gl_alpha = float(special.gammaln(alpha + 1.0))
    n = max(n_min, 256)
    while True:
        i = np.arange(n, dtype=np.float64)
        j = alpha - i
        gl_i = special.gammaln(i + 1.0)
        gl_j = special.gammaln(j + 1.0)
        log_coef = gl_alpha - gl_i - gl_j
        # sign of C(α, i) = sign of Γ(α − i + 1) for α > 0
        sign = special.gammasgn(j + 1.0)
        parts0 = (i * log_q, j * log_1mq, (i * i - i) / two_s2, special.log_ndtr((z0 - i) / sigma))
        parts1 = (j * log_q, i * log_1mq, (j * j - j) / two_s2, special.log_ndtr((j - z0) / sigma))
        log_t0 = log_coef + sum(parts0)
        log_t1 = log_coef + sum(parts1)
        base = abs(gl_alpha) + np.abs(gl_i) + np.abs(gl_j) + 8.0
        rel0 = (base + sum(np.abs(p) for p in parts0)) * (16.0 * 2.0**-52)
        rel1 = (base + sum(np.abs(p) for p in parts1)) * (16.0 * 2.0**-52)

        m = float(max(np.max(log_t0), np.max(log_t1)))
        t0 = np.exp(log_t0 - m)
        t1 = np.exp(log_t1 - m)
        signed = math.fsum((sign * t0).tolist()) + math.fsum((sign * t1).tolist())
        absolute = math.fsum(t0.tolist()) + math.fsum(t1.tolist())
        rounding = math.fsum((t0 * rel0).tolist()) + math.fsum((t1 * rel1).tolist())
        # 2**-40 relative slack covers the rounding of the three fsum results themselves.
        partial = min(signed + rounding + absolute * 2.0**-40, absolute * (1.0 + 2.0**-40))

        c_n = min(0.5, mills / (n - z0)) + min(0.5, mills / (n - alpha + z0))
        log_tail = (
            tail_const
            + math.log(c_n)
            + float(rdp._log_abs_binom(alpha - 1.0, np.array([n - 1.0]))[0])
        )
        total = m + math.log(partial + math.exp(min(log_tail - m, 700.0)))
        # The tail bound is included, so even at the cap the result is an upper bound.
        if log_tail < total + stop_gap or n >= rdp._MAX_FRAC_TERMS:
            return total
        n = min(2 * n, rdp._MAX_FRAC_TERMS)


@settings(max_examples=400, deadline=None)
@given(
    log_q=st.floats(-12.0, -0.001),
    log_sigma=st.floats(-2.0, 4.5),
    alpha=st.one_of(
        st.sampled_from([1.25, 1.5, 1.75, 2.25, 2.5, 3.5, 4.5, 1.1, 7.3, 10.9]),
        st.floats(1.01, 300.0).filter(lambda a: not a.is_integer()),
    ),
)
def test_fractional_series_is_unchanged(log_q: float, log_sigma: float, alpha: float) -> None:
    q, sigma = math.exp(log_q), math.exp(log_sigma)
    # the same float; NaN too (an order within ~1e-13 of an integer: the gamma functions'
    # poles; subsampled_gaussian_rdp then charges +inf, before as now)
    assert _bits(rdp._log_a_frac(q, sigma, alpha)) == _bits(_log_a_frac_before(q, sigma, alpha))


def _bits(*values: float) -> list[str]:
    """The floats' exact values, NaN included (float.hex)."""
    return [float(v).hex() for v in values]


@settings(max_examples=100, deadline=None)
@given(log_q=st.floats(-12.0, 0.0), log_sigma=st.floats(-4.6, 5.0))
def test_integer_orders_on_a_prebuilt_table_are_the_checked_function(
    log_q: float, log_sigma: float
) -> None:
    """Calibration's fixed-grid path gives the public function's values on that grid."""
    q, sigma = min(1.0, math.exp(log_q)), math.exp(log_sigma)
    orders = (*range(2, 64), 80, 128, 1024)
    on_table = rdp.subsampled_gaussian_rdp_on_table(
        q=q, sigma=sigma, table=rdp.integer_order_table(orders)
    )
    checked = rdp.subsampled_gaussian_rdp_integer_orders(
        sampling_rate=q, noise_multiplier=sigma, orders=list(orders)
    )
    assert on_table.tolist() == checked.tolist()


def _on_table_before(q: float, sigma: float, table: rdp.IntegerOrderTable) -> np.ndarray:
    """rdp.subsampled_gaussian_rdp_on_table as it was before k·k − k was kept in the table."""
    alphas, k = table.alphas, table.k
    two_s2 = 2.0 * sigma * sigma
    gauss = alphas / two_s2
    if q == 1.0:
        return gauss
    log_q, log_1mq = math.log(q), math.log1p(-q)
    log_terms = table.log_binom + k * log_q + table.rest * log_1mq + (k * k - k) / two_s2
    m = np.maximum.reduceat(log_terms, table.starts)
    total = np.add.reduceat(np.exp(log_terms - np.repeat(m, table.lengths)), table.starts)
    magnitude = (
        table.max_log_binom_abs
        + alphas * (abs(log_q) + abs(log_1mq))
        + (alphas * alphas - alphas) / two_s2
        + 8.0
    )
    slack = magnitude * (16.0 * 2.0**-52) + (alphas + 2.0) * 2.0**-52
    log_a = m + np.log(total) + slack
    return np.minimum(np.maximum(log_a, 0.0) / (alphas - 1.0), gauss)


@settings(max_examples=150, deadline=None)
@given(log_q=st.floats(-12.0, 0.0), log_sigma=st.floats(-4.6, 5.0))
def test_integer_orders_on_a_table_are_unchanged(log_q: float, log_sigma: float) -> None:
    """Calibration's grid (every integer order of CALIBRATION_ORDERS), bit for bit."""
    from service.privacy.calibrate.rdp_epsilon import _INTEGER_TABLE

    q, sigma = min(1.0, math.exp(log_q)), math.exp(log_sigma)
    got = rdp.subsampled_gaussian_rdp_on_table(q=q, sigma=sigma, table=_INTEGER_TABLE)
    assert _bits(*got.tolist()) == _bits(*_on_table_before(q, sigma, _INTEGER_TABLE).tolist())


def _log_a_int_before(q: float, sigma: float, alpha: int) -> float:
    """rdp._log_a_int as it was before its α-only parts were cached."""
    return rdp._logsumexp(_integer_terms_before(q, sigma, alpha))


@settings(max_examples=300, deadline=None)
@given(
    log_q=st.floats(-12.0, -0.001),
    log_sigma=st.floats(-4.6, 5.0),
    alpha=st.one_of(st.sampled_from([2, 3, 4, 5, 8, 16, 32, 64, 128, 256]), st.integers(2, 700)),
)
def test_integer_series_with_cached_terms_is_unchanged(
    log_q: float, log_sigma: float, alpha: int
) -> None:
    q, sigma = math.exp(log_q), math.exp(log_sigma)
    assert rdp._log_a_int(q, sigma, alpha) == _log_a_int_before(q, sigma, alpha)
    assert rdp._log_a_int(q, sigma, alpha) == _log_a_int_before(q, sigma, alpha)  # cached


def test_validated_orders_are_remembered_only_as_what_validation_returns() -> None:
    """validate_orders' memo: equal tuples give the same floats, bad orders still fail."""
    grids = [(2, 3.5, 64), (2.0, 3.5, 64.0), (np.float64(2.0), np.int64(3), 1.5), (2.5,)]
    for grid in grids:
        first = rdp.validate_orders(grid)
        assert first == rdp.validate_orders(grid) == rdp.validate_orders(list(grid))
        assert all(type(a) is float for a in rdp.validate_orders(grid))
    # equal to an accepted grid but not real numbers of the accepted types: still refused
    not_real = [(Fraction(5, 2),), (Decimal("2.5"),), (np.array(2.5),)]
    for bad in [(1.0,), (2.0, math.nan), (2.0, math.inf), (True, 2.0), (), ("2",), *not_real]:
        for _ in range(2):  # also after a first refusal
            try:
                rdp.validate_orders(bad)  # type: ignore[arg-type]
            except ValueError:
                continue
            raise AssertionError(f"{bad!r} was accepted")


@settings(max_examples=40, deadline=None)
@given(
    log_q=st.floats(-9.0, -0.5),
    sigma=st.floats(0.5, 30.0),
    steps=st.integers(1, 5000),
    log_delta=st.floats(-20.0, -5.0),
)
def test_remembered_rdp_epsilon_is_the_computed_one(
    log_q: float, sigma: float, steps: int, log_delta: float
) -> None:
    """The calibration's memo of ε(σ) returns what rdp_epsilon_of computes."""
    from service.privacy.calibrate.rdp_epsilon import rdp_epsilon_of
    from service.privacy.events import PoissonSubsampledGaussianEvent

    q, delta = math.exp(log_q), math.exp(log_delta)
    event = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
    computed = rdp_epsilon_of(event, delta)
    assert cal_noise._rdp_epsilon(q, steps, sigma, delta) == computed
    assert cal_noise._rdp_epsilon(q, steps, sigma, delta) == computed  # from the memo


# ------------------------------------------------ batched series and walk (issue 26)


@settings(max_examples=150, deadline=None)
@given(
    log_q=st.floats(-12.0, -0.001),
    log_sigma=st.floats(-2.0, 4.5),
    alphas=st.lists(
        st.one_of(
            st.sampled_from([1.25, 1.5, 1.75, 2.25, 2.5, 3.5, 4.5, 1.1, 7.3, 10.9]),
            st.floats(1.01, 300.0).filter(lambda a: not a.is_integer()),
        ),
        min_size=1,
        max_size=8,
        unique=True,
    ),
)
def test_fractional_series_in_one_batch_is_each_orders(
    log_q: float, log_sigma: float, alphas: list[float]
) -> None:
    """rdp._log_a_fracs (rows of one 2-D series, exact row sums) gives each order the float
    of the series computed for that order alone, as it was computed before."""
    q, sigma = math.exp(log_q), math.exp(log_sigma)
    assert _bits(*rdp._log_a_fracs(q, sigma, tuple(alphas))) == _bits(
        *(_log_a_frac_before(q, sigma, a) for a in alphas)
    )


def test_fractional_series_in_one_batch_at_the_edges() -> None:
    """Orders within ~1e-13 of an integer (a pole of Γ: NaN, before as now), σ so small
    that i²/(2σ²) is huge, σ so large that most terms underflow: each order's float."""
    orders = (1.5, 1.9999999999999432, 2.9999999999999996, 5.000000000000001, 7.25, 10.9)
    for sigma in (1e-160, 1e-60, 1e-3, 0.4, 3.0, 25.0, 44.0, 70.0):
        for q in (1e-5, 0.01, 0.5, 0.999):
            assert _bits(*rdp._log_a_fracs(q, sigma, orders)) == _bits(
                *(_log_a_frac_before(q, sigma, a) for a in orders)
            )


@settings(max_examples=150, deadline=None)
@given(
    log_q=st.floats(-12.0, -0.001),
    log_sigma=st.floats(-4.6, 5.0),
    alphas=st.lists(
        st.one_of(st.sampled_from([2, 3, 4, 8, 16, 32, 64, 128, 256]), st.integers(2, 700)),
        min_size=1,
        max_size=20,
    ),
)
def test_integer_series_in_one_pass_is_each_orders(
    log_q: float, log_sigma: float, alphas: list[int]
) -> None:
    """rdp._log_a_ints (one flat array, segment by segment) gives each order the float of
    its own series, as computed before."""
    q, sigma = math.exp(log_q), math.exp(log_sigma)
    assert _bits(*rdp._log_a_ints(q, sigma, tuple(alphas))) == _bits(
        *(_log_a_int_before(q, sigma, a) for a in alphas)
    )


def test_a_curve_is_its_orders_one_by_one() -> None:
    """subsampled_gaussian_rdp on the ledger's grid (batched, remembered) equals the same
    function asked one order at a time, for grids with repeats and in any order."""
    from service.privacy.orders import ORDERS

    grids = [ORDERS, tuple(reversed(ORDERS)), (2.5, 2.0, 2.5, 64.0, 1.25)]
    for q, sigma in [(0.01, 0.6), (256 / 26049, 1.37), (0.3, 4.0), (1e-4, 25.0), (1.0, 2.0)]:
        for grid in grids:
            curve = rdp.subsampled_gaussian_rdp(
                sampling_rate=q, noise_multiplier=sigma, orders=grid
            )
            single = [
                rdp.subsampled_gaussian_rdp(sampling_rate=q, noise_multiplier=sigma, orders=[a])[0]
                for a in grid
            ]
            assert _bits(*curve.tolist()) == _bits(*single)


def _rdp_epsilon_one_order_at_a_time(event: object, delta: float) -> float:
    """rdp_epsilon_of as it was before its walk was computed ahead in batches."""
    from service.privacy.calibrate import rdp_epsilon as m
    from service.privacy.events import leaf_counts

    ints = np.asarray(m._INTEGER_ORDERS, dtype=np.float64)
    leaves = leaf_counts(event)  # type: ignore[arg-type]
    rdp_int = m._leaf_curves(leaves, m._INTEGER_ORDERS, integer=True)
    eps_int = m._cks_epsilons(rdp_int, ints, delta)
    best_i = int(np.nanargmin(eps_int))
    best = float(ints[best_i])
    window = sorted({best, *(a for a in m._FRACTIONAL_ORDERS if best - 1.0 < a < best + 1.0)})
    values: dict[float, tuple[float, float]] = {best: (float(rdp_int[best_i]), eps_int[best_i])}

    def value(a: float) -> float:
        if a not in values:
            r = float(m._leaf_curves(leaves, (a,), integer=False)[0])
            values[a] = (r, float(m._cks_epsilons(np.array([r]), np.array([a]), delta)[0]))
        return values[a][1]

    at = window.index(best)
    for direction in (-1, 1):
        i = at
        while 0 <= i + direction < len(window) and value(window[i + direction]) < value(window[i]):
            i += direction
        if i != at:
            break
    frac = sorted(a for a in values if a != best)
    orders = m._INTEGER_ORDERS_F + tuple(frac)
    curve = np.concatenate((rdp_int, np.array([values[a][0] for a in frac])))
    return rdp.epsilon_from_rdp_on_checked_orders(rdp=curve.tolist(), alphas=orders, delta=delta)


@settings(max_examples=150, deadline=None)
@given(
    log_q=st.floats(-9.0, -0.05),
    log_sigma=st.floats(-0.7, 3.5),
    steps=st.integers(1, 20_000),
    log_delta=st.floats(-25.0, -3.0),
)
def test_walk_computed_ahead_is_the_walk_one_order_at_a_time(
    log_q: float, log_sigma: float, steps: int, log_delta: float
) -> None:
    """rdp_epsilon_of's batches ahead of the walk change nothing: the same ε, bit for bit,
    for DP-SGD histories (batched) and for a composition with another leaf (one order at a
    time), on the fractional orders' range (σ ~ 0.5–30)."""
    from service.privacy.calibrate.rdp_epsilon import rdp_epsilon_of
    from service.privacy.events import (
        ComposedEvent,
        PoissonSubsampledGaussianEvent,
        PureDpEvent,
    )

    q, sigma, delta = math.exp(log_q), math.exp(log_sigma), math.exp(log_delta)
    gaussian = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
    for event in (gaussian, ComposedEvent(events=(gaussian, PureDpEvent(epsilon=0.01)))):
        assert _bits(rdp_epsilon_of(event, delta)) == _bits(
            _rdp_epsilon_one_order_at_a_time(event, delta)
        )


def _conversion_before(rdp_values: list[float], alphas: tuple[float, ...], delta: float) -> float:
    """rdp.epsilon_from_rdp_on_checked_orders' loop as it was before it was vectorised."""
    log_delta = math.log(delta)
    best = math.inf
    for a, r in zip(alphas, rdp_values, strict=True):
        if math.isinf(r):
            continue
        if delta * delta + math.expm1(-r) >= 0.0:
            return 0.0
        eps = r + math.log1p(-1.0 / a) - (log_delta + math.log(a)) / (a - 1.0)
        best = min(best, eps)
    return max(0.0, best)


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    log_delta=st.one_of(st.floats(-40.0, -1e-9), st.sampled_from([math.log(0.9999999999999999)])),
)
def test_conversion_is_the_loop_it_replaces(data: st.DataObject, log_delta: float) -> None:
    """The vectorised CKS conversion gives the loop's float: curves with +inf entries,
    zeros, values at and around the δ² threshold of the (0, δ) shortcut, any δ."""
    from service.privacy.orders import CALIBRATION_ORDERS, ORDERS

    delta = math.exp(log_delta)
    alphas = data.draw(st.sampled_from([ORDERS, CALIBRATION_ORDERS, (1.5, 2.0, 256.0)]))
    threshold = -math.log1p(-delta * delta)
    value = st.one_of(
        st.floats(0.0, 50.0),
        st.floats(0.0, 1e-3),
        st.just(math.inf),
        st.just(0.0),
        st.sampled_from([threshold, math.nextafter(threshold, 1.0), 2.0 * threshold]),
    )
    curve = data.draw(st.lists(value, min_size=len(alphas), max_size=len(alphas)))
    got = rdp.epsilon_from_rdp_on_checked_orders(rdp=curve, alphas=alphas, delta=delta)
    assert _bits(got) == _bits(_conversion_before(curve, alphas, delta))


def test_walk_is_the_same_whatever_the_last_walks_left() -> None:
    """The guess from earlier walks (rdp_epsilon._LAST_END) only chooses what is computed
    ahead: wrong guesses, none, or every order of the window give the same ε."""
    from service.privacy.calibrate import rdp_epsilon as m
    from service.privacy.events import PoissonSubsampledGaussianEvent

    cases = [(0.01, 0.9, 300, 1e-5), (256 / 26049, 1.4, 2000, 1e-6), (0.05, 3.0, 50, 1e-8)]
    for q, sigma, steps, delta in cases:
        event = PoissonSubsampledGaussianEvent(sampling_rate=q, noise_multiplier=sigma, steps=steps)
        want = _rdp_epsilon_one_order_at_a_time(event, delta)
        for hint in (None, -9, -3, 0, 4, 9, 30):
            m._LAST_END.clear()
            if hint is not None:
                m._LAST_END.update(dict.fromkeys(m._INTEGER_ORDERS_F, hint))
            rdp._subsampled_gaussian_curve.cache_clear()
            assert _bits(m.rdp_epsilon_of(event, delta)) == _bits(want)
