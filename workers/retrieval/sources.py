"""The retrieval sources: what a chat's prompt is built from, each read under its own deadline.

Each source is a :class:`workers.retrieval.gather.Source` (that module is the pure gather
logic: deadlines, results, the summary; this module is the I/O behind it:
database, Redis, embedder):

- ``user``: the tenant's prompt template row (``tenant_prompts``);
- ``conversation``: the conversation's summary and unsummarised messages; it also checks that
  the conversation exists and belongs to the chat's tenant (the gateway does not read the
  database on the hot path, and this query is one the worker makes anyway);
- ``kb``: the question's embedding (the cache's embedder) against the tenant's chunks;
- ``quota``: the tenant's tokens used in the current minute (advisory: reported, never blocks;
  the gateway's admission already enforces the limit). It runs in the background (see
  ``workers.retrieval.assembly.BACKGROUND_SOURCES``): the prompt does not wait for its Redis
  round trip, and `done` reports it;
- ``probe``: a sleep standing in for a slow dependency (``FIRSTTOKEN_RETRIEVAL_PROBE_MS``).

A late or failing source is skipped and reported in the `done` frame's ``retrieval``.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import select

from shared.db.models import Conversation, MessageRow, TenantPrompt
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.conversation import StoredMessage
from workers.db import Database
from workers.embeddings.base import Embedder
from workers.kb.index import KbIndexes
from workers.kb.store import kb_version, load_chunks
from workers.prompt import ContextChunk
from workers.refreshing import RefreshingCache
from workers.resources import WorkerContext
from workers.retrieval.gather import Query, Source

# Tenant-level rows (prompt overrides, the knowledge base's version) change rarely but would
# cost a database round trip on every chat: each worker process trusts them for
# FIRSTTOKEN_TENANT_CACHE_S (this default until a chat worker's start sets it), unless a change
# is announced on the tenant channel (`firsttoken kb add`: forget_tenant).
TENANT_CACHE_S = 5.0
_tenant_cache: RefreshingCache[tuple[str, str], Any] = RefreshingCache(TENANT_CACHE_S)


async def _per_tenant(kind: str, tenant_id: str, load: Any) -> Any:
    """`await load()`, remembered per (kind, tenant); see workers/refreshing.py."""
    return await _tenant_cache.get((kind, tenant_id), load)


def _per_tenant_held(kind: str, tenant_id: str, load: Any) -> tuple[Any] | None:
    """What :func:`_per_tenant` would return, if it is held (no waiting)."""
    return _tenant_cache.held((kind, tenant_id), load)


@dataclass(frozen=True, slots=True)
class ConversationState:
    found: bool
    summary: str | None = None
    summary_upto: int | None = None
    messages: tuple[StoredMessage, ...] = ()


class UserSource:
    name = "user"

    def __init__(self, db: Database, deadline_s: float) -> None:
        self.db = db
        self.deadline_s = deadline_s

    async def fetch(self, query: Query) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await _per_tenant(
            "prompt", query.tenant_id, lambda: self._load(query)
        )
        return result

    def cached(self, query: Query) -> tuple[dict[str, Any] | None] | None:
        return _per_tenant_held("prompt", query.tenant_id, lambda: self._load(query))

    async def _load(self, query: Query) -> dict[str, Any] | None:
        async with self.db.sessionmaker()() as session:
            row = await session.get(TenantPrompt, query.tenant_id)
        if row is None:
            return None
        data: dict[str, Any] = {
            "role": row.role,
            "output_format": row.output_format,
            "route_policy": row.route_policy,
        }
        if row.constraints:
            data["constraints"] = json.loads(row.constraints)
        return {k: v for k, v in data.items() if v is not None}


class ConversationSource:
    name = "conversation"

    def __init__(self, db: Database, deadline_s: float, new: bool) -> None:
        self.db = db
        self.deadline_s = deadline_s
        self.new = new

    def cached(self, query: Query) -> tuple[ConversationState | None] | None:
        """A new conversation (or none) needs no query."""
        if query.conversation_id is None:
            return (None,)
        if self.new:
            return (ConversationState(found=True),)
        return None

    async def fetch(self, query: Query) -> ConversationState | None:
        hit = self.cached(query)
        if hit is not None:
            return hit[0]
        async with self.db.sessionmaker()() as session:
            conv = await session.get(Conversation, query.conversation_id)
            # Another tenant's conversation reads as unknown: its existence is not disclosed.
            if conv is None or conv.tenant_id != query.tenant_id:
                return ConversationState(found=False)
            stmt = select(MessageRow.id, MessageRow.role, MessageRow.content).where(
                MessageRow.conversation_id == query.conversation_id
            )
            if conv.summary_upto is not None:
                stmt = stmt.where(MessageRow.id > conv.summary_upto)
            rows = await session.execute(stmt.order_by(MessageRow.id))
            messages = tuple(StoredMessage(int(r[0]), str(r[1]), str(r[2])) for r in rows)
        return ConversationState(True, conv.summary, conv.summary_upto, messages)


def _kb_version_loader(db: Database, query: Query) -> Any:
    async def load_version() -> Any:
        async with db.sessionmaker()() as session:
            return await kb_version(session, query.tenant_id)

    return load_version


class KbSource:
    name = "kb"

    def __init__(self, deadline_s: float, kb: KbState, top_k: int, min_score: float) -> None:
        self.deadline_s = deadline_s
        self.kb = kb
        self.top_k = top_k
        self.min_score = min_score

    def cached(self, query: Query) -> tuple[list[ContextChunk]] | None:
        """No knowledge base (off, or the tenant's known to be empty): nothing to embed."""
        if self.top_k == 0:
            return ([],)
        version = _per_tenant_held("kb_version", query.tenant_id, self._version_loader(query))
        if version is not None and version[0][0] == 0:
            return ([],)
        return None

    def _version_loader(self, query: Query) -> Any:
        return _kb_version_loader(self.kb.db, query)

    async def fetch(self, query: Query) -> list[ContextChunk]:
        if self.top_k == 0:
            return []
        loop = asyncio.get_running_loop()
        version = await _per_tenant("kb_version", query.tenant_id, self._version_loader(query))
        if version[0] == 0:
            return []  # no knowledge base: no embedding, no model load
        # Loaded on the embedding thread: the first load is slow and must not stall the loop
        # that streams other chats (this chat skips the kb if it is late).
        embedder = await loop.run_in_executor(self.kb.executor, self.kb.embedder)
        if self.kb.indexes.version(query.tenant_id) != version:
            # Shielded: a chat whose deadline passes leaves the load running, and the next
            # chat waits for it rather than starting it again (issue 42).
            await asyncio.shield(self.kb.load(query.tenant_id, version, embedder.name))
        vectors = await loop.run_in_executor(self.kb.executor, embedder.embed, [query.question])
        hits = self.kb.indexes.search(query.tenant_id, vectors[0], self.top_k, self.min_score)
        return [ContextChunk(f"kb:{h.chunk_id}", h.text, h.score) for h in hits]


class QuotaSource:
    name = "quota"

    def __init__(self, deadline_s: float, ctx: WorkerContext) -> None:
        self.deadline_s = deadline_s
        self.ctx = ctx

    async def fetch(self, query: Query) -> dict[str, int]:
        key = self.ctx.keys.rate_tokens("tenant", query.tenant_id)
        # On the pipe: no pooled connection of its own, no write of its own.
        used = await self.ctx.pipe.call("HGET", key, "=sum")
        return {"used": int(float(str(used or 0))), "limit": self.ctx.settings.tenant_tpm_default}


class ProbeSource:
    """Sleeps; stands in for a slow dependency in fault drills, tests and benchmarks."""

    name = "probe"

    def __init__(self, deadline_s: float, sleep_s: float) -> None:
        self.deadline_s = deadline_s
        self.sleep_s = sleep_s

    async def fetch(self, query: Query) -> None:
        await asyncio.sleep(self.sleep_s)


@dataclass
class KbState:
    """The process's knowledge-base embedder (one thread, like the cache's) and indexes."""

    settings: Settings
    db: Database
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kb-embed")
    )
    _embedder: Embedder | None = None
    _indexes: KbIndexes | None = None
    # One load of a tenant's index at a time (tenant -> its load in progress).
    _loading: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def embedder(self) -> Embedder:
        if self._embedder is None:
            from workers.embeddings.factory import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    @property
    def indexes(self) -> KbIndexes:
        if self._indexes is None:
            self._indexes = KbIndexes(self.embedder().dim)
        return self._indexes

    async def close(self) -> None:
        """The embedding thread ends (the lifecycle's kb step, at the worker's stop)."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def load(self, tenant_id: str, version: Any, model: str) -> asyncio.Future[None]:
        """Load a tenant's index at `version`: the load in progress, or a new one."""
        loading = self._loading.get(tenant_id)
        if loading is None:
            loading = asyncio.ensure_future(self._load(tenant_id, version, model))
            self._loading[tenant_id] = loading
            loading.add_done_callback(lambda _: self._loading.pop(tenant_id, None))
        return loading

    async def _load(self, tenant_id: str, version: Any, model: str) -> None:
        async with self.db.sessionmaker()() as session:
            rows = await load_chunks(session, tenant_id, model)
        self.indexes.load(tenant_id, version, rows)


