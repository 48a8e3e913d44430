"""Whether the gateway may start a chat: every rule that needs no I/O. Pure: values in, an
:class:`Admitted` decision or a :class:`~shared.errors.FirstTokenError` out.

The session (gateway/wsdoor.py) keeps the I/O: whether a chat worker is alive, the admission
script that checks and charges the rate limits and enqueues the job in one round trip.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from gateway.rates import Limits, estimate_prompt_tokens, reservation, tokens_over_limit
from gateway.safety import check_message_chars
from shared.errors import InvalidRequest, Overloaded
from shared.modeltable import ModelTable
from shared.protocol import AUTO_MODEL, NEW_CONVERSATION, ChatFrame


class ChatRules(Protocol):
    """The settings admission reads (shared.settings.Settings has them)."""

    @property
    def max_tokens_default(self) -> int: ...

    @property
    def max_tokens_limit(self) -> int: ...

    @property
    def max_message_chars(self) -> int: ...

    @property
    def max_streams_per_connection(self) -> int: ...


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to build, once per chat
class Admitted:
    """A chat that passed every check the gateway can make without I/O."""

    max_tokens: int
    prompt_estimate: int  # tokens the prompt will take, estimated from its characters
    reserved: int  # tokens held against the key's per-minute limit until the chat ends
    new_conversation: bool  # the chat starts a server-kept conversation (its id is made later)


def check_new_chat(chat_id: str, running: Collection[str], max_streams: int) -> None:
    """A new chat (or resume) on a connection: its id is free and the connection has room."""
    if chat_id in running:
        raise InvalidRequest(f"a chat with id {chat_id!r} is already running on this connection")
    if len(running) >= max_streams:
        raise Overloaded(
            f"this connection already runs {max_streams} chats; wait for one to finish"
        )


def admit_chat(
    frame: ChatFrame,
    *,
    running: Collection[str],
    rules: ChatRules,
    models: ModelTable,
    limits: Limits,
) -> Admitted:
    """Check a `chat` frame against the connection's running chats, the settings, the model
    table and the key's limits; raise the first rule it breaks, saying what to change."""
    check_new_chat(frame.id, running, rules.max_streams_per_connection)
    max_tokens = frame.max_tokens or rules.max_tokens_default
    if max_tokens > rules.max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens {max_tokens} is over the limit of {rules.max_tokens_limit}"
        )
    if frame.messages[-1].role != "user":
        raise InvalidRequest("the last message must have role 'user'")
    if not frame.messages[-1].content.strip():
        # Nothing to answer: an engine would still be paid to make something up (issue 42).
        raise InvalidRequest("the last user message is empty; send a question")
    # Unknown models are refused here, before anything is enqueued (the error lists the known
    # ones); "auto" is routed by the worker once the prompt is built (workers/routing.py).
    if frame.model != AUTO_MODEL:
        models.get(frame.model)
    # A conversation id is checked by the worker (exists, same tenant): its retrieval stage
    # reads the conversation anyway, and the gateway stays off the database.
    check_message_chars(frame.messages, rules.max_message_chars)
    prompt_estimate = estimate_prompt_tokens(m.content for m in frame.messages)
    reserved = reservation(prompt_estimate, max_tokens)
    over = tokens_over_limit(reserved, limits)
    if over is not None:
        raise InvalidRequest(
            f"this chat needs up to {reserved} tokens (prompt estimate + max_tokens), more "
            f"than the {over} tokens per minute this key may use; lower max_tokens"
        )
    return Admitted(
        max_tokens, prompt_estimate, reserved, frame.conversation_id == NEW_CONVERSATION
    )
