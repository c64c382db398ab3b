"""Request and response models of the HTTP API. ORM objects never cross the API.

One module per concept; every public name is re-exported here, so importers write
``from service.schemas import X`` whatever module defines it:

- :mod:`~service.schemas.common`: the method and guarantee vocabularies, the base classes
  of request bodies and of responses read from ORM objects;
- :mod:`~service.schemas.dpsgd`, :mod:`~service.schemas.expm`,
  :mod:`~service.schemas.expm_nf`: each method's options (as :mod:`service.methods`) and
  its plans' mechanism parameters; :mod:`~service.schemas.selection`: a selection plan's;
- :mod:`~service.schemas.events`: the JSON form of DP events, one model per event type;
- :mod:`~service.schemas.stored`: :class:`Typed`, a stored JSON value with a typed contract
  (validated and documented as a model, kept byte for byte);
- :mod:`~service.schemas.jobs`: a job's request, privacy plan, quote, public view and
  the admin's view;
- :mod:`~service.schemas.budgets`: budgets as the caller sees them, a dataset with its
  budgets;
- :mod:`~service.schemas.admin`: admin bodies, ledger entries and verification;
- :mod:`~service.schemas.releases`: the model card of a release;
- :mod:`~service.schemas.problems`: error bodies, the problem-type catalogue, health.
"""

from service.schemas.admin import (
    AnalystCreate,
    AnalystCreated,
    BudgetUpdate,
    CapUpdate,
    ChainCheck,
    KeyRotate,
    LedgerEntryPublic,
    LedgerVerification,
    NominalPolicy,
    NominalUpdate,
    RefundRequest,
    TotalMismatch,
)
from service.schemas.budgets import BudgetView, DatasetPublic
from service.schemas.common import (
    GUARANTEE_ORDER,
    SELECTION_METHOD,
    TRAINING_METHODS,
    Guarantee,
    Method,
    TrainingMethod,
    method_names,
    weakest_guarantee,
)
from service.schemas.dpsgd import DpsgdMechanism, DpsgdOptions
from service.schemas.events import DpEventJson
from service.schemas.expm import (
    LANGEVIN_ONLY_FIELDS,
    MCMC_ONLY_FIELDS,
    ExpmLangevinMechanism,
    ExpmMcmcMechanism,
    ExpmOptions,
)
from service.schemas.expm_nf import ExpmNfMechanism, ExpmNfOptions
from service.schemas.jobs import AdminJob, JobPublic, JobRequest, PrivacyPlan, QuoteResponse
from service.schemas.problems import (
    Health,
    Problem,
    ProblemTypeInfo,
    RemainingBudgets,
    ValidationIssue,
)
from service.schemas.releases import CardPreprocessing, CardPrivacy, ModelCard
from service.schemas.selection import SelectionMechanism

__all__ = [
    "GUARANTEE_ORDER",
    "LANGEVIN_ONLY_FIELDS",
    "MCMC_ONLY_FIELDS",
    "SELECTION_METHOD",
    "TRAINING_METHODS",
    "AdminJob",
    "AnalystCreate",
    "AnalystCreated",
    "BudgetUpdate",
    "BudgetView",
    "CapUpdate",
    "CardPreprocessing",
    "CardPrivacy",
    "ChainCheck",
    "DatasetPublic",
    "DpEventJson",
    "DpsgdMechanism",
    "DpsgdOptions",
    "ExpmLangevinMechanism",
    "ExpmMcmcMechanism",
    "ExpmNfMechanism",
    "ExpmNfOptions",
    "ExpmOptions",
    "Guarantee",
    "Health",
    "JobPublic",
    "JobRequest",
    "KeyRotate",
    "LedgerEntryPublic",
    "LedgerVerification",
    "Method",
    "ModelCard",
    "NominalPolicy",
    "NominalUpdate",
    "PrivacyPlan",
    "Problem",
    "ProblemTypeInfo",
    "QuoteResponse",
    "RefundRequest",
    "RemainingBudgets",
    "SelectionMechanism",
    "TotalMismatch",
    "TrainingMethod",
    "ValidationIssue",
    "method_names",
    "weakest_guarantee",
]