def forget_tenant(tenant_id: str) -> None:
    """A tenant's knowledge base or prompt changed (`firsttoken kb add` says so on the tenant
    channel): its next chat reads them afresh rather than trusting them for TENANT_CACHE_S."""
    for kind in ("kb_version", "prompt"):
        _tenant_cache.forget((kind, tenant_id))


async def warm_kb(ctx: WorkerContext) -> None:
    """Load the knowledge base's embedding model at a chat worker's start, on its thread: a
    first load takes seconds, far past the kb source's deadline (150 ms), and the first
    questions after `firsttoken kb add` would go without their document (issue 42). From then
    on an announced change of a tenant's documents is read by its next chat."""
    ctx.tenant_listeners.append(forget_tenant)
    settings = ctx.settings
    _tenant_cache.ttl_s = settings.tenant_cache_s
    if settings.kb_top_k == 0:
        return
    kb = _kb_state(ctx)
    await asyncio.get_running_loop().run_in_executor(kb.executor, kb.embedder)


def _kb_state(ctx: WorkerContext) -> KbState:
    """The worker's kb embedder and indexes (on its context: loaded once, seconds)."""
    if ctx.kb is None:
        ctx.kb = KbState(ctx.settings, ctx.db)
    return cast(KbState, ctx.kb)


