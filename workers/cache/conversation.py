"""A turn of a server-stored conversation as the cache sees it (issue 45). Pure.

A client-kept conversation sends its whole history in `messages`; a stored one sends only the
new message, and the worker reads the history from the database during retrieval. The cache
keys both on the same messages: the ones the turn would have carried had the client kept the
history. So the same history is normalised and hashed the same way (workers/cache/normalize.py)
whoever kept it, and a stored conversation and a client-kept one with the same turns share
their entries; a different history is a different partition and never serves.

What is keyed is what the prompt is built from (workers/retrieval/assembly.py): the window of
turns the conversation sends and, once older turns were folded into the running summary, the
summary in their place, as the line the system message gives it. The turns the summary
replaced are no longer sent, so they are not keyed either: two conversations with the same
summary and window send the model the same text. (The budget may drop a window's oldest turns
from the prompt as it may drop a client-kept history's; both keys hold them all, which only
makes a key stricter than what was sent.)
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.protocol import Message
from workers.prompt.template import summary_line


def stored_turn(
    messages: Sequence[Message], history: Sequence[Message], summary: str | None
) -> list[Message]:
    """The messages a stored conversation's turn is keyed on: the turn's system messages (and
    the summary's line after them), the stored history, then the turn's own messages, in the
    order the prompt has them."""
    system = [m for m in messages if m.role == "system"]
    if summary:
        system.append(Message(role="system", content=summary_line(summary)))
    own = [m for m in messages if m.role != "system"]
    return [*system, *history, *own]
