"""The chat worker's retrieval stage: sources in parallel, then the budgeted prompt and route.

Sources (each behind :class:`shared.retrieval.Source`, each under its own deadline):

- ``user``: the tenant's prompt template row (``tenant_prompts``);
- ``conversation``: the conversation's summary and unsummarised messages; it also checks that
  the conversation exists and belongs to the chat's tenant (the gateway does not read the
  database on the hot path, and this query is one the worker makes anyway);
- ``kb``: the question's embedding (the cache's embedder) against the tenant's chunks;
- ``quota``: the tenant's tokens used in the current minute (advisory: reported, never blocks;
  the gateway's admission already enforces the limit). It runs in the background: the prompt
  does not wait for its Redis round trip, and `done` reports it.

A late or failing source is skipped and reported in the `done` frame's ``retrieval``. The one
exception is a conversation the source *did* read and found missing or foreign: that is the
client's error, answered ``invalid_request``. If the conversation source fails instead, the
chat goes ahead without history and its turn is not attached to the unverified conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import select

from shared.conversation import StoredMessage, Window, WindowRules, select_window
from shared.db.models import Conversation, MessageRow, TenantPrompt
from shared.embeddings.base import Embedder
from shared.errors import ConfigError, InvalidRequest
from shared.kb.index import KbIndexes
from shared.kb.store import kb_version, load_chunks
from shared.keys import SUMMARIZE_QUEUE, SUMMARIZE_TASK
from shared.modeltable import ModelTable
from shared.prompt import (
    Budget,
    BuiltPrompt,
    ContextChunk,
    PromptParts,
    Template,
    Templates,
    TokenCounter,
    build_prompt,
    counter_for,
    parse_templates,
)
from shared.protocol import AUTO_MODEL
from shared.refreshing import RefreshingCache
from shared.retrieval import (
    Query,
    Source,
    SourceResult,
    gather_sources,
    run_source,
    summarize_results,
)
from shared.routing import DEFAULT_REASONING_CUES, Decision, RoutingRules, decide
from shared.settings import Settings
from shared.tasks import ChatJob, task_message
from workers.context import WorkerContext
from workers.db import database

log = logging.getLogger(__name__)


# --- sources -----------------------------------------------------------------------------------

# Tenant-level rows (prompt overrides, the knowledge base's version) change rarely but would
# cost a database round trip on every chat: each worker process trusts them this long, so an
# edit (`firsttoken kb add`, a tenant prompt) reaches chats within about this many seconds
# (the first chat after it still gets the old value while one query fetches the new one).
TENANT_CACHE_S = 5.0
_tenant_cache: RefreshingCache[tuple[str, str], Any] = RefreshingCache(TENANT_CACHE_S)


async def _per_tenant(kind: str, tenant_id: str, load: Any) -> Any:
    """`await load()`, remembered per (kind, tenant); see shared/refreshing.py."""
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

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s

    async def fetch(self, query: Query) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await _per_tenant(
            "prompt", query.tenant_id, lambda: self._load(query)
        )
        return result

    def cached(self, query: Query) -> tuple[dict[str, Any] | None] | None:
        return _per_tenant_held("prompt", query.tenant_id, lambda: self._load(query))

    async def _load(self, query: Query) -> dict[str, Any] | None:
        async with database.sessionmaker()() as session:
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

    def __init__(self, deadline_s: float, new: bool) -> None:
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
        async with database.sessionmaker()() as session:
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

    @staticmethod
    def _version_loader(query: Query) -> Any:
        async def load_version() -> Any:
            async with database.sessionmaker()() as session:
                return await kb_version(session, query.tenant_id)

        return load_version

    async def fetch(self, query: Query) -> list[ContextChunk]:
        if self.top_k == 0:
            return []
        loop = asyncio.get_running_loop()
        version = await _per_tenant("kb_version", query.tenant_id, self._version_loader(query))
        if version[0] == 0:
            return []  # no knowledge base: no embedding, no model load
        # Loaded on the embedding thread: the first load takes ~0.5 s and must not stall
        # the loop that streams other chats (this chat skips the kb if it is late).
        embedder = await loop.run_in_executor(self.kb.executor, self.kb.embedder)
        if self.kb.indexes.version(query.tenant_id) != version:
            async with database.sessionmaker()() as session:
                rows = await load_chunks(session, query.tenant_id, embedder.name)
            self.kb.indexes.load(query.tenant_id, version, rows)
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
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="kb-embed")
    )
    _embedder: Embedder | None = None
    _indexes: KbIndexes | None = None

    def embedder(self) -> Embedder:
        if self._embedder is None:
            from shared.embeddings.factory import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    @property
    def indexes(self) -> KbIndexes:
        if self._indexes is None:
            self._indexes = KbIndexes(self.embedder().dim)
        return self._indexes


_kb: KbState | None = None


def _kb_state(settings: Settings) -> KbState:
    global _kb
    if _kb is None:
        _kb = KbState(settings)
    return _kb


def sources_for(ctx: WorkerContext, job: ChatJob) -> list[Source]:
    s = ctx.settings
    db_s = s.retrieval_db_deadline_ms / 1000.0
    sources: list[Source] = [
        UserSource(db_s),
        ConversationSource(db_s, job.new_conversation),
        KbSource(s.retrieval_kb_deadline_ms / 1000.0, _kb_state(s), s.kb_top_k, s.kb_min_score),
        QuotaSource(s.retrieval_quota_deadline_ms / 1000.0, ctx),
    ]
    if s.retrieval_probe_ms > 0:
        sources.append(ProbeSource(db_s, s.retrieval_probe_ms / 1000.0))
    return sources


# --- configuration read once per process -----------------------------------------------------


@dataclass(frozen=True)
class PromptConfig:
    templates: Templates
    budgets: dict[str, int]
    tokenizers: dict[str, str]
    rules: RoutingRules
    window: WindowRules
    default_budget: int

    def budget(self, model: str) -> Budget:
        return Budget(total=self.budgets.get(model, self.default_budget))

    def counter(self, model: str) -> TokenCounter:
        return counter_for(self.tokenizers.get(model))


def _json_map(raw: str | None, name: str) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"FIRSTTOKEN_{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"FIRSTTOKEN_{name} must be a JSON object")
    return data


@lru_cache(maxsize=4)
def prompt_config(settings: Settings) -> PromptConfig:
    cues = (
        tuple(c.strip() for c in settings.route_reasoning_cues.split(",") if c.strip())
        if settings.route_reasoning_cues
        else DEFAULT_REASONING_CUES
    )
    return PromptConfig(
        templates=parse_templates(settings.prompt_tenants),
        budgets={
            k: int(v) for k, v in _json_map(settings.prompt_budgets, "PROMPT_BUDGETS").items()
        },
        tokenizers={
            k: str(v) for k, v in _json_map(settings.prompt_tokenizers, "PROMPT_TOKENIZERS").items()
        },
        rules=RoutingRules(settings.route_long_prompt_tokens, cues),
        window=WindowRules(settings.context_summary_after_tokens, settings.context_recent_messages),
        default_budget=settings.prompt_budget_tokens,
    )


def warm_up(settings: Settings, models: ModelTable) -> None:
    """Load every model's tokenizer before the first chat (tiktoken's ranks take ~0.5 s to
    load, a tokenizer.json more): the first chat must not pay for it on the event loop."""
    cfg = prompt_config(settings)
    for spec in models:
        cfg.counter(spec.name).count("warm up")


# A tenant id no row has (ids are UUIDs): the warm-up's queries find nothing and cache nothing.
WARM_UP_TENANT = "firsttoken-warm-up"


async def warm_queries() -> None:
    """Run each source's database query once, for a tenant that does not exist (a worker's
    start-up, after the pool's first connection). A process's first run of a statement pays for
    SQLAlchemy's compilation and the driver's first use: measured 17-30 ms, on the first chat
    of each worker, and every chat of that tenant that arrived meanwhile waited on the same
    load (a burst after a restart saw 30-47 ms of retrieval)."""
    query = Query(WARM_UP_TENANT, "", WARM_UP_TENANT)
    # Together, as a chat runs them: the pool opens the connections they need at once now.
    await asyncio.gather(
        UserSource(0.0)._load(query),
        KbSource._version_loader(query)(),
        ConversationSource(0.0, new=False).fetch(query),
    )


# --- the stage ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """What generation needs, and what the `done` frame reports."""

    job: ChatJob  # the job with the built messages and the concrete model
    model: str
    built: BuiltPrompt
    decision: Decision | None
    window: Window | None
    conversation_ok: bool  # the turn may be stored in job.conversation_id
    retrieval: dict[str, Any]
    # BACKGROUND_SOURCES: to start (deferred), then running (background); settle_background()
    # adds their results to `retrieval`.
    deferred: list[tuple[Source, Query]] = field(default_factory=list)
    background: dict[str, asyncio.Future[SourceResult]] = field(default_factory=dict)


# Sources the prompt never reads: they run alongside the answer and only `done` reports them.
BACKGROUND_SOURCES = frozenset({"quota"})


async def prepare(ctx: WorkerContext, job: ChatJob) -> Prepared:
    """Run the sources, then build the prompt (and pick the model for ``auto``).

    The BACKGROUND_SOURCES are not started here: :func:`start_background` starts them once the
    engine request is on its way."""
    query = Query(job.tenant_id, job.messages[-1].content, job.conversation_id, job.key_id)
    sources = sources_for(ctx, job)
    results = await gather_sources([s for s in sources if s.name not in BACKGROUND_SOURCES], query)
    prepared = assemble(ctx.settings, ctx.models, job, results)
    prepared.deferred.extend((s, query) for s in sources if s.name in BACKGROUND_SOURCES)
    return prepared


def start_background(prepared: Prepared) -> None:
    """Start the background sources (their results go to `done`, see settle_background)."""
    for source, query in prepared.deferred:
        prepared.background[source.name] = asyncio.ensure_future(run_source(source, query))
    prepared.deferred.clear()


async def settle_background(prepared: Prepared, wait_s: float = 0.05) -> None:
    """Add the background sources' results to ``prepared.retrieval`` (waiting at most
    ``wait_s``: by the end of an answer they are long done); one still running is dropped."""
    if prepared.deferred:  # still held back (workers/deferred.py): reported as skipped
        prepared.retrieval["skipped"].extend(source.name for source, _ in prepared.deferred)
        prepared.deferred.clear()
    tasks = prepared.background
    if not tasks:
        return
    await asyncio.wait(tasks.values(), timeout=wait_s)
    done = {}
    for name, task in tasks.items():
        if task.done() and not task.cancelled():
            done[name] = task.result()
        else:
            task.cancel()
    summary = summarize_results(done)
    prepared.retrieval["sources"].update(summary["sources"])
    prepared.retrieval["skipped"].extend(summary["skipped"])
    tasks.clear()


def assemble(
    settings: Settings, models: ModelTable, job: ChatJob, results: dict[str, SourceResult]
) -> Prepared:
    """The pure half of the stage: source results -> prompt, route, window."""
    cfg = prompt_config(settings)
    conv = results.get("conversation")
    state = conv.value if conv is not None and conv.ok else None
    if isinstance(state, ConversationState) and not state.found:
        raise InvalidRequest(
            f"unknown conversation {job.conversation_id!r}: it does not exist for this API "
            'key\'s tenant; send conversation_id "new" to start one'
        )
    template = cfg.templates.for_tenant(job.tenant_id)
    user = results.get("user")
    if user is not None and user.ok and user.value:
        template = _safe_overrides(template, user.value)

    asked = job.model
    auto = asked == AUTO_MODEL
    # Auto routing needs the prompt's size before the model is known: count with the large
    # model's budget and tokenizer, the more generous one, then rebuild for the chosen model.
    first_model = _model_for_counting(models, asked)
    window: Window | None = None
    history = [m for m in job.messages[:-1] if m.role != "system"]
    summary = None
    if isinstance(state, ConversationState):
        window = select_window(
            state.messages, state.summary, state.summary_upto, cfg.window, cfg.counter(first_model)
        )
        history = [*window.history, *history]
        summary = window.summary
    client_system = "\n".join(m.content for m in job.messages if m.role == "system") or None
    kb = results.get("kb")
    chunks = list(kb.value) if kb is not None and kb.ok and kb.value else []
    parts = PromptParts(
        template=template,
        question=job.messages[-1].content,
        history=history,
        summary=summary,
        context=chunks,
        client_system=client_system,
    )
    built = build_prompt(parts, cfg.budget(first_model), cfg.counter(first_model))
    decision = None
    model = first_model
    if auto:
        roles = [(spec.name, spec.role) for spec in models]
        decision = decide(
            parts.question, built.prompt_tokens, cfg.rules, roles, models.default,
            template.route_policy,
        )  # fmt: skip
        model = decision.model
        if model != first_model:
            built = build_prompt(parts, cfg.budget(model), cfg.counter(model))
    routed = job.model_copy(update={"messages": list(built.messages), "model": model})
    return Prepared(
        job=routed,
        model=model,
        built=built,
        decision=decision,
        window=window,
        conversation_ok=job.conversation_id is not None and state is not None,
        retrieval=summarize_results(results),
    )


def _safe_overrides(template: Template, data: dict[str, Any]) -> Template:
    try:
        return template.with_overrides(data)
    except ConfigError as exc:  # a bad row must not fail the tenant's chats
        log.warning("ignoring tenant_prompts row: %s", exc)
        return template


def _model_for_counting(models: ModelTable, asked: str | None) -> str:
    if asked != AUTO_MODEL:
        return models.get(asked).name
    for spec in models:
        if spec.role == "large":
            return spec.name
    return models.default


def done_fields(prepared: Prepared) -> dict[str, Any]:
    """What the stage adds to the `done` frame."""
    out: dict[str, Any] = {
        "chunk_ids": list(prepared.built.chunk_ids),
        "retrieval": prepared.retrieval,
        "prompt": {
            "history_sent": prepared.built.history_sent,
            "history_dropped": prepared.built.history_dropped,
            "summary_sent": prepared.built.summary_sent,
        },
    }
    if prepared.decision is not None:
        out["route"] = prepared.decision.route
        out["route_reason"] = prepared.decision.reason
    if prepared.job.conversation_id is not None:
        out["conversation_id"] = prepared.job.conversation_id
    return out


async def after_answer(
    ctx: WorkerContext, original: ChatJob, prepared: Prepared, answer: str, model: str
) -> None:
    """Store a conversation turn before `done`, so the next turn reads it; queue a summary.

    The direct write (one short transaction; it delays `done`, never the first token) is what
    makes "send the next message as soon as `done` arrives" see this turn. The bulk queue gets
    the same idempotent write too (workers/chat.py), so a failure here only delays it.
    """
    job = prepared.job
    if not prepared.conversation_ok or job.conversation_id is None:
        return
    from shared.db.writes import insert_messages
    from shared.tasks import MessagesRecord

    record = MessagesRecord(
        request_id=job.job_id,
        tenant_id=job.tenant_id,
        conversation_id=job.conversation_id,
        # The client's messages as sent, like the bulk write: both key rows on
        # (request_id, position), so the second of the two writes adds nothing.
        messages=list(original.messages),
        answer=answer,
        model=model,
        created_at=time.time(),
    )
    try:
        async with asyncio.timeout(1.0), database.sessionmaker().begin() as session:
            await insert_messages(session, record)
    except Exception as exc:  # noqa: BLE001 - the bulk path retries it
        log.warning("direct write of turn %s failed (%s); the bulk queue has it", job.job_id, exc)
    window = prepared.window
    if window is None or window.summarize_upto is None:
        return
    # One summary job per conversation at a time: every turn past the threshold would
    # otherwise queue another until the first one lands.
    lock = ctx.keys.summary_lock(job.conversation_id)
    if await ctx.redis.set(lock, job.job_id, nx=True, ex=120):
        message = task_message(
            SUMMARIZE_TASK,
            {
                "conversation_id": job.conversation_id,
                "tenant_id": job.tenant_id,
                "upto": window.summarize_upto,
            },
            queue=SUMMARIZE_QUEUE,
            origin=ctx.name,
        )
        await ctx.redis.lpush(ctx.keys.queue_list(SUMMARIZE_QUEUE), message)
