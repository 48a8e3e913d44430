"""Usage for analysts (issue 32): usage_events gains cost, end_user, tags, conversation_id,
cache_tier, cached_prompt_tokens; usage_daily gains cost.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

Every new column is nullable: rows written before this revision (and by workers not yet
upgraded) do not know them, and NULL says so; a 0 cost or 0 cached tokens would be a claim.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As in 0001: days are UTC on both databases.
DAY_SQL = {
    "postgresql": "date_trunc('day', created_at AT TIME ZONE 'UTC')::date",
    "sqlite": "date(created_at)",
}

# 0001's view plus the day's cost. SUM skips NULLs, so `cost` is the cost of the priced
# requests; `unpriced_requests` says how many the sum leaves out.
USAGE_DAILY_SQL = """
CREATE VIEW usage_daily AS
SELECT
    {day} AS day,
    tenant_id,
    model,
    COUNT(*) AS requests,
    SUM(CASE WHEN cached THEN 1 ELSE 0 END) AS cached_requests,
    SUM(prompt_tokens) AS prompt_tokens,
    SUM(completion_tokens) AS completion_tokens,
    AVG(ttft_ms) AS avg_ttft_ms,
    AVG(total_ms) AS avg_total_ms,
    SUM(CASE WHEN status IN ('error', 'timeout') THEN 1 ELSE 0 END) AS errors{extra}
FROM usage_events
GROUP BY {day}, tenant_id, model
"""
COST_COLUMNS = """,
    SUM(cost) AS cost,
    SUM(CASE WHEN cost IS NULL THEN 1 ELSE 0 END) AS unpriced_requests"""


def _create_view(extra: str) -> None:
    day = DAY_SQL[op.get_bind().dialect.name]
    op.execute(USAGE_DAILY_SQL.format(day=day, extra=extra))


def upgrade() -> None:
    # The view reads usage_events: dropped first, so no dialect has to alter a table under it.
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.add_column(sa.Column("cost", sa.Float(), nullable=True))
        batch.add_column(sa.Column("end_user", sa.String(256), nullable=True))
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("conversation_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("cache_tier", sa.String(16), nullable=True))
        batch.add_column(sa.Column("cached_prompt_tokens", sa.Integer(), nullable=True))
    _create_view(COST_COLUMNS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.drop_column("cached_prompt_tokens")
        batch.drop_column("cache_tier")
        batch.drop_column("conversation_id")
        batch.drop_column("tags")
        batch.drop_column("end_user")
        batch.drop_column("cost")
    _create_view("")
