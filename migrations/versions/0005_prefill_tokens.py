"""Prefill while the user types (issue 34): usage_events gains prefill_tokens.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04

A draft's prefill writes a usage row of route 'prefill' whose prompt tokens are in
prefill_tokens (its prompt_tokens and completion_tokens stay 0: no chat was answered). NULL on
every other row. usage_daily is 0004's view, dropped and made again around the change as 0004
does (SQLite's batch alter copies the table under it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0004's view, not a copy of it.
_analytics = importlib.import_module("migrations.versions.0004_usage_analytics")


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.add_column(sa.Column("prefill_tokens", sa.Integer(), nullable=True))
    _analytics._create_view(_analytics.COST_COLUMNS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.drop_column("prefill_tokens")
    _analytics._create_view(_analytics.COST_COLUMNS)
