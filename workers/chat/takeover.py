"""A chat worker's decisions on failover: which workers are lost, and what to do with a chat
claimed from one (rerun, continue, fail). Pure: no Redis, no clock. The design is told in
shared/failover.py; the I/O is workers/chat/failover.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from shared.protocol import (
    CHUNK_DONE,
    CHUNK_ERROR,
    CHUNK_STARTED,
    CHUNK_TOKEN,
    Message,
    chunk_model,
    chunk_tokens,
    decode_chunk,
)
from workers.engines.base import EngineRequest


def lost_workers(beats: Mapping[str, float], *, now: float, lost_s: float, me: str) -> list[str]:
    """The chat workers (other than `me`) whose last heartbeat is `lost_s` old or older."""
    return sorted(name for name, beat in beats.items() if name != me and now - beat >= lost_s)


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a worker that claimed a dead worker's chat does with it, read off its replay log.

    - ``ended``: the log already has the chat's `done` or `error`: nothing to do;
    - ``rerun``: no token was sent: run the chat from the start (the client cannot tell);
    - ``continue``: continue the answer from ``text`` (``tokens`` tokens, chunks up to
      ``next_seq - 1`` sent);
    - ``fail``: text was sent that cannot be continued (a cache replay: its chunks carry no
      token count): end the chat with `engine_error`.
    """

    kind: Literal["ended", "rerun", "continue", "fail"]
    text: str = ""
    next_seq: int = 0
    tokens: int = 0
    # The model the dead worker answered with (its first token chunk names it; a worker of
    # an earlier release, its last `started` before it), which must write the rest; None: the
    # chat's own model.
    model: str | None = None


def plan_takeover(log: Iterable[str]) -> Takeover:
    """Decide a claimed chat's fate from its replay stream's messages, oldest first."""
    texts: list[str] = []
    next_seq, tokens = 0, 0
    countable = True
    model: str | None = None
    for message in log:
        kind, seq, payload = decode_chunk(message)
        if kind in (CHUNK_DONE, CHUNK_ERROR):
            return Takeover("ended")
        if kind == CHUNK_STARTED and next_seq == 0:
            model = _answering(payload) or model
            continue
        if kind != CHUNK_TOKEN or seq is None or seq < next_seq:
            continue  # a copy of a chunk already read
        if seq > next_seq:
            return Takeover("fail", "".join(texts), next_seq, tokens)  # a hole: never guessed
        texts.append(str(orjson.loads(payload)["text"]))
        if next_seq == 0:  # the first token chunk names the model that answers
            model = chunk_model(message) or model
        next_seq += 1
        count = chunk_tokens(message)
        if count is None:
            countable = False
        else:
            tokens = count
    if next_seq == 0:
        return Takeover("rerun")
    if not countable:
        return Takeover("fail", "".join(texts), next_seq, tokens)
    return Takeover("continue", "".join(texts), next_seq, tokens, model)


def _answering(payload: str) -> str | None:
    """The model a `started` names: the one that answers (sent before the first token; with
    `auto` the routed one), or the one a failover moved to."""
    try:
        chunk = orjson.loads(payload)
        model, failover = chunk.get("model"), chunk.get("failover")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(model, str):
        return model
    return str(failover["to"]) if isinstance(failover, dict) and "to" in failover else None


def continuation_request(request: EngineRequest, prefix: str, tokens_sent: int) -> EngineRequest:
    """The engine request that continues an answer cut after `prefix` (`tokens_sent` tokens):
    the prefix as the start of the assistant's message, and the tokens left of the budget
    (at least one: the engine then ends the answer with its finish reason)."""
    return dataclasses.replace(
        request,
        messages=[*request.messages, Message(role="assistant", content=prefix)],
        max_tokens=max(1, request.max_tokens - tokens_sent),
        continue_final=True,
    )
