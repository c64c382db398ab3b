"""analysts.key_expires_at, analysts.key_revoked_at: API key expiry and revocation

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 15:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("analysts") as batch:
        batch.add_column(sa.Column("key_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("key_revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("analysts") as batch:
        batch.drop_column("key_revoked_at")
        batch.drop_column("key_expires_at")
