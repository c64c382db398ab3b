"""Geometry of the per-dataset chart of cumulative ε spent over time, drawn on the server
as SVG (templates/chart.html renders it; no script, no library).

x is the entry's time, y the dataset's valid ε spent after it (see
:func:`service.ledger.accounting.spending_over_time`); the line steps at each charge or
refund; every charge, refund and release is one marker; the budget ε_total is a dashed line.
By default the y axis runs to the budget (or past it); zoomed (the page's ``?scale=spent``)
it runs to the largest ε spent × 1.1, so a small spend of a large budget is not a flat line,
and the budget line is drawn only if it falls inside.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.dashboard.views import timestamp
from service.ledger.accounting import SpendingPoint

WIDTH, HEIGHT = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 40


@dataclass(frozen=True)
class Marker:
    x: float
    y: float
    kind: str
    label: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    line: str
    markers: list[Marker]
    budget_y: float
    budget_shown: bool
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int


def build_chart(
    points: list[SpendingPoint], *, epsilon_total: float, zoom_to_spent: bool = False
) -> Chart:
    """Scale ``points`` into the SVG's box; the y range shows the budget, or (zoomed) runs
    to the largest finite ε spent × 1.1 (the budget's range while nothing is spent)."""
    x0, x1 = LEFT, WIDTH - RIGHT
    y0, y1 = HEIGHT - BOTTOM, TOP
    finite = [p.epsilon_spent for p in points if p.epsilon_spent != float("inf")]
    spent_max = max(finite, default=0.0)
    if zoom_to_spent and spent_max > 0:
        y_max = spent_max * 1.1
    else:
        y_max = max([epsilon_total, *finite]) * 1.05 or 1.0
    times = [p.at.timestamp() for p in points]
    t0, t1 = (min(times), max(times)) if times else (0.0, 0.0)

    def sx(i: int) -> float:
        if t1 > t0:
            return round(x0 + (times[i] - t0) / (t1 - t0) * (x1 - x0), 2)
        # All at one instant (or a single point): spread them in ledger order.
        return round(x0 + (i + 0.5) / len(points) * (x1 - x0), 2)

    def sy(v: float) -> float:
        return round(y0 - min(v, y_max) / y_max * (y0 - y1), 2)

    markers = []
    prev_y = sy(0)
    line = [f"{x0},{prev_y}"]
    for i, p in enumerate(points):
        x, y = sx(i), sy(p.epsilon_spent)
        line += [f"{x},{prev_y}", f"{x},{y}"]  # a step: spending changes at the entry
        prev_y = y
        job = f" of job {p.job_id[:8]}" if p.job_id else " (noisy row count)"
        label = f"{p.kind.value}{job} at {timestamp(p.at)}: ε spent {p.epsilon_spent:.4g}"
        markers.append(Marker(x=x, y=y, kind=p.kind.value, label=label))
    y_ticks = [Tick(sy(y_max * k / 4), f"{y_max * k / 4:.3g}") for k in range(5)]
    x_ticks = []
    if points:
        x_ticks = [Tick(sx(0), timestamp(points[0].at))]
        if len(points) > 1:
            x_ticks.append(Tick(sx(len(points) - 1), timestamp(points[-1].at)))
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        line=" ".join(line),
        markers=markers,
        budget_y=sy(epsilon_total),
        budget_shown=epsilon_total <= y_max,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        plot_left=x0,
        plot_right=x1,
        plot_top=y1,
        plot_bottom=y0,
    )
