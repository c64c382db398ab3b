"""Request and response models of the HTTP API. ORM objects never cross the API.

One module per concept; every public name is re-exported here, so importers write
``from service.schemas import X`` whatever module defines it:

- :mod:`~service.schemas.common`: the method and guarantee vocabularies, the base classes
  of request bodies and of responses read from ORM objects;
- :mod:`~service.schemas.dpsgd`, :mod:`~service.schemas.expm`,
  :mod:`~service.schemas.expm_nf`: each method's options (as :mod:`service.methods`);
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
from service.schemas.dpsgd import DpsgdOptions
from service.schemas.expm import MCMC_ONLY_FIELDS, ExpmOptions
from service.schemas.expm_nf import ExpmNfOptions
from service.schemas.jobs import AdminJob, JobPublic, JobRequest, PrivacyPlan, QuoteResponse
from service.schemas.problems import (
    Health,
    Problem,
    ProblemTypeInfo,
    RemainingBudgets,
    ValidationIssue,
)
from service.schemas.releases import CardPreprocessing, CardPrivacy, ModelCard

__all__ = [
    "GUARANTEE_ORDER",
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
    "DpsgdOptions",
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
    "TotalMismatch",
    "TrainingMethod",
    "ValidationIssue",
    "method_names",
    "weakest_guarantee",
]
