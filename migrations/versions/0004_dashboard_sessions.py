"""dashboard_sessions: server-side admin sessions for the dashboard

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 18:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("analyst_id", sa.Integer(), sa.ForeignKey("analysts.id"), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_dashboard_sessions_analyst_id", "dashboard_sessions", ["analyst_id"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_analyst_id", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
