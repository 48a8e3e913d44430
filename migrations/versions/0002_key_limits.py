"""Per-key and per-tenant rate limits: rpm, tpm on tenants; rpm, tpm, max_streams on api_keys.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Nullable on purpose: NULL means "the gateway's configured default", so existing keys follow the
defaults an operator sets without a data migration.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER most things in place; on PostgreSQL it is a plain ALTER.
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("rpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("rpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_streams", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("max_streams")
        batch.drop_column("tpm")
        batch.drop_column("rpm")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("tpm")
        batch.drop_column("rpm")
