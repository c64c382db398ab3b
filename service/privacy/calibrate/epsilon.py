"""ε (nats) at δ of an event tree: :func:`epsilon_for` by either accountant, and the
information-only PLD ε of a list of events (:func:`pld_epsilon`).

By PLD, trees of Poisson-subsampled Gaussians (and slack) go to the fast PLD
(:func:`~service.privacy.calibrate.fast_pld.fast_pld_epsilon`), and trees with pure
leaves to dp_accounting (Meiser & Mohammadi 2018; Doroshenko et al. 2022). Where the
fast PLD is unavailable it answers with RDP
(:func:`~service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of`), also an upper bound
("fall back to RDP only where PLD fails").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.privacy.calibrate.common import (
    PLD_VALUE_DISCRETIZATION,
    Accountant,
    check_accountant,
    check_delta,
)
from service.privacy.calibrate.fast_pld import fast_pld_epsilon, gaussian_parts
from service.privacy.calibrate.pld_steps import FastPldUnavailable
from service.privacy.calibrate.rdp_epsilon import rdp_epsilon_of
from service.privacy.deadline import check_deadline
from service.privacy.events import (
    ComposedEvent,
    DpEvent,
    PmfSlackEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    leaf_counts,
)

__all__ = ["PldUnavailable", "epsilon_for", "pld_epsilon", "pld_epsilon_of"]


class PldUnavailable(ValueError):
    """The event tree has a leaf type with no PLD here (random stopping, any-of): the PLD
    ε is not available for it. Only informational figures use PLD over arbitrary events
    (admission and charges use RDP curves), so callers showing one report "not available"
    rather than fail; calibration never sees such trees."""


@dataclass(frozen=True)
class _EventPld:
    """The PLD of an event tree's mechanisms, and the total pointwise slack τ of its
    PmfSlackEvent leaves (corrections, not mechanisms: they have no PLD of their own)."""

    pld: Any
    slack_tau: float


def _pld_of(event: DpEvent, value_discretization_interval: float) -> _EventPld:
    """dp_accounting PLD (pessimistic) of an event tree, add/remove-one neighbours;
    raises :class:`PldUnavailable` for a tree with a leaf other than pure, DP-SGD or
    slack leaves (RandomStoppingEvent, AnyOfEvent: no PLD is implemented for them)."""
    from dp_accounting.pld import common, privacy_loss_distribution

    pld = privacy_loss_distribution.identity(
        value_discretization_interval=value_discretization_interval
    )
    tau = 0.0
    for leaf, count in leaf_counts(event).items():
        if isinstance(leaf, PmfSlackEvent):
            # Pointwise factors e^{±τ} multiply along a composition (also an adaptive
            # one: the joint law factorises into conditionals), so the slacks add.
            tau += count * leaf.tau
            continue
        if isinstance(leaf, PureDpEvent):
            if leaf.epsilon == 0.0:
                continue
            # The worst-case PLD of an ε-DP mechanism: randomized response
            # (Kairouz, Oh & Viswanath 2015; dp_accounting from_privacy_parameters).
            part = privacy_loss_distribution.from_privacy_parameters(
                common.DifferentialPrivacyParameters(epsilon=leaf.epsilon, delta=0.0),
                value_discretization_interval=value_discretization_interval,
            )
        elif isinstance(leaf, PoissonSubsampledGaussianEvent):
            part = privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=leaf.noise_multiplier,
                sampling_prob=leaf.sampling_rate,
                value_discretization_interval=value_discretization_interval,
            )
        else:
            raise PldUnavailable(f"no PLD for {type(leaf).__name__}")
        pld = pld.compose(part.self_compose(count) if count > 1 else part)
    return _EventPld(pld=pld, slack_tau=tau)


def _dp_accounting_epsilon_of(event: DpEvent, delta: float, vdi: float) -> float:
    """ε at ``delta`` of the event by dp_accounting's PLD, slack included.

    If the laws P̂, Q̂ that run are within e^{±τ} of the analysed P, Q pointwise and
    P(O) ≤ e^{ε'} Q(O) + δ', then P̂(O) ≤ e^{τ}(e^{ε'} e^{τ} Q̂(O) + δ'), i.e. (ε' + 2τ,
    e^{τ} δ')-DP: we evaluate the PLD at δ' = δ e^{−τ} and add 2τ.
    """
    parts = _pld_of(event, vdi)
    tau = parts.slack_tau
    eps = float(parts.pld.get_epsilon_for_delta(delta * math.exp(-tau)))
    return max(0.0, eps) + 2.0 * tau


def _dp_accounting_dpsgd_epsilon(
    *, sampling_rate: float, noise_multiplier: float, steps: int, delta: float, vdi: float
) -> float:
    """dp_accounting's PLDAccountant on its own events: the independent reference the
    tests and the benchmark hold the fast PLD against (not used to calibrate)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(value_discretization_interval=vdi)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
            ),
            steps,
        )
    )
    return max(0.0, float(acc.get_epsilon(delta)))


