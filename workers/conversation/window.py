"""A sliding window of recent turns plus a running summary of the older ones.

A conversation's stored messages are either covered by its summary (``id <= summary_upto``)
or not. While the uncovered messages and the summary together stay under the threshold
(default 8k tokens) they are all sent. Past it, only the last ``recent_messages`` are, and the
older uncovered ones are handed to the summary task, which folds them into the summary off the
hot path; the next turn then sends summary + window. So a long conversation never sends its
full history, and no turn waits for a summary to be written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.protocol import Message
from workers.prompt.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One row of `messages` (ids grow with time)."""

    id: int
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class WindowRules:
    threshold_tokens: int = 8000
    recent_messages: int = 8


@dataclass(frozen=True, slots=True)
class Window:
    history: tuple[Message, ...]  # oldest first, to send after the system message
    summary: str | None
    summarize_upto: int | None  # fold messages with id <= this into the summary; None: no need
    history_tokens: int  # uncovered history + summary, before the window was applied


def select_window(
    stored: Sequence[StoredMessage],
    summary: str | None,
    summary_upto: int | None,
    rules: WindowRules,
    count: TokenCounter,
) -> Window:
    """The history to send and whether older turns now need summarising."""
    uncovered = [
        m
        for m in stored
        if m.role in ("user", "assistant") and (summary_upto is None or m.id > summary_upto)
    ]
    total = sum(count.count(m.content) for m in uncovered)
    if summary:
        total += count.count(summary)
    if total <= rules.threshold_tokens:
        return Window(_messages(uncovered), summary, None, total)
    recent = uncovered[-rules.recent_messages :] if rules.recent_messages else []
    # The window starts at a user message: an answer without its question misleads the model.
    while recent and recent[0].role != "user":
        recent = recent[1:]
    older = uncovered[: len(uncovered) - len(recent)]
    upto = older[-1].id if older else None
    return Window(_messages(recent), summary, upto, total)


def _messages(rows: Sequence[StoredMessage]) -> tuple[Message, ...]:
    return tuple(Message(role=m.role, content=m.content) for m in rows)  # type: ignore[arg-type]


def summary_prompt(
    previous: str | None, turns: Sequence[StoredMessage], max_words: int
) -> list[Message]:
    """The small model's prompt to fold ``turns`` into the running summary."""
    transcript = "\n".join(f"{m.role}: {m.content}" for m in turns)
    parts = []
    if previous:
        parts.append(f"Summary so far:\n{previous}")
    parts.append(f"New turns:\n{transcript}")
    return [
        Message(
            role="system",
            content=(
                "Summarise the conversation for the assistant's memory: facts, names, numbers, "
                f"decisions and open questions; at most {max_words} words; same language as "
                "the conversation; no preamble."
            ),
        ),
        Message(role="user", content="\n\n".join(parts)),
    ]
