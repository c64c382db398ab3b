"""datasets.count_epsilon_micro: the ε of the DP noisy row count released at registration

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 14:00:00

NULL marks a dataset registered before noisy counts: its published row count is exact.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("count_epsilon_micro", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("count_epsilon_micro")
