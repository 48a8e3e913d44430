"""`firsttoken kb add|list|remove|reembed --tenant T`: the per-tenant knowledge base.

``kb add`` reads and checks every file first (text or Markdown, UTF-8, not empty), then chunks
and embeds them with the cache's embedder, then writes all of them in one transaction: an
unreadable or binary file among them fails the invocation with nothing written.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from shared.errors import FirstTokenError, InvalidRequest
from shared.settings import Settings, get_settings


async def _tenant_id(session: Any, tenant: str) -> str:
    from sqlalchemy import or_, select

    from shared.db.models import Tenant

    found = await session.scalar(
        select(Tenant.id).where(or_(Tenant.name == tenant, Tenant.id == tenant))
    )
    if found is None:
        raise InvalidRequest(f"no tenant named {tenant!r}; create it with `firsttoken keys create`")
    return str(found)


async def announce(settings: Settings, tenant_id: str) -> None:
    """Tell the chat workers that `tenant_id`'s documents changed (`Keys.tenant_changed_channel`),
    so its next question reads them; with Redis unreachable they notice within seconds anyway
    (workers/retrieval/sources.py TENANT_CACHE_S), so this only warns."""
    from shared.keys import Keys
    from shared.redis.client import redis_client

    redis = redis_client(settings.redis_url)
    try:
        await redis.publish(Keys(settings.redis_prefix).tenant_changed_channel, tenant_id)
    except Exception as exc:  # noqa: BLE001 - the documents are stored; only the notice is late
        print(
            f"note: could not tell the workers at once ({exc}); they use the change within seconds",
            file=sys.stderr,
        )
    finally:
        await redis.aclose()


async def add_files(settings: Settings, tenant: str, paths: list[Path]) -> list[Any]:
    """Ingest ``paths`` for ``tenant``, all or nothing; returns one `Added` per file."""
    from shared.db.session import make_engine, make_sessionmaker
    from workers.embeddings.factory import make_embedder
    from workers.kb.chunking import chunk_text
    from workers.kb.files import read_file
    from workers.kb.store import add_document

    files = [read_file(p) for p in paths]  # every check before any write
    size = settings.kb_chunk_chars
    chunked = [chunk_text(f.text, markdown=f.markdown, max_chars=size) for f in files]
    for f, chunks in zip(files, chunked, strict=True):
        if not chunks:
            raise InvalidRequest(f"{f.name}: no text to index; nothing was added")
    embedder = make_embedder(settings)
    try:
        vectors = [embedder.embed(chunks) for chunks in chunked]
        name = embedder.name
    finally:
        embedder.close()
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            tenant_id = await _tenant_id(session, tenant)
            added = [
                await add_document(session, tenant_id, f, chunks, v, name)
                for f, chunks, v in zip(files, chunked, vectors, strict=True)
            ]
    finally:
        await engine.dispose()
    await announce(settings, tenant_id)  # committed: the workers may read it now
    return added


async def list_docs(settings: Settings, tenant: str) -> list[Any]:
    from shared.db.session import make_engine, make_sessionmaker
    from workers.kb.store import list_documents

    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await list_documents(session, await _tenant_id(session, tenant))
    finally:
        await engine.dispose()


async def remove_docs(settings: Settings, tenant: str, ids: list[str]) -> int:
    from shared.db.session import make_engine, make_sessionmaker
    from workers.kb.store import remove_documents

    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            tenant_id = await _tenant_id(session, tenant)
            removed = await remove_documents(session, tenant_id, ids)
    finally:
        await engine.dispose()
    if removed:
        await announce(settings, tenant_id)
    return removed


async def reembed(settings: Settings, tenant: str) -> tuple[int, str]:
    """Embed again, with the configured embedder, every chunk of ``tenant`` stored by another
    model (after a change of FIRSTTOKEN_EMBED_LOCAL_MODEL or an upgrade), in one transaction;
    returns (chunks re-embedded, the model's name)."""
    from shared.db.session import make_engine, make_sessionmaker
    from workers.embeddings.factory import make_embedder
    from workers.kb.store import replace_embeddings, stale_chunks

    embedder = make_embedder(settings)
    engine = make_engine(settings.database_url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            tenant_id = await _tenant_id(session, tenant)
            chunks = await stale_chunks(session, tenant_id, embedder.name)
            if chunks:
                vectors = embedder.embed([c.text for c in chunks])
                await replace_embeddings(session, chunks, vectors, embedder.name)
    finally:
        embedder.close()
        await engine.dispose()
    if chunks:
        await announce(settings, tenant_id)
    return len(chunks), embedder.name


def _run(args: argparse.Namespace) -> int:
    settings = get_settings()
    try:
        if args.kb_cmd == "add":
            for added in asyncio.run(add_files(settings, args.tenant, args.paths)):
                state = "already present" if added.existed else f"{added.chunks} chunks"
                print(f"{added.document_id}  {added.name}  ({state})")
        elif args.kb_cmd == "list":
            docs = asyncio.run(list_docs(settings, args.tenant))
            for d in docs:
                when = f"{d.created_at:%Y-%m-%d %H:%M}"
                print(f"{d.id}  {d.name}  {d.chunks} chunks  {d.chars} chars  {when}")
            if not docs:
                print("no documents")
        elif args.kb_cmd == "reembed":
            count, model = asyncio.run(reembed(settings, args.tenant))
            if count:
                print(f"re-embedded {count} chunk(s) with {model}; workers use them from now on")
            else:
                print(f"nothing to do: every chunk is embedded with {model}")
        else:
            n = asyncio.run(remove_docs(settings, args.tenant, args.ids))
            if n == 0:
                print(f"error: no document {', '.join(args.ids)} for this tenant", file=sys.stderr)
                return 1
            print(f"removed {n} document(s)")
    except FirstTokenError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    """Register `kb` on the `firsttoken` command's subparsers."""
    kb = sub.add_parser(
        "kb", help="knowledge base: add, list, remove, re-embed documents of a tenant"
    )
    kb_sub = kb.add_subparsers(dest="kb_cmd", required=True)
    add = kb_sub.add_parser("add", help="ingest text/Markdown files (all or nothing)")
    add.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    lst = kb_sub.add_parser("list", help="the tenant's documents")
    rm = kb_sub.add_parser("remove", help="remove documents by id or name")
    rm.add_argument("ids", nargs="+", metavar="ID")
    again = kb_sub.add_parser(
        "reembed",
        help="embed again the chunks stored by another embedding model (after a change of "
        "FIRSTTOKEN_EMBED_LOCAL_MODEL or an upgrade): retrieval sees only the current model's",
    )
    for p in (add, lst, rm, again):
        p.add_argument("--tenant", required=True, help="tenant name or id")
        p.set_defaults(fn=_run)
