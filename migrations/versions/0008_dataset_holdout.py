"""datasets: holdout_rows, the public size of a private evaluation holdout (issue 21)

A tabular dataset may be registered with a holdout (``enclave datasets register
--holdout-fraction F``): n_h = floor(F·n̂) of the kept rows, n̂ the DP noisy row count,
are stored apart from the training rows and read only by evaluation jobs. ``n_rows`` is
then n̂ − n_h (the training rows' public count, what plans use) and ``holdout_rows`` is
n_h. Existing datasets have no holdout: NULL.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("holdout_rows", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE … DROP COLUMN (SQLite >= 3.35): a batch copy of the table would drop
    # `datasets`, which jobs and ledger entries reference (foreign keys are on).
    op.drop_column("datasets", "holdout_rows")
