"""``method: "auto"`` (issue 21, point 3): the service chooses a training request's method,
and with it that method's default settings (the written rules of
:mod:`service.methods.dpsgd` and :mod:`service.methods.expm`), from public values only: the
public (DP noisy) row count n̂, the schema's row-norm bound B (from its columns), the
target's number of classes K, ε, δ and the model. Only proven methods are chosen: DP-SGD
and the exponential mechanism's Langevin sampler (``expm``), never MCMC or ExpM+NF.

The rule, the first line that applies:

1. δ = 0: refused (:class:`PlanError`): both proven methods are (ε, δ)-DP with δ > 0.
2. Method options given (``dpsgd``, ``expm``, ``expm_nf``): refused. ``auto`` chooses the
   settings as well as the method, and options for a method it might not choose would
   be silently dropped or would make the choice depend on them; to set options, name the
   method.
3. A model other than logistic regression: DP-SGD (the proven ExpM's sensitivity needs
   the convex, Lipschitz logistic loss; MLP and GRU-D train by DP-SGD only).
4. K ≥ 3 classes: DP-SGD (its exact engine, the default). On the bundled digits (10
   classes, ε = 1) the Langevin sampler's median training accuracy was 0.58 against
   DP-SGD's 0.90-0.92 (benchmarks/expm_multiclass_digits.py, commit e2680fa); no K-class
   measurement has the Langevin sampler ahead.
5. A dataset kind without a row-norm bound (time series): DP-SGD.
6. Otherwise (binary logistic regression): the Langevin ExpM where s = n̂·ε/√B ≥ 1,500,
   DP-SGD below. s is the scale the Langevin rule itself sets its reach by (lr·T = s/10,
   service/methods/expm.py): the gradient sum's signal against the noise of a fixed
   (ε, δ), per unit of step.

The threshold is read off the defaults study (benchmarks/results/defaults_study_rule.md,
defaults_study_confirm_rule.md; ε = 1, δ = 1e-5, test AUC, medians of 5 releases at
n ≥ 10,000 and 31 below, each method at its default settings):

=============  ======  ===  ======  ======  ========  ======
dataset        n       B    s       DP-SGD  Langevin  better
=============  ======  ===  ======  ======  ========  ======
breast cancer  398     31   71.5    0.968   0.915     DP-SGD
digits parity  1257    65   155.9   0.947   0.917     DP-SGD
digits ≥ 5     1257    65   155.9   0.911   0.851     DP-SGD
adult700       700     14   187.1   0.846   0.822     DP-SGD
adult1500      1500    14   400.9   0.863   0.849     DP-SGD
adult3000      3000    14   801.8   0.873   0.865     DP-SGD
adult10000     10000   14   2672.6  0.881   0.887     Langevin
adult          30162   14   8061.2  0.883   0.894     Langevin
=============  ======  ===  ======  ======  ========  ======

The better default changes between s = 802 and s = 2,673; 1,500 is about their geometric
mean (1,464), rounded. At ε = 0.1 (defaults_study_eps0.1_rule.md, 15 releases below
10,000 rows, 3 above) the rule agrees on Adult (s = 806: DP-SGD 0.880, Langevin 0.876)
and 700 of its rows (s = 18.7: 0.652, 0.597) and not on 3,000 rows (s = 80.2: DP-SGD
0.763, Langevin 0.790; spreads 0.56-0.82 and 0.70-0.82). The study's targets are binary
and its models logistic; other kinds of data (images) follow line 6 unmeasured.

The plan records the choice (``PrivacyPlan.method_choice``: requested ``auto``, the method
and a short reason, from public values only); the request the analyst sent stays ``auto``,
and the admitted request (``jobs.resolved_request``, :func:`service.plans.resolve_defaults`)
names the chosen method with its settings, so a job queued before a change of this rule
still runs the method and plan it was admitted with (:func:`service.plans.replan_admitted`).
"""

from __future__ import annotations

import math

from service.methods.common import PlanError, PlanFacts
from service.schemas import JobRequest
from service.schemas.jobs import MethodChoice

__all__ = ["LANGEVIN_MIN_SCALE", "auto_choice", "choose_auto", "langevin_scale"]

LANGEVIN_MIN_SCALE = 1500.0
"""s = n̂·ε/√B from which ``auto`` chooses the Langevin ExpM (module docstring, line 6)."""

_METHOD_OPTIONS = ("dpsgd", "expm", "expm_nf")


def langevin_scale(*, n_rows: int, epsilon: float, norm_sq_bound: int) -> float:
    """s = n̂·ε/√B, the Langevin sampler's signal-to-noise scale (service/methods/expm.py)."""
    return n_rows * epsilon / math.sqrt(norm_sq_bound)


def _choice(method: str, reason: str) -> MethodChoice:
    return MethodChoice(requested="auto", method=method, reason=reason)


def auto_choice(request: JobRequest, facts: PlanFacts, *, n_classes: int) -> MethodChoice:
    """The method ``auto`` chooses for ``request`` on a dataset of these public facts, with
    its reason (the module docstring's rule; raises :class:`PlanError` for lines 1-2)."""
    if request.delta <= 0:
        raise PlanError(
            "method 'auto' chooses between the proven methods dpsgd and expm (Langevin), "
            "both (ε, δ)-DP: send delta > 0"
        )
    given = [name for name in _METHOD_OPTIONS if getattr(request, name) is not None]
    if given:
        raise PlanError(
            f"method 'auto' chooses the settings too: {', '.join(given)} options cannot go "
            "with it; name the method to set its options"
        )
    kind = request.model.kind
    if kind != "logistic":
        return _choice("dpsgd", f"model {kind!r}: the proven ExpM is for logistic regression")
    if n_classes >= 3:
        return _choice(
            "dpsgd",
            f"{n_classes} classes: DP-SGD beat the Langevin ExpM on K-class targets (digits)",
        )
    if facts.norm_sq_bound is None:
        return _choice("dpsgd", "the dataset's kind has no row-norm bound for the ExpM")
    s = langevin_scale(
        n_rows=facts.n_rows, epsilon=request.epsilon, norm_sq_bound=facts.norm_sq_bound
    )
    if s >= LANGEVIN_MIN_SCALE:
        return _choice(
            "expm",
            f"n̂·ε/√B = {s:.1f} ≥ {LANGEVIN_MIN_SCALE:g}: on this side of the threshold the "
            "proven Langevin ExpM's defaults beat DP-SGD's in the defaults study",
        )
    return _choice(
        "dpsgd",
        f"n̂·ε/√B = {s:.1f} < {LANGEVIN_MIN_SCALE:g}: on this side of the threshold DP-SGD's "
        "defaults beat the Langevin ExpM's in the defaults study",
    )


def choose_auto(
    request: JobRequest, facts: PlanFacts, *, n_classes: int
) -> tuple[JobRequest, MethodChoice]:
    """``request`` with the method ``auto`` chose (its options left to that method's default
    rules; ``expm`` plans the Langevin sampler by default), and the choice."""
    choice = auto_choice(request, facts, n_classes=n_classes)
    return request.model_copy(update={"method": choice.method}), choice
