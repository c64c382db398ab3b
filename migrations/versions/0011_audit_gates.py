"""audit_gates and job_audits: the release gate (issue 22, point 2)

``audit_gates``: one row per dataset whose gate is on (the maximum audit age in days);
no row, the gate is off. ``job_audits``: the audit that let a gated job through, named
on its card. Two new tables; nothing existing changes (service/audit_gate.py).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 23:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_gates",
        sa.Column("dataset_id", sa.Integer(), sa.ForeignKey("datasets.id"), primary_key=True),
        sa.Column("max_age_days", sa.Float(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "job_audits",
        sa.Column("job_id", sa.String(36), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("audit_id", sa.String(36), sa.ForeignKey("audits.id"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_audits")
    op.drop_table("audit_gates")
