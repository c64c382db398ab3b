"""jobs: the run's facts for the admin (issue 26): stage_reached, data_read, failure_category

The worker records how far a job got, whether it read the private rows (a system fact,
set with data_touched before the first read) and a failure category from the error's
type. Only the admin's views show them. Existing jobs: data_read is data_touched (recorded
at the same point); a queued, cancelled (only while queued) or released job's stage is
known; the others' stage and every failure category stay NULL (not recorded).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("stage_reached", sa.String(16), nullable=True))
        batch.add_column(sa.Column("data_read", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("failure_category", sa.String(16), nullable=True))
    jobs = sa.table(
        "jobs",
        sa.column("status", sa.String),
        sa.column("data_touched", sa.Boolean),
        sa.column("data_read", sa.Boolean),
        sa.column("stage_reached", sa.String),
    )
    op.execute(jobs.update().values(data_read=jobs.c.data_touched))
    op.execute(
        jobs.update()
        .where(jobs.c.status.in_(["queued", "cancelled"]))
        .values(stage_reached="queued")
    )
    op.execute(jobs.update().where(jobs.c.status == "released").values(stage_reached="released"))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN on both (SQLite >= 3.35): a batch copy of the table would
    # drop `jobs`, which releases and ledger entries reference (foreign keys are on).
    for column in ("failure_category", "data_read", "stage_reached"):
        op.drop_column("jobs", column)
