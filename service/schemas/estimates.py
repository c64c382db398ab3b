"""What a plan is expected to cost the worker, as a quote shows it (issue 21, point 4)."""

from __future__ import annotations

from pydantic import BaseModel, Field

ESTIMATE_NOTE = (
    "A ceiling computed from the plan and the dataset's public schema alone (never from "
    "its rows), set for a busy 2-core CPU worker: measured runs took from 2x longer to 81x "
    "less than it, by method and machine load (README, the quote's estimate; "
    "benchmarks/results/job_estimates.md). Plans over the worker's limits are refused "
    "with the same estimate."
)


class ResourceQuote(BaseModel):
    """The quote-time estimate of a plan's worker time and peak memory (each null where
    the method has none)."""

    seconds: float | None = Field(
        description="Estimated worker time of the whole job, seconds (a ceiling)."
    )
    memory_bytes: int | None = Field(description="Estimated peak worker memory, bytes.")
    note: str = Field(default=ESTIMATE_NOTE, description="How the estimate is made.")
