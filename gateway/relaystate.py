"""What the gateway does with each message of one job's channel. Pure: no sockets, no clock.

Token frames arrive ready to forward; this state keeps them in `seq` order, notices gaps
(repaired from the job's replay stream), and turns the worker's `done` into the wire frame with
the gateway's own timing points added. One job may be followed by several sockets of one
gateway process (the chat that started it and any `resume` of it): each has its own
:class:`RelayState`, and :class:`Followers` decides what one of them leaving means for the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import orjson

from shared.errors import EngineError, error_frame
from shared.failover import started_model, started_worker
from shared.protocol import (
    CHUNK_DONE,
    CHUNK_ERROR,
    CHUNK_STARTED,
    CHUNK_TOKEN,
    DoneChunk,
    chunk_model,
    decode_chunk,
    done_frame,
    dumps,
)
from shared.timing import stage_timings

F = TypeVar("F")


@dataclass(slots=True)
class Step:
    frames: list[str] = field(default_factory=list)
    repair: bool = False  # fetch the replay stream and call apply_repair
    finished: bool = False
    # Prompt + completion tokens from the worker's `done` (None: no usable usage in it).
    used: int | None = None
    # The relayed `done`'s stage timings (ms), model and cached flag, for the metrics.
    timings: dict[str, float] | None = None
    model: str = ""
    cached: bool = False


@dataclass(slots=True)
class RelayState:
    chat_id: str
    received_at: float
    enqueued_at: float = 0.0
    next_seq: int = 0
    started: bool = False
    finished: bool = False
    last_seen: float = 0.0
    first_sent_at: float | None = None
    holding: list[str] | None = None  # messages held while a repair is in flight
    # Set on a resume under a new chat id: frames from the worker carry the old one.
    rename: bool = False
    # The chat worker running the job, as its `started` says (a takeover's names the new one).
    worker: str | None = None
    # The model that answers, as the first token chunk's header says (or, from a worker of an
    # earlier release, its `started` before the first token).
    model: str | None = None

    def feed(self, message: str, now: float) -> Step:
        self.last_seen = now
        if self.finished:
            return Step()
        if self.holding is not None:
            self.holding.append(message)
            return Step()
        step = Step()
        self._apply(message, now, step, repairing=False)
        return step

    def begin_repair(self) -> None:
        if self.holding is None:
            self.holding = []

    def apply_repair(self, stream: list[str], now: float) -> Step:
        """Feed the replay stream's messages, then everything held during the fetch."""
        held, self.holding = self.holding or [], None
        step = Step()
        for message in [*stream, *held]:
            if self.finished:
                break
            self._apply(message, now, step, repairing=True)
        step.repair = False
        return step

    def _apply(self, message: str, now: float, step: Step, *, repairing: bool) -> None:
        kind, seq, payload = decode_chunk(message)
        if kind == CHUNK_TOKEN and seq is not None:
            if seq < self.next_seq:
                return  # already sent (a replayed copy)
            if seq > self.next_seq:
                if repairing:
                    self._gap(step)
                else:
                    self.holding = [message]
                    step.repair = True
                return
            self.started = True
            self.next_seq += 1
            if self.first_sent_at is None:
                self.first_sent_at = now
                # The worker's first token chunk names the model that answers (its header).
                self.model = chunk_model(message) or self.model
            step.frames.append(self._renamed(payload) if self.rename else payload)
        elif kind == CHUNK_STARTED:
            self.started = True
            self.worker = started_worker(payload) or self.worker
            self.model = started_model(payload) or self.model
        elif kind == CHUNK_DONE:
            data: DoneChunk = orjson.loads(payload)
            if int(data.get("chunks", 0)) > self.next_seq:
                if repairing:
                    self._gap(step)
                else:
                    self.holding = [message]
                    step.repair = True
                return
            step.timings = self._timings(data, now)
            step.frames.append(dumps(done_frame(data, self.chat_id, step.timings)))
            step.model, step.cached = str(data.get("model") or ""), bool(data.get("cached"))
            step.used = usage_total(data.get("usage") or {})
            self.finished = step.finished = True
        elif kind == CHUNK_ERROR:
            step.frames.append(self._renamed(payload) if self.rename else payload)
            self.finished = step.finished = True

    def _gap(self, step: Step) -> None:
        step.frames.append(
            dumps(
                error_frame(
                    self.chat_id,
                    EngineError(
                        f"part of the answer was lost after token {self.next_seq - 1} and "
                        "could not be recovered from the replay log; please retry"
                    ),
                )
            )
        )
        self.finished = step.finished = True

    def _renamed(self, payload: str) -> str:
        frame = orjson.loads(payload)
        frame["id"] = self.chat_id
        return dumps(frame)

    def _timings(self, chunk: DoneChunk, now: float) -> dict[str, float]:
        """The `done` frame's stage timings: the worker's points and this gateway's own."""
        points = dict(chunk.get("points") or {})
        points["received"] = self.received_at
        if self.first_sent_at is not None:
            points["first_chunk_sent"] = self.first_sent_at
        points["done_sent"] = now
        return stage_timings(points)


def usage_total(usage: object) -> int | None:
    """Prompt + completion tokens of a `done` frame's usage; None when it has none."""
    if not isinstance(usage, dict):
        return None
    try:
        return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class Leave:
    """What one follower leaving a job means for the job on this gateway process."""

    unsubscribe: bool  # nobody here follows the job any more: drop its channel
    cancel: bool  # the last follower gave up a job that had not ended: the worker should stop
    settle: bool  # give the job's rate-limit reservation back now (true once per job)


@dataclass(slots=True)
class Followers(Generic[F]):
    """The sockets following one job on one gateway process. Pure.

    The job, its worker and its rate-limit reservation are shared by its followers, so a
    follower giving the job up (a disconnect, a watchdog deadline, an HTTP client gone) stops
    only its own relay while another follows: the worker is told to stop only when the last
    follower gives up. The reservation (its stream slot) is given back once, when the job ends
    or its last follower leaves, whichever comes first.
    """

    members: list[F] = field(default_factory=list)
    ended: bool = False  # a follower relayed the worker's done or error (or gave up on a gap)
    settled: bool = False

    def join(self, follower: F) -> None:
        self.members.append(follower)

    def leave(self, follower: F, *, ended: bool) -> Leave | None:
        """`follower` stops following; `ended`: because the job ended (not given up). None
        when it was not following (it left already)."""
        if follower not in self.members:
            return None
        self.members.remove(follower)
        self.ended = self.ended or ended
        last = not self.members
        settle = (last or self.ended) and not self.settled
        self.settled = self.settled or settle
        return Leave(unsubscribe=last, cancel=last and not self.ended, settle=settle)
