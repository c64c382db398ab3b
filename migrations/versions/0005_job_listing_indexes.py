"""jobs: indexes for keyset paging of job listings, newest first

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 10:00:00

GET /v1/jobs (one analyst's jobs) and GET /v1/admin/jobs page by (created_at, id)
descending (service/job_pages.py); these indexes serve both orders and the cursor's range.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_created_at_id", "jobs", ["created_at", "id"])
    op.create_index("ix_jobs_analyst_created_at_id", "jobs", ["analyst_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_analyst_created_at_id", table_name="jobs")
    op.drop_index("ix_jobs_created_at_id", table_name="jobs")
