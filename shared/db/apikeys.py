"""API keys: minted once, shown once, stored only as their SHA-256.

A plain (unsalted) SHA-256 is enough here: keys are 256 random bits, so there is nothing to
brute-force, and a fixed hash lets the gateway find a key with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import ApiKey, Tenant, utcnow
from shared.db.writes import insert_ignore

KEY_PREFIX = "ft-"
DISPLAY_PREFIX_LEN = 8

_TENANTS = cast(Table, Tenant.__table__)
_API_KEYS = cast(Table, ApiKey.__table__)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    tenant_id: str
    key_id: str
    scope: str
    revoked: bool
    # Limits (issue 6): None takes the gateway's default.
    rpm: int | None = None
    tpm: int | None = None
    max_streams: int | None = None
    tenant_rpm: int | None = None
    tenant_tpm: int | None = None


@dataclass(frozen=True, slots=True)
class KeyListing:
    """One key as `firsttoken keys list` shows it: never the key itself, nor its hash."""

    key_id: str
    tenant: str
    prefix: str
    scope: str
    rpm: int | None
    tpm: int | None
    max_streams: int | None
    created_at: datetime
    revoked_at: datetime | None


def generate_key() -> str:
    """A new API key: ``ft-`` and 43 URL-safe characters (32 random bytes)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key: lowercase SHA-256 hex of its UTF-8 bytes."""
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    """What a person sees to recognise a key (never enough to use it)."""
    return key[:DISPLAY_PREFIX_LEN]


async def create_tenant_and_key(
    session: AsyncSession,
    tenant_name: str,
    key: str | None = None,
    scope: str = "chat",
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    max_streams: int | None = None,
) -> tuple[str, str, str]:
    """Create the tenant if missing and a key for it; returns (tenant_id, key_id, key).

    With an explicit `key` that already exists, returns the existing ids and creates nothing,
    so start-up can call this for the configured dev key every time. Both inserts are
    INSERT ... ON CONFLICT DO NOTHING, so two processes starting at once do not collide.
    """
    await insert_ignore(
        session,
        _TENANTS,
        [{"id": uuid.uuid4().hex, "name": tenant_name, "created_at": utcnow()}],
        ["name"],
    )
    tenant_id = (
        await session.execute(select(Tenant.id).where(Tenant.name == tenant_name))
    ).scalar_one()
    key = key if key is not None else generate_key()
    key_hash = hash_key(key)
    row = {
        "id": uuid.uuid4().hex,
        "tenant_id": tenant_id,
        "key_hash": key_hash,
        "prefix": display_prefix(key),
        "scope": scope,
        "created_at": utcnow(),
        "rpm": rpm,
        "tpm": tpm,
        "max_streams": max_streams,
    }
    await insert_ignore(session, _API_KEYS, [row], ["key_hash"])
    key_tenant, key_id = (
        await session.execute(
            select(ApiKey.tenant_id, ApiKey.id).where(ApiKey.key_hash == key_hash)
        )
    ).one()
    return key_tenant, key_id, key


async def lookup_key(session: AsyncSession, key_hash: str) -> KeyInfo | None:
    """The key with this hash, revoked or not; None when no such key exists."""
    row = (
        await session.execute(
            select(
                ApiKey.tenant_id,
                ApiKey.id,
                ApiKey.scope,
                ApiKey.revoked_at,
                ApiKey.rpm,
                ApiKey.tpm,
                ApiKey.max_streams,
                Tenant.rpm.label("tenant_rpm"),
                Tenant.tpm.label("tenant_tpm"),
            )
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.key_hash == key_hash)
        )
    ).one_or_none()
    if row is None:
        return None
    return KeyInfo(
        tenant_id=row.tenant_id,
        key_id=row.id,
        scope=row.scope,
        revoked=row.revoked_at is not None,
        rpm=row.rpm,
        tpm=row.tpm,
        max_streams=row.max_streams,
        tenant_rpm=row.tenant_rpm,
        tenant_tpm=row.tenant_tpm,
    )


async def revoke_key(session: AsyncSession, key_id: str) -> bool:
    """Revoke a key; False when it does not exist or was already revoked (the first time stays)."""
    result = await session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .returning(ApiKey.id)
    )
    return result.first() is not None


async def set_tenant_limits(
    session: AsyncSession, tenant_name: str, *, rpm: int | None, tpm: int | None
) -> bool:
    """Set a tenant's limits (None leaves a value as it is); False when no such tenant."""
    values = {k: v for k, v in (("rpm", rpm), ("tpm", tpm)) if v is not None}
    if not values:
        return True
    result = await session.execute(
        update(Tenant).where(Tenant.name == tenant_name).values(**values).returning(Tenant.id)
    )
    return result.first() is not None


async def list_keys(session: AsyncSession, tenant_name: str | None = None) -> list[KeyListing]:
    """Every key (of one tenant, when named), oldest first."""
    query = (
        select(
            ApiKey.id,
            Tenant.name,
            ApiKey.prefix,
            ApiKey.scope,
            ApiKey.rpm,
            ApiKey.tpm,
            ApiKey.max_streams,
            ApiKey.created_at,
            ApiKey.revoked_at,
        )
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    if tenant_name is not None:
        query = query.where(Tenant.name == tenant_name)
    return [KeyListing(*row) for row in (await session.execute(query)).all()]


async def key_hash_of(session: AsyncSession, key_id: str) -> str | None:
    """The stored hash of a key id (to find its cached record in Redis), or None."""
    return (
        await session.execute(select(ApiKey.key_hash).where(ApiKey.id == key_id))
    ).scalar_one_or_none()


async def provision_key(database_url: str, tenant_name: str, key: str | None = None) -> str:
    """Create (or, for an existing `key`, find) a key of `tenant_name` in its own short
    session; returns the key. For `firsttoken up`'s dev key, benchmarks and tests."""
    from shared.db.session import one_off_session

    async with one_off_session(database_url) as session:
        _, _, created = await create_tenant_and_key(session, tenant_name, key=key)
    return created
