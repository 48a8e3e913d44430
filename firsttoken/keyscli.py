"""`firsttoken keys create|list|revoke`: API keys and their limits.

A key is printed once at creation and stored only as its hash. Revoking it updates the database,
overwrites the gateways' Redis copy, sets the marker the admission script checks on every chat,
and publishes an event every gateway listens to: it takes effect on all gateway processes at once,
open connections included, and within ``auth_cache_s`` (at most 1 s) even if the event is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.keys import Keys
from shared.settings import Settings, get_settings

if TYPE_CHECKING:
    from shared.db.apikeys import KeyListing

# The database and Redis clients are imported inside the commands: `firsttoken --help` and the
# other subcommands should not pay for them.

# How long the overwritten Redis record outlives a revocation: longer than any gateway caches a
# lookup, after which a miss reads the (revoked) row from the database again.
REVOKED_RECORD_TTL_S = 3600


@dataclass(frozen=True, slots=True)
class Created:
    tenant_id: str
    key_id: str
    key: str


async def create_key(
    settings: Settings,
    tenant: str,
    *,
    scope: str = "chat",
    rpm: int | None = None,
    tpm: int | None = None,
    max_streams: int | None = None,
    tenant_rpm: int | None = None,
    tenant_tpm: int | None = None,
) -> Created:
    """Create a key (and its tenant when new); returns the key, which is shown only now."""
    from shared.db.apikeys import create_tenant_and_key, set_tenant_limits
    from shared.db.session import one_off_session

    async with one_off_session(settings.database_url) as session:
        tenant_id, key_id, key = await create_tenant_and_key(
            session, tenant, scope=scope, rpm=rpm, tpm=tpm, max_streams=max_streams
        )
        await set_tenant_limits(session, tenant, rpm=tenant_rpm, tpm=tenant_tpm)
    return Created(tenant_id, key_id, key)


async def fetch_keys(settings: Settings, tenant: str | None = None) -> list[KeyListing]:
    from shared.db.apikeys import list_keys
    from shared.db.session import make_engine, make_sessionmaker

    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await list_keys(session, tenant)
    finally:
        await engine.dispose()


async def revoke(settings: Settings, key_id: str) -> bool:
    """Revoke a key everywhere; False when no such key exists or it was already revoked."""
    from shared.db.apikeys import key_hash_of, revoke_key
    from shared.db.session import make_engine, make_sessionmaker
    from shared.redis.client import redis_client

    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            key_hash = await key_hash_of(session, key_id)
            revoked = key_hash is not None and await revoke_key(session, key_id)
            await session.commit()
    finally:
        await engine.dispose()
    if key_hash is None:
        return False
    # Even an already-revoked key gets its Redis state re-asserted: that is harmless and
    # repairs a Redis that was flushed since.
    keys = Keys(settings.redis_prefix)
    client = redis_client(settings.redis_url, max_connections=1)
    try:
        async with client.pipeline(transaction=True) as pipe:
            pipe.set(keys.key_revoked(key_id), "1")
            pipe.set(
                keys.api_key(key_hash),
                json.dumps({"key_id": key_id, "revoked": True}),
                ex=REVOKED_RECORD_TTL_S,
            )
            pipe.publish(keys.key_events, f"revoked {key_hash} {key_id}")
            await pipe.execute()
    finally:
        await client.aclose()
    return revoked


def _limit(value: int | None) -> str:
    return "default" if value is None else ("none" if value == 0 else str(value))


def _cmd_create(args: argparse.Namespace) -> int:
    created = asyncio.run(
        create_key(
            get_settings(),
            args.tenant,
            scope=args.scope,
            rpm=args.rpm,
            tpm=args.tpm,
            max_streams=args.max_streams,
            tenant_rpm=args.tenant_rpm,
            tenant_tpm=args.tenant_tpm,
        )
    )
    print(f"tenant {args.tenant} ({created.tenant_id}), key id {created.key_id}")
    print(f"API key (shown once, store it now): {created.key}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    rows = asyncio.run(fetch_keys(get_settings(), args.tenant))
    print(f"{'key id':32}  {'tenant':20}  prefix    scope  rpm      tpm      streams  status")
    for r in rows:
        status = f"revoked {r.revoked_at:%Y-%m-%d %H:%M}" if r.revoked_at else "active"
        print(
            f"{r.key_id:32}  {r.tenant[:20]:20}  {r.prefix:8}  {r.scope:5}  {_limit(r.rpm):7}  "
            f"{_limit(r.tpm):7}  {_limit(r.max_streams):7}  {status}"
        )
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    settings = get_settings()
    if (args.key_id is None) == (args.tenant is None):
        print("error: give a key id or --tenant NAME (all its keys)", file=sys.stderr)
        return 2
    if args.key_id is not None:
        ids = [args.key_id]
    else:
        ids = [r.key_id for r in asyncio.run(fetch_keys(settings, args.tenant)) if not r.revoked_at]
    failed = 0
    for key_id in ids:
        if asyncio.run(revoke(settings, key_id)):
            print(f"key {key_id} revoked on every gateway")
        else:
            print(f"error: no active key with id {key_id}", file=sys.stderr)
            failed += 1
    return 1 if failed or not ids else 0


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (no limit) or more")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `keys create|list|revoke` to the `firsttoken` command."""
    keys = sub.add_parser("keys", help="Manage API keys.", description="Manage API keys.")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    p = keys_sub.add_parser(
        "create", help="Create an API key for a tenant (created if new); the key is printed once."
    )
    p.add_argument("--tenant", required=True, help="tenant name")
    p.add_argument("--scope", default="chat", choices=["chat", "admin"], help="key scope")
    limit_help = "{} for this key (0: no limit; default FIRSTTOKEN_{})"
    p.add_argument(
        "--rpm", type=_non_negative, help=limit_help.format("requests/min", "KEY_RPM_DEFAULT")
    )
    p.add_argument(
        "--tpm", type=_non_negative, help=limit_help.format("tokens/min", "KEY_TPM_DEFAULT")
    )
    p.add_argument(
        "--max-streams",
        type=_non_negative,
        help=limit_help.format("concurrent chats", "KEY_MAX_STREAMS_DEFAULT"),
    )
    p.add_argument(
        "--tenant-rpm", type=_non_negative, help="requests/min over all the tenant's keys"
    )
    p.add_argument("--tenant-tpm", type=_non_negative, help="tokens/min over all the tenant's keys")
    p.set_defaults(fn=_cmd_create)

    p = keys_sub.add_parser("list", help="List keys (never the keys themselves).")
    p.add_argument("--tenant", default=None, help="only this tenant's keys")
    p.set_defaults(fn=_cmd_list)

    p = keys_sub.add_parser(
        "revoke", help="Revoke a key on every gateway within a second, open connections included."
    )
    p.add_argument("key_id", nargs="?", help="the key id `keys create` or `keys list` printed")
    p.add_argument("--tenant", default=None, help="revoke every active key of this tenant")
    p.set_defaults(fn=_cmd_revoke)
