"""jobs: resolved_request, the request with its plan's defaults written out

Admission stores, beside the request as the analyst sent it (served, digested for
Idempotency-Key replays), the request with every default its plan filled in made explicit
(service.plans.resolve_defaults). The worker's plan check re-plans that one, so a default
rule changed by an upgrade between admission and run no longer fails a queued job.
Existing jobs: NULL (the worker re-plans their request as sent, as before).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("resolved_request", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN (SQLite >= 3.35): a batch copy of the table would drop
    # `jobs`, which releases and ledger entries reference (foreign keys are on).
    op.drop_column("jobs", "resolved_request")
