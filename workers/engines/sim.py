"""A simulated engine with vLLM-like timing and deterministic text.

Timing model (all times in ms, each scaled by ``1 + jitter * U(-1, 1)``):

- at most ``max_seqs`` sequences generate at once; the rest wait in FIFO order, as in
  vLLM's scheduler when the batch is full;
- once admitted, the first token comes after ``ttft_ms + prefill_ms_per_token * prompt_tokens``;
  with ``prefix_cache_tokens`` > 0 (off by default) a prefix cache (workers/engines/prefixcache.py)
  holds prefilled prompts, and only the tokens past a prompt's cached prefix are paid for; the
  last delta then reports the cached ones (``cached_prompt_tokens``), as vLLM does. A prompt's
  blocks are cached once its prefill is done (its first token's time), whether or not the
  answer runs on (a draft's ``max_tokens`` 1 prefill, issue 34); a request stopped during its
  prefill leaves the blocks it had prefilled so far (at ``prefill_ms_per_token``) cached, as
  vLLM's block-by-block caching does;
- every next token after ``itl_ms * (1 + ITL_SLOWDOWN_PER_SEQ * running)``: decoding is
  memory-bound, so a larger batch slows each step only mildly (about 1.5x at 256 sequences);
- with ``step_ms`` > 0, tokens come on a clock that ticks every ``step_ms`` (on the loop
  clock, shared by all of the engine's sequences), as a batched decoder emits the next token
  of every running sequence at the same step: the first token at the first tick after its
  time to first token, every next one a tick later (``step_ms`` then stands for ``itl_ms``,
  its slowdown and its jitter). 0, the default: each sequence keeps its own schedule.

Tokens follow an absolute schedule on the loop clock, so the overhead of each wake-up does
not add up over a long answer. The answer text is a pure function of (model, messages): the
same prompt always gets the same words, which lets tests compare streaming with non-streaming
and the cache compare answers. A request to continue its last (assistant) message
(``continue_final``, vLLM's ``continue_final_message``) gets the rest of that same answer.

``abort(request_id)`` wakes the stream at once; it then yields one last ``Delta`` with
``finish_reason="abort"`` and ends (it raises nothing). A stream whose consumer stops
iterating (``aclose()``, a cancelled task, or ``abort``) counts as aborted, never finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import random
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Literal

from shared.protocol import Message
from shared.settings import Settings
from workers.engines.base import Delta, EngineRequest, EngineStats
from workers.engines.prefixcache import (
    BLOCK_TOKENS,
    PrefixCache,
    block_hashes,
    prefilled_tokens,
    prompt_token_words,
)

ITL_SLOWDOWN_PER_SEQ = 0.002
# Each message costs a few tokens of chat-template framing (role markers, separators).
TOKENS_PER_MESSAGE = 4

VOCABULARY: tuple[str, ...] = (
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
    "dolore",
    "magna",
    "aliqua",
    "enim",
    "ad",
    "minim",
    "veniam",
    "quis",
    "nostrud",
    "exercitation",
    "ullamco",
    "laboris",
    "nisi",
    "aliquip",
    "ex",
    "ea",
    "commodo",
    "consequat",
    "duis",
    "aute",
    "irure",
    "in",
    "reprehenderit",
    "voluptate",
    "velit",
    "esse",
    "cillum",
    "fugiat",
    "nulla",
    "pariatur",
    "excepteur",
    "sint",
    "occaecat",
    "cupidatat",
    "non",
    "proident",
    "sunt",
    "culpa",
    "qui",
    "officia",
    "deserunt",
    "mollit",
    "anim",
    "id",
    "est",
    "laborum",
)


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Timing and size of simulated answers; see the module docstring for the model."""

    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    prefill_ms_per_token: float = 0.0
    max_seqs: int = 256
    jitter: float = 0.0
    max_tokens: int = 128
    step_ms: float = 0.0
    prefix_cache_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prefix_cache_tokens < 0:
            raise ValueError("the prefix cache's size must not be negative")
        if min(self.ttft_ms, self.itl_ms, self.prefill_ms_per_token, self.step_ms) < 0:
            raise ValueError("simulated latencies must not be negative")
        if self.max_seqs < 1 or self.max_tokens < 1:
            raise ValueError("max_seqs and max_tokens must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> SimOptions:
        return cls(
            ttft_ms=settings.sim_ttft_ms,
            itl_ms=settings.sim_itl_ms,
            prefill_ms_per_token=settings.sim_prefill_ms_per_token,
            max_seqs=settings.sim_max_seqs,
            jitter=settings.sim_jitter,
            max_tokens=settings.sim_max_tokens,
            step_ms=settings.sim_step_ms,
            prefix_cache_tokens=settings.sim_prefix_cache_tokens,
        )


# --- pure core: token counts and the answer ---------------------------------------------


def count_prompt_tokens(messages: Sequence[Message]) -> int:
    """A deterministic stand-in for a tokenizer: words of every message plus framing."""
    return sum(len(m.content.split()) + TOKENS_PER_MESSAGE for m in messages)


def prompt_seed(model: str, messages: Sequence[Message]) -> int:
    # sha256 rather than hash(): str hashes are salted per process, and the server and the
    # in-process engine must agree on the answer.
    payload = json.dumps(
        [model, [[m.role, m.content] for m in messages]], ensure_ascii=False, separators=(",", ":")
    )
    return int.from_bytes(hashlib.sha256(payload.encode()).digest()[:8], "big")


def plan_answer(request: EngineRequest, max_tokens: int) -> tuple[list[str], str]:
    """The answer's tokens and finish reason; the same request always gets the same plan."""
    rng = random.Random(prompt_seed(request.model, request.messages))
    natural = rng.randint(max(1, max_tokens // 2), max_tokens)
    length = min(natural, max(1, request.max_tokens))
    words = [rng.choice(VOCABULARY) for _ in range(length)]
    tokens = [words[0].capitalize()] + [" " + w for w in words[1:]]
    if length < natural:
        return tokens, "length"
    tokens[-1] += "."
    return tokens, "stop"


def plan_continuation(request: EngineRequest, max_tokens: int) -> tuple[list[str], str]:
    """The rest of an answer whose start is the request's last (assistant) message, as a
    `continue_final_message` request asks: the tokens the same prompt without that message is
    answered with, after those that make up the start, within the request's max_tokens. A
    start that is not a prefix of the planned answer is continued after as many of its
    characters as it has, so the text still ends the way the planned one does."""
    head = dataclasses.replace(request, messages=request.messages[:-1], max_tokens=max_tokens)
    tokens, finish_reason = plan_answer(head, max_tokens)
    prefix = len(request.messages[-1].content)
    taken = chars = 0
    while taken < len(tokens) and chars + len(tokens[taken]) <= prefix:
        chars += len(tokens[taken])
        taken += 1
    rest = tokens[taken : taken + max(1, request.max_tokens)]
    if taken + len(rest) < len(tokens):
        return rest, "length"
    return rest, finish_reason


def on_step(t: float, step: float) -> float:
    """The first boundary of a clock ticking every ``step`` at or after ``t``."""
    return math.ceil(t / step - 1e-9) * step


# --- the engine -------------------------------------------------------------------------


@dataclass(slots=True)
class _Stream:
    aborted: bool = False
    # The future the stream is sleeping on, so abort() can wake it before its deadline.
    waiter: asyncio.Future[None] | None = None


class SimEngine:
    """The Engine protocol, simulated in-process; counters in ``stats``."""

    name = "sim"

    def __init__(self, options: SimOptions | None = None, *, timing_seed: int | None = None):
        self.options = options or SimOptions()
        self.stats = EngineStats()
        self.stats.extra["queued"] = 0
        self._slots = asyncio.Semaphore(self.options.max_seqs)
        self._streams: dict[str, _Stream] = {}
        # Timing noise needs no determinism across processes; a seed makes tests repeatable.
        self._noise = random.Random(timing_seed)
        cache_size = self.options.prefix_cache_tokens
        self.prefix_cache = PrefixCache(cache_size) if cache_size else None

    async def stream(
        self, request: EngineRequest, *, request_id: str
    ) -> AsyncGenerator[Delta, None]:
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already streaming")
        if request.continue_final and request.messages[-1].role == "assistant":
            tokens, finish_reason = plan_continuation(request, self.options.max_tokens)
        else:
            tokens, finish_reason = plan_answer(request, self.options.max_tokens)
        prompt_tokens = count_prompt_tokens(request.messages)
        cache = self.prefix_cache
        blocks: list[bytes] = []
        cached: int | None = None
        prefilled = False
        if cache is not None:
            blocks = block_hashes(prompt_token_words(request.messages))
        state = _Stream()
        self._streams[request_id] = state
        self.stats.started += 1
        finished = False
        try:
            if not await self._acquire_slot(state):
                yield Delta(finish_reason="abort", prompt_tokens=prompt_tokens, completion_tokens=0)
                return
            self.stats.running += 1
            try:
                loop = asyncio.get_running_loop()
                opts = self.options
                to_prefill = prompt_tokens
                if cache is not None:  # looked up once admitted, as vLLM's scheduler does
                    cached = cache.cached_tokens(blocks, prompt_tokens)
                    to_prefill -= cached
                admitted_at = loop.time()
                deadline = (
                    admitted_at
                    + self._noisy(opts.ttft_ms + opts.prefill_ms_per_token * to_prefill) / 1000
                )
                last = len(tokens) - 1
                step = opts.step_ms / 1000
                if step:
                    deadline = on_step(deadline, step)
                for i, token in enumerate(tokens):
                    if not await self._sleep_until(state, deadline):
                        yield Delta(
                            finish_reason="abort",
                            prompt_tokens=prompt_tokens,
                            completion_tokens=i,
                            cached_prompt_tokens=cached,
                        )
                        return
                    if i == 0 and cache is not None:
                        cache.insert(blocks)  # prefilled: the prompt's blocks are cached
                        prefilled = True
                    if i == last:
                        # Counted before the yield: a consumer that stops after the final
                        # delta has received the whole answer.
                        finished = True
                        yield Delta(token, finish_reason, prompt_tokens, len(tokens), cached)
                    else:
                        yield Delta(token)
                    if step:
                        deadline += step
                    else:
                        itl = opts.itl_ms * (1 + ITL_SLOWDOWN_PER_SEQ * self.stats.running)
                        deadline += self._noisy(itl) / 1000
            finally:
                self.stats.running -= 1
                self._slots.release()
                if cache is not None and not prefilled:
                    # Stopped during its prefill: as vLLM, the blocks computed so far stay.
                    done = (cached or 0) + prefilled_tokens(
                        (loop.time() - admitted_at) * 1000, to_prefill, opts.prefill_ms_per_token
                    )
                    cache.insert(blocks[: done // BLOCK_TOKENS])
        finally:
            del self._streams[request_id]
            if finished:
                self.stats.finished += 1
            else:
                self.stats.aborted += 1

    async def abort(self, request_id: str) -> None:
        """Stop that stream promptly; unknown or finished ids are ignored."""
        state = self._streams.get(request_id)
        if state is None:
            return
        state.aborted = True
        if state.waiter is not None and not state.waiter.done():
            state.waiter.set_result(None)

    def warm(self) -> None:
        """In process: nothing to open."""

    async def aclose(self) -> None:
        for request_id in list(self._streams):
            await self.abort(request_id)

    def _noisy(self, ms: float) -> float:
        if not self.options.jitter:
            return ms
        return ms * (1 + self.options.jitter * self._noise.uniform(-1, 1))

    async def _sleep_until(self, state: _Stream, deadline: float) -> bool:
        """Sleep until ``deadline`` on the loop clock; False if aborted first.

        Works like asyncio.sleep (a future resolved by call_at) but keeps the future where
        abort() can resolve it early.
        """
        if state.aborted:
            return False
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            # Behind schedule: catch up without sleeping, but let other streams run.
            await asyncio.sleep(0)
            return not state.aborted
        waiter: asyncio.Future[None] = loop.create_future()
        handle = loop.call_at(deadline, _resolve, waiter)
        state.waiter = waiter
        try:
            await waiter
        finally:
            handle.cancel()
            state.waiter = None
        return not state.aborted

    async def _acquire_slot(self, state: _Stream) -> bool:
        """Wait in FIFO order for one of ``max_seqs`` slots; False if aborted while queued."""
        if not self._slots.locked():
            await self._slots.acquire()
            return True
        loop = asyncio.get_running_loop()
        acquire = asyncio.ensure_future(self._slots.acquire())
        waiter: asyncio.Future[None] = loop.create_future()
        state.waiter = waiter
        self.stats.extra["queued"] += 1
        try:
            await asyncio.wait((acquire, waiter), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._give_up(acquire)
            raise
        finally:
            self.stats.extra["queued"] -= 1
            state.waiter = None
        if state.aborted:
            self._give_up(acquire)
            return False
        return True

    def _give_up(self, acquire: asyncio.Future[Literal[True]]) -> None:
        if not acquire.done():
            # Semaphore.acquire hands the slot on if it was granted while being cancelled.
            acquire.cancel()
        elif not acquire.cancelled() and acquire.exception() is None:
            self._slots.release()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
