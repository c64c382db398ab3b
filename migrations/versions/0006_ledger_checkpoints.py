"""ledger_checkpoints: verified points of each dataset's hash chain (issue 26)

The dashboard verifies only the entries after a dataset's latest checkpoint; the
admin API and CLI still walk every entry.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ledger_checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("dataset_id", sa.Integer(), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("entry_id", sa.BigInteger(), nullable=False),
        sa.Column("entry_hash", sa.String(64), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.Column("spent_epsilon_micro", sa.BigInteger(), nullable=False),
        sa.Column("spent_rdp_micro", sa.JSON(), nullable=False),
        sa.Column("analyst_totals", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        # One checkpoint per (dataset, entry): two verifications racing to write the same
        # one leave one row (the second insert is ignored). Also the index of "the
        # dataset's latest checkpoint".
        sa.UniqueConstraint("dataset_id", "entry_id", name="uq_ledger_checkpoints_entry"),
    )


def downgrade() -> None:
    op.drop_table("ledger_checkpoints")
