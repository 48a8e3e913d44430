"""The relational schema, as SQLAlchemy 2 typed declarative models.

Alembic (``migrations/``) is the only way this schema reaches a database; these models are what
the code queries with, and a test checks the migrated schema matches them.

``usage_events`` and ``messages`` carry ``tenant_id`` without a foreign key on purpose: they are
append-only event logs written by retried background tasks, and a row must never be refused
(and retried forever) because its tenant was renamed, deleted or not yet replicated.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names: migrations and batch mode on SQLite need them to alter tables.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LEN = 64  # uuid4 hex is 32; room for ids minted elsewhere (e.g. "chat-..." request ids)


def utcnow() -> datetime:
    return datetime.now(UTC)


NUL = "\x00"
NUL_REPLACEMENT = "\ufffd"


def storable_text(value: str) -> str:
    """`value` with every U+0000 replaced by U+FFFD (the replacement character).

    PostgreSQL's text type cannot hold NUL (the insert fails, so a conversation turn whose
    prompt or answer had one was lost and the next turn found no conversation). Dropping the
    character would join the words around it and change the text's length; U+FFFD keeps a
    visible mark of "a character was here that could not be kept", and the rest of the turn is
    stored as sent. SQLite could store NUL, but both databases get the same rule so history
    reads back the same on either.
    """
    return value.replace(NUL, NUL_REPLACEMENT) if NUL in value else value


class StoredText(TypeDecorator[str]):
    """Text written by clients or engines (messages, summaries, documents): NUL-free on the way
    in (:func:`storable_text`), plain TEXT in the schema."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return storable_text(value) if isinstance(value, str) else value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Limits over all the tenant's keys; NULL takes the gateway's default (issue 6).
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)


class ApiKey(Base):
    """An API key, stored only as its SHA-256; `prefix` lets a person recognise it."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(8))
    scope: Mapped[str] = mapped_column(String(32), default="chat", server_default="chat")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Limits of this key; NULL takes the gateway's default, 0 means none (issue 6).
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    max_streams: Mapped[int | None] = mapped_column(Integer)


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_tenant_updated", "tenant_id", "updated_at"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(ID_LEN))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    summary: Mapped[str | None] = mapped_column(StoredText)
    # The summary covers this conversation's messages with id <= summary_upto (issue 5).
    summary_upto: Mapped[int | None] = mapped_column(Integer)


class MessageRow(Base):
    """One message of one turn; (request_id, position) makes rewriting a turn a no-op."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("request_id", "position", name="uq_messages_request_position"),
        Index("ix_messages_tenant_created", "tenant_id", "created_at"),
        Index("ix_messages_conversation_created", "conversation_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(ID_LEN))
    position: Mapped[int] = mapped_column(Integer)
    conversation_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    tenant_id: Mapped[str] = mapped_column(String(ID_LEN))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(StoredText)
    model: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UsageEvent(Base):
    """One row per request (request_id is unique): what analysts bill and chart from."""

    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_events_tenant_created", "tenant_id", "created_at"),
        Index("ix_usage_events_created", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(ID_LEN), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(ID_LEN))
    key_id: Mapped[str] = mapped_column(String(ID_LEN))
    model: Mapped[str] = mapped_column(String(128))
    route: Mapped[str] = mapped_column(String(64))
    cached: Mapped[bool] = mapped_column(Boolean)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    queue_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    total_ms: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Issue 32 (migration 0004); NULL where unknown, never a made-up 0.
    cost: Mapped[float | None] = mapped_column(Float)  # model table prices; NULL: unpriced
    end_user: Mapped[str | None] = mapped_column(String(256))  # the frame's `user`
    tags: Mapped[Any | None] = mapped_column(JSON)  # the frame's `tags`: object or array
    conversation_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    cache_tier: Mapped[str | None] = mapped_column(String(16))  # exact|semantic|miss|off
    cached_prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    # Issue 34 (migration 0005): a draft's prefill row (route 'prefill'); NULL on the others.
    prefill_tokens: Mapped[int | None] = mapped_column(Integer)
    door: Mapped[str | None] = mapped_column(String(16))  # websocket | openai | responses


# --- prompts and knowledge base (issue 5) ------------------------------------------------------


class TenantPrompt(Base):
    """A tenant's prompt template and routing policy; NULL fields take the configured default."""

    __tablename__ = "tenant_prompts"

    tenant_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str | None] = mapped_column(Text)
    constraints: Mapped[str | None] = mapped_column(Text)  # JSON list of strings
    output_format: Mapped[str | None] = mapped_column(Text)
    route_policy: Mapped[str | None] = mapped_column(String(8))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class KbDocument(Base):
    """One ingested file; the same content twice for a tenant is one document."""

    __tablename__ = "kb_documents"
    __table_args__ = (UniqueConstraint("tenant_id", "sha256", name="uq_kb_documents_tenant_sha"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(ID_LEN), index=True)
    name: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    chars: Mapped[int] = mapped_column(Integer)
    chunks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class KbChunk(Base):
    """A chunk of a document with its embedding (float32 bytes of ``embed_model``'s vector)."""

    __tablename__ = "kb_chunks"
    __table_args__ = (Index("ix_kb_chunks_tenant_id_id", "tenant_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    document_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("kb_documents.id", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(ID_LEN))
    position: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(StoredText)
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
    embed_model: Mapped[str] = mapped_column(String(128))
