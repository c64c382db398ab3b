"""audits: the admin's privacy audits (issue 22), one row each

A one-run audit (Steinke, Nasr & Jagielski 2023) of a configuration on a public dataset
bundled with the product: the request as validated, the service's plan figures, the
ceiling of the test, the status and, when done, the bound and the run's public figures.
Not a ledger entry: nothing here is charged to any budget. A new table; nothing existing
changes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 22:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audits",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_by", sa.Integer(), sa.ForeignKey("analysts.id"), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("planned", sa.JSON(), nullable=False),
        sa.Column("ceiling", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("failure", sa.String(200), nullable=True),
    )
    op.create_index("ix_audits_created", "audits", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_audits_created", table_name="audits")
    op.drop_table("audits")
