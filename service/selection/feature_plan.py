"""The ``features`` selection kind's plan (DP-CFS, optionally with a final training, or
PAFS); its request, layout and events are in :mod:`service.selection.features`."""

from __future__ import annotations

from dataclasses import replace

from service.datasets.tabular import TabularSchema
from service.methods.dpsgd import resolve_dpsgd_options
from service.plans import PlanError
from service.privacy.events import ComposedEvent
from service.selection.budget import SelectionBudget
from service.selection.features import (
    FeatureLayout,
    FeatureRequest,
    column_layout,
    feature_plan_parts,
    pafs_event,
)
from service.selection.plan_core import SelectionPlan, split_counts, training_events

__all__ = ["feature_plan"]


def feature_plan(
    request: FeatureRequest,
    *,
    dataset: str,
    schema: TabularSchema,
    n_rows: int,
    n_features: int,
) -> SelectionPlan:
    """The ``features`` kind: DP-CFS (one Gaussian charge on all histograms, no
    trainings, all rows) or PAFS (population × generations trainings and noisy scores,
    composed as for the architecture kind). See :mod:`service.selection.features`."""
    if schema.n_features != n_features:
        raise PlanError("the schema does not match the dataset's feature count")
    if request.method != "pafs":
        event, layout = feature_plan_parts(request, schema=schema)
        if request.final is None:
            return SelectionPlan(
                event=event, trainings=0, n_train=n_rows, n_val=0, mechanisms={}, features=layout
            )
        final = request.final
        opts = resolve_dpsgd_options(final.training, n_rows=n_rows)
        assert opts.batch_size is not None and opts.epochs is not None
        fkey = (opts.batch_size, opts.epochs, opts.noise_decay)
        train, mechanisms, guarantee = training_events(
            dataset=dataset,
            model=final.model,  # on all features: the largest selection
            keys={fkey},
            options=opts,
            budget=SelectionBudget(training_epsilon=final.epsilon, training_delta=final.delta),
            n_train=n_rows,
            n_features=n_features,
        )
        return SelectionPlan(
            event=ComposedEvent(events=(event, train)),
            trainings=1,
            n_train=n_rows,
            n_val=0,
            mechanisms=mechanisms,
            training_guarantee=guarantee,
            features=replace(layout, training_key=fkey),
        )
    assert request.budget is not None
    columns = column_layout(schema, numeric_bins=request.numeric_bins)
    n_train, n_val = split_counts(n_rows, request.budget.validation_fraction)
    options = resolve_dpsgd_options(request.training, n_rows=n_train)
    assert options.batch_size is not None and options.epochs is not None
    key = (options.batch_size, options.epochs, options.noise_decay)
    train, mechanisms, guarantee = training_events(
        dataset=dataset,
        model=request.model,  # on all features: the largest candidate
        keys={key},
        options=options,
        budget=request.budget,
        n_train=n_train,
        n_features=n_features,
    )
    n = request.ga.population * request.ga.generations
    layout = FeatureLayout(
        columns=columns,
        target_bins=2,
        histograms=0,
        cells=0,
        noise_multiplier=None,
        cell_scale=None,
        training_key=key,
    )
    return SelectionPlan(
        event=pafs_event(
            training=train, fitness_epsilon=request.budget.fitness_epsilon, trainings=n
        ),
        trainings=n,
        n_train=n_train,
        n_val=n_val,
        mechanisms=mechanisms,
        training_guarantee=guarantee,
        features=layout,
    )
