"""Plans of the ``architecture`` and ``hyperparameters`` selection kinds: one charge for
the whole workflow, a pure function of the request and public metadata.

Data use (both kinds). Each row goes to the validation part independently with the
public probability ``validation_fraction`` (a Bernoulli split drawn in the worker), the
rest to training. Every candidate is trained by DP-SGD on the training part (Poisson
sampling at q = batch / n̂_train, n̂_train = ⌊(1 − v)·n̂⌋ public) and scored by
:func:`worker.mechanisms.search.noisy_accuracy` on the validation part: correct count +
discrete Laplace(1/ε_fit), divided by the public n̂_val = max(1, ⌊v·n̂⌋). The count has
sensitivity 1 under add/remove-one, so each score is ε_fit-DP, charged as the noisy row
count is (:func:`service.privacy.sampling.count_event`: ε_fit plus the sampler's pmf
gap). We do not claim parallel composition over the two parts: each training and each
score is charged in full.

* ``architecture`` with ``runs`` (RS only): random stopping as for hyperparameters
  below, each run a uniformly drawn architecture.
* ``architecture`` with ``scoring = report_noisy_max`` (RS only): N trainings composed
  with one Report-Noisy-Max selection (ε_fit once); no score is released.
* ``architecture`` (RS, MGRS, PAAS): N = planned_trainings trainings and N scores,
  composed: N × (AnyOf(training events) + count_event(ε_fit)). The searches choose
  candidates adaptively from earlier noisy scores; composition of RDP holds under
  adaptive choice (Mironov 2017, Prop. 1) and AnyOf covers whichever training is
  picked (service/privacy/events.py).
* ``hyperparameters`` (Papernot & Steinke 2022): one run Q = draw settings uniformly
  from the declared grid, train, score; K ~ the declared runs distribution, drawn in the
  worker; the best run by noisy score is released. Charge: RandomStopping(Q) with
  Q's curve ≤ AnyOf(training events) + count_event(ε_fit) (service/privacy/tuning.py).

Every candidate's DP-SGD uses the σ calibrated for the *largest* model the request
allows (the integer-noise slack grows with the parameter count; a smaller model's slack
is smaller, so the charged event covers it), keyed by the privacy-relevant settings
(batch size, epochs, noise schedule).

The code is split by concept; this module re-exports its public names:
:mod:`service.selection.plan_core` (SelectionPlan, split counts, training events,
candidate mechanisms), :mod:`service.selection.runs_spec` (the law of K),
:mod:`service.selection.architecture`, :mod:`service.selection.hyperparameters`,
:mod:`service.selection.feature_plan` (the features kind's plan),
:mod:`service.selection.summary` (workflow ε, plan_summary) and
:mod:`service.selection.kinds` (the kind adapter, with_total_epsilon).
"""

from __future__ import annotations

from service.selection.architecture import (
    ArchitectureRequest,
    architecture_key,
    architecture_plan,
)
from service.selection.architecture import (
    expm_candidate_plan as expm_candidate_plan,
)
from service.selection.budget import SelectionBudget
from service.selection.feature_plan import feature_plan
from service.selection.hyperparameters import (
    HyperparameterCandidate,
    HyperparameterRequest,
    hyperparameter_plan,
)
from service.selection.kinds import (
    REQUEST_MODELS,
    SelectionKind,
    SelectionRequest,
    fit_to_classes,
    fit_to_dataset,
    n_classes_of,
    plan_selection,
    with_total_epsilon,
)
from service.selection.plan_core import SelectionPlan, candidate_mechanism, split_counts
from service.selection.runs_spec import PoissonRunsSpec as PoissonRunsSpec
from service.selection.runs_spec import TnbRunsSpec as TnbRunsSpec
from service.selection.summary import plan_summary, workflow_epsilon

__all__ = [
    "REQUEST_MODELS",
    "ArchitectureRequest",
    "HyperparameterCandidate",
    "HyperparameterRequest",
    "SelectionBudget",
    "SelectionKind",
    "SelectionPlan",
    "SelectionRequest",
    "architecture_key",
    "architecture_plan",
    "candidate_mechanism",
    "feature_plan",
    "fit_to_classes",
    "fit_to_dataset",
    "hyperparameter_plan",
    "n_classes_of",
    "plan_selection",
    "plan_summary",
    "split_counts",
    "with_total_epsilon",
    "workflow_epsilon",
]
