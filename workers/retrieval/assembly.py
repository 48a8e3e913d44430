"""Prompt assembly: the sources' results -> the budgeted prompt, the route and the window.

:func:`prepare` runs the sources (``workers.retrieval.sources``) and :func:`assemble`, the pure
half, builds from their results what generation needs (:class:`Prepared`). A conversation the
source *did* read and found missing or foreign is the client's error, answered
``invalid_request``; if the conversation source fails instead, the chat goes ahead without
history and its turn is not attached to the unverified conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from shared.errors import ConfigError, InvalidRequest
from shared.modeltable import ModelTable
from shared.protocol import AUTO_MODEL
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.conversation import Window, WindowRules, select_window
from workers.prompt import (
    Budget,
    BuiltPrompt,
    PromptParts,
    Template,
    Templates,
    TokenCounter,
    build_prompt,
    counter_for,
    parse_templates,
)
from workers.resources import WorkerContext
from workers.retrieval.gather import (
    Query,
    Source,
    SourceResult,
    gather_sources,
    run_source,
    summarize_results,
)
from workers.retrieval.sources import ConversationState, sources_for
from workers.routing import DEFAULT_REASONING_CUES, Decision, RoutingRules, decide

log = logging.getLogger(__name__)


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
    """Load every model's tokenizer before the first chat (tiktoken's ranks, or a
    tokenizer.json, are slow to load): the first chat must not pay for it on the event loop."""
    cfg = prompt_config(settings)
    for spec in models:
        cfg.counter(spec.name).count("warm up")


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
    # BACKGROUND_SOURCES: to start (deferred), then running (background); after.py's
    # settle_background() adds their results to `retrieval`.
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
