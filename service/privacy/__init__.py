"""Pure differential-privacy math: events, RDP curves, micro-unit amounts, filters,
calibration. No I/O, no state, no torch / web / database imports.

Units everywhere: ε and RDP values in nats, δ a probability, ledger amounts in
integer micro-units (1e-6 nat). See ``filters`` for the composition rules and the
proof that the RDP filter is valid under fully adaptive choice.
"""

from service.privacy.amounts import (
    MICRO,
    MICRO_CAP,
    curve_to_micro_up,
    from_micro,
    signed_to_micro_down,
    to_micro_down,
    to_micro_up,
)
from service.privacy.calibrate import (
    Accountant,
    calibrate_noise_multiplier,
    epsilon_for,
    pld_epsilon,
)
from service.privacy.events import (
    EVENT_TYPES,
    AnyOfEvent,
    ComposedEvent,
    DpEvent,
    ExponentialMechanismEvent,
    PoissonSubsampledGaussianEvent,
    PureDpEvent,
    RandomStoppingEvent,
    SelfComposedEvent,
    event_from_json,
)
from service.privacy.filters import (
    max_admissible_epsilon,
    max_admissible_pure_epsilon,
    pure_admits,
    pure_max_admissible_epsilon,
    rdp_admits,
    rdp_budget_micro,
)
from service.privacy.orders import CALIBRATION_ORDERS, ORDERS, ORDERS_VERSION
from service.privacy.rdp import (
    bounded_range_rdp,
    epsilon_from_rdp,
    gaussian_rdp,
    randomized_response_rdp,
    subsampled_gaussian_rdp,
)

__all__ = [
    "CALIBRATION_ORDERS",
    "EVENT_TYPES",
    "MICRO",
    "MICRO_CAP",
    "ORDERS",
    "ORDERS_VERSION",
    "Accountant",
    "AnyOfEvent",
    "ComposedEvent",
    "DpEvent",
    "ExponentialMechanismEvent",
    "PoissonSubsampledGaussianEvent",
    "PureDpEvent",
    "RandomStoppingEvent",
    "SelfComposedEvent",
    "bounded_range_rdp",
    "calibrate_noise_multiplier",
    "curve_to_micro_up",
    "epsilon_for",
    "epsilon_from_rdp",
    "event_from_json",
    "from_micro",
    "gaussian_rdp",
    "max_admissible_epsilon",
    "max_admissible_pure_epsilon",
    "pld_epsilon",
    "pure_admits",
    "pure_max_admissible_epsilon",
    "randomized_response_rdp",
    "rdp_admits",
    "rdp_budget_micro",
    "signed_to_micro_down",
    "subsampled_gaussian_rdp",
    "to_micro_down",
    "to_micro_up",
]