def sources_for(ctx: WorkerContext, job: ChatJob) -> list[Source]:
    s = ctx.settings
    db_s = s.retrieval_db_deadline_ms / 1000.0
    sources: list[Source] = [
        UserSource(ctx.db, db_s),
        ConversationSource(ctx.db, db_s, job.new_conversation),
        KbSource(s.retrieval_kb_deadline_ms / 1000.0, _kb_state(ctx), s.kb_top_k, s.kb_min_score),
        QuotaSource(s.retrieval_quota_deadline_ms / 1000.0, ctx),
    ]
    if s.retrieval_probe_ms > 0:
        sources.append(ProbeSource(db_s, s.retrieval_probe_ms / 1000.0))
    return sources


# A tenant id no row has (ids are UUIDs): the warm-up's queries find nothing and cache nothing.
WARM_UP_TENANT = "firsttoken-warm-up"


async def warm_queries(db: Database) -> None:
    """Run each source's database query once, for a tenant that does not exist (a worker's
    start-up, after the pool's first connection). A process's first run of a statement pays for
    SQLAlchemy's compilation and the driver's first use: without this the first chat of each
    worker pays it, and every chat of that tenant that arrives meanwhile waits on the same load
    (a burst right after a restart)."""
    query = Query(WARM_UP_TENANT, "", WARM_UP_TENANT)
    # Together, as a chat runs them: the pool opens the connections they need at once now.
    await asyncio.gather(
        UserSource(db, 0.0)._load(query),
        _kb_version_loader(db, query)(),
        ConversationSource(db, 0.0, new=False).fetch(query),
    )
