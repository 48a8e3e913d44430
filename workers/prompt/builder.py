"""Build a prompt from its parts within a model's token budget; a pure function.

What must fit: system message (template, summary, retrieved context), the history window and
the question, plus the chat template's per-message overhead. What gives way when it does not,
in order: the lowest-scoring context chunks, then the oldest history messages, then the
summary. The question and the template never give way: a question that cannot fit is the
client's error (`invalid_request`), not something to cut silently.

The count returned is of the messages actually built, counted whole after assembly (a sum of
the parts' counts can differ from the count of their concatenation by a token or two), so
``done.usage.prompt_tokens`` is exactly what was sent to the engine. A first turn without
sources (the template and the question only) has nothing that could give way: when the
counter's quick bound shows it fits, its count is taken on first use of ``prompt_tokens``
instead, so a chat worker can send the prompt before it spends time counting it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.errors import InvalidRequest
from shared.protocol import Message
from workers.prompt.template import Template, system_text
from workers.prompt.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class ContextChunk:
    """A retrieved piece of text (knowledge base or user context) with its relevance."""

    id: str
    text: str
    score: float
    source: str = "kb"


@dataclass(frozen=True, slots=True)
class Budget:
    """A model's prompt budget in tokens.

    ``per_message`` and ``reply_priming`` account for the chat template's role markers
    (OpenAI's accounting for ChatML: 3-4 per message, 3 to prime the reply); a model whose
    template is heavier sets larger values.
    """

    total: int
    per_message: int = 4
    reply_priming: int = 3
    # Share of what remains after the template and the question that history may take when
    # there is context competing for it; history keeps the rest when there is none.
    history_share: float = 0.5


@dataclass(frozen=True, slots=True)
class PromptParts:
    template: Template
    question: str
    history: Sequence[Message] = ()  # oldest first; user/assistant turns before the question
    summary: str | None = None
    context: Sequence[ContextChunk] = ()
    client_system: str | None = None


@dataclass(slots=True)
class BuiltPrompt:
    messages: tuple[Message, ...]
    chunk_ids: tuple[str, ...]
    history_sent: int
    history_dropped: int
    context_dropped: int
    summary_sent: bool
    # The exact count, or None until the first read of prompt_tokens takes it.
    tokens: int | None
    counting: tuple[TokenCounter, Budget] | None = None

    @property
    def prompt_tokens(self) -> int:
        """Tokens of ``messages`` as the engine sees them (counted on first use if need be)."""
        if self.tokens is None:
            assert self.counting is not None
            self.tokens = count_messages(self.messages, *self.counting)
        return self.tokens


def count_messages(messages: Sequence[Message], count: TokenCounter, budget: Budget) -> int:
    """Tokens of a chat prompt as the engine sees it: contents plus the template's overhead."""
    body = sum(count.count(m.content) + budget.per_message for m in messages)
    return body + budget.reply_priming


def _at_most(messages: Sequence[Message], count: TokenCounter, budget: Budget) -> int | None:
    """An upper bound of count_messages() from the counter's quick bounds (None: it has none)."""
    total = budget.reply_priming
    for m in messages:
        bound = count.at_most(m.content)
        if bound is None:
            return None
        total += bound + budget.per_message
    return total


def build_prompt(parts: PromptParts, budget: Budget, count: TokenCounter) -> BuiltPrompt:
    """The prompt for ``parts`` that fits ``budget``; raises InvalidRequest if even the
    template and the question alone do not fit."""
    base = _assemble(parts, summary=None, context=(), history=())
    if not (parts.summary or parts.context or parts.history):
        bound = _at_most(base, count, budget)
        if bound is not None and bound <= budget.total:
            return BuiltPrompt(
                messages=base,
                chunk_ids=(),
                history_sent=0,
                history_dropped=0,
                context_dropped=0,
                summary_sent=False,
                tokens=None,
                counting=(count, budget),
            )
    base_tokens = count_messages(base, count, budget)
    if base_tokens > budget.total:
        raise InvalidRequest(
            f"the message needs {base_tokens} prompt tokens with the system prompt; this "
            f"model's budget is {budget.total}. Shorten the message."
        )
    room = budget.total - base_tokens
    summary = parts.summary or None
    summary_cost = count.count(summary) + 8 if summary else 0
    if summary_cost > room:
        summary, summary_cost = None, 0
    room -= summary_cost

    chunks = sorted(parts.context, key=lambda c: -c.score)
    history_room = int(room * budget.history_share) if chunks else room
    history = _newest_that_fit(parts.history, history_room, count, budget)
    room -= sum(count.count(m.content) + budget.per_message for m in history)
    context = _best_that_fit(chunks, room, count)

    # Assembly can merge tokens across boundaries either way: drop until the exact count fits.
    while True:
        if summary is None and not context and not history:
            # Only the template and the question (a first turn without sources): the prompt
            # already assembled and counted, which fits.
            messages, tokens = base, base_tokens
            break
        messages = _assemble(parts, summary=summary, context=context, history=history)
        tokens = count_messages(messages, count, budget)
        if tokens <= budget.total:
            break
        if context:
            context = context[:-1]
        elif history:
            history = history[1:]
        else:
            summary = None
    return BuiltPrompt(
        messages=messages,
        chunk_ids=tuple(c.id for c in context),
        history_sent=len(history),
        history_dropped=len(parts.history) - len(history),
        context_dropped=len(parts.context) - len(context),
        summary_sent=summary is not None,
        tokens=tokens,
    )


def _assemble(
    parts: PromptParts,
    *,
    summary: str | None,
    context: Sequence[ContextChunk],
    history: Sequence[Message],
) -> tuple[Message, ...]:
    system = system_text(
        parts.template,
        client_system=parts.client_system,
        summary=summary,
        context=tuple(c.text for c in context),
    )
    return (
        Message(role="system", content=system),
        *history,
        Message(role="user", content=parts.question),
    )


def _newest_that_fit(
    history: Sequence[Message], room: int, count: TokenCounter, budget: Budget
) -> tuple[Message, ...]:
    """The longest run of the most recent messages within ``room`` (a window has no holes:
    skipping a long message and keeping older ones would make the model misread the turns)."""
    kept: list[Message] = []
    for message in reversed(history):
        cost = count.count(message.content) + budget.per_message
        if cost > room:
            break
        kept.append(message)
        room -= cost
    # An assistant message first would answer a question the model never sees.
    while kept and kept[-1].role == "assistant":
        kept.pop()
    return tuple(reversed(kept))


def _best_that_fit(
    chunks: Sequence[ContextChunk], room: int, count: TokenCounter
) -> tuple[ContextChunk, ...]:
    """Highest scores first; a chunk that does not fit is skipped, a smaller one may still."""
    kept: list[ContextChunk] = []
    for chunk in chunks:
        cost = count.count(chunk.text) + 4  # "[n] " and the newline
        if cost <= room:
            kept.append(chunk)
            room -= cost
    return tuple(kept)
