"""Normalizing-flow layers, flows and flow-vs-target diagnostics."""

from worker.flows.diagnostics import (
    GridComparison,
    ImportanceDiagnostics,
    grid_comparison,
    grid_points,
    importance_diagnostics,
)
from worker.flows.flow import Flow, FlowConfig, FlowKind, FlowSample, build_flow, build_transforms
from worker.flows.transforms import (
    BoxTanh,
    ElementwiseAffine,
    HouseholderSylvester,
    Planar,
    Transform,
    solve_y_plus_a_tanh,
)

__all__ = [
    "BoxTanh",
    "ElementwiseAffine",
    "Flow",
    "FlowConfig",
    "FlowKind",
    "FlowSample",
    "GridComparison",
    "HouseholderSylvester",
    "ImportanceDiagnostics",
    "Planar",
    "Transform",
    "build_flow",
    "build_transforms",
    "grid_comparison",
    "grid_points",
    "importance_diagnostics",
    "solve_y_plus_a_tanh",
]