def pld_epsilon_of(event: DpEvent, delta: float, vdi: float) -> float:
    """ε at ``delta`` of an event tree by a pessimistic PLD at interval ``vdi``.

    Trees of Poisson-subsampled Gaussians (and slack) go to the fast PLD; where it is
    unavailable, to the RDP bound
    (:func:`~service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of`, also an upper
    bound: the issue's "fall back to RDP only where PLD fails"). Trees with pure leaves
    go to dp_accounting (randomized-response PLD per pure leaf).
    """
    parts = gaussian_parts(event)
    if parts is None:
        return _dp_accounting_epsilon_of(event, delta, vdi)
    try:
        return fast_pld_epsilon(parts, delta, vdi)
    except FastPldUnavailable:
        return rdp_epsilon_of(event, delta)


def pld_epsilon(
    *,
    events: Sequence[DpEvent],
    delta: float,
    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """PLD-composed ε (nats) of a list of events at ``delta``: INFORMATION ONLY.

    This is the ε of the *non-adaptive* composition of the events (parameters
    fixed in advance). Across jobs the analyst chooses the next job after seeing
    earlier outputs, and PLD/f-DP composition is not known to be valid as a filter
    under such adaptive choice (natural f-DP filters can fail: Tran, Koskela,
    Räisä & Honkela 2026). Never use this number to admit a request; the RDP
    filter in filters.py is what admits. Pure events, exponential-mechanism
    events included, enter as the worst-case PLD of an ε-DP mechanism
    (randomized response): the bounded-range refinement that the RDP curve of
    ExponentialMechanismEvent uses is not modelled here, so for many ExpM releases
    the RDP number can be the smaller one: this figure may be tighter or looser
    than the filter's. PmfSlackEvent leaves (a sampler's pointwise e^{±τ} gap) add
    up to one τ, and the result is ε' + 2τ with ε' taken at δ·e^{−τ}.
    Lists of DP-SGD events alone use the fast PLD (see :func:`pld_epsilon_of`).
    Raises :class:`PldUnavailable` (a ValueError) where an event's tree holds a leaf with
    no PLD here (RandomStoppingEvent, AnyOfEvent): the figure is then not available.
    """
    d = check_delta(delta)
    evs = list(events)
    if not evs:
        return 0.0
    for e in evs:
        if not isinstance(e, DpEvent):
            raise ValueError(f"events must be DpEvent instances, got {e!r}")
    return pld_epsilon_of(ComposedEvent(events=tuple(evs)), d, value_discretization_interval)


def epsilon_for(
    *,
    event: DpEvent,
    delta: float,
    accountant: Accountant,
    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """ε (nats) at ``delta`` of one event (e.g. one job) by the chosen accountant.

    "rdp": the event's RDP curve on CALIBRATION_ORDERS (fractional orders near the best
    integer one, :func:`~service.privacy.calibrate.rdp_epsilon.rdp_epsilon_of`) + CKS
    conversion.
    "pld": a pessimistic PLD (non-adaptive composition of the event's parts — correct
    for one job whose parameters are fixed in advance) at
    ``value_discretization_interval`` (an upper bound at any interval; pass
    :func:`~service.privacy.calibrate.common.pld_value_discretization` to reproduce
    what calibration used): the fast PLD for DP-SGD trees (RDP where it is
    unavailable), dp_accounting for trees with pure leaves. For a pure event the result
    is at most its basic-composition ε.
    """
    check_deadline()  # every calibration's ε(σ) goes through here or search.search_sigma
    d = check_delta(delta)
    acc = check_accountant(accountant)
    if not isinstance(event, DpEvent):
        raise ValueError(f"event must be a DpEvent, got {event!r}")
    if acc == "rdp":
        eps = rdp_epsilon_of(event, d)
    else:
        eps = pld_epsilon_of(event, d, value_discretization_interval)
    pure = event.pure_epsilon()
    # A pure event is (ε, 0)-DP by basic composition, hence (ε, δ)-DP for every δ;
    # on a finite order grid the RDP conversion can come out slightly above that.
    return eps if pure is None else min(eps, pure)
