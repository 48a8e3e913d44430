"""The door a chat came in by (issue 44): usage_events gains door.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07

websocket, openai (Chat Completions) or responses (the Responses API); NULL on older rows and on
a draft's prefill. usage_daily is 0004's view, dropped and made again around the change as 0005
does (SQLite's batch alter copies the table under it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0004's view, not a copy of it.
_analytics = importlib.import_module("migrations.versions.0004_usage_analytics")


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.add_column(sa.Column("door", sa.String(16), nullable=True))
    _analytics._create_view(_analytics.COST_COLUMNS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS usage_daily")
    with op.batch_alter_table("usage_events") as batch:
        batch.drop_column("door")
