"""jobs.release_at: the public release time's first grid point (the release hold)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 01:30:00

Set by the worker at its claim when ENCLAVE_RELEASE_HOLD is on: started_at + D, D from
the plan's public time estimate (service/release_hold.py). NULL: no hold (the setting
off, or a job claimed before the column): the analyst's view then shows the run's own
progress, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("release_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN (SQLite >= 3.35), as 0010: a batch copy of the table would
    # drop `jobs`, which other tables reference (foreign keys are on).
    op.drop_column("jobs", "release_at")
