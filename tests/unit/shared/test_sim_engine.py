"""SimEngine: deterministic answers, token counts, finish reasons, queueing, aborts, timing."""

from __future__ import annotations

import asyncio
import itertools
import time
from contextlib import aclosing
from typing import Any

import pytest

from shared.errors import ConfigError
from shared.protocol import Message
from shared.settings import load_settings
from workers.engines.base import Delta, EngineRequest
from workers.engines.factory import make_engine
from workers.engines.sim import (
    ITL_SLOWDOWN_PER_SEQ,
    SimEngine,
    SimOptions,
    count_prompt_tokens,
    on_step,
    plan_answer,
)

FAST = SimOptions(ttft_ms=1, itl_ms=0, max_tokens=16)


def request(
    text: str = "hello there", *, model: str = "sim", max_tokens: int = 64
) -> EngineRequest:
    return EngineRequest(
        messages=[Message(role="system", content="be brief"), Message(role="user", content=text)],
        model=model,
        max_tokens=max_tokens,
    )


async def collect(engine: SimEngine, req: EngineRequest, request_id: str = "r") -> list[Delta]:
    return [d async for d in engine.stream(req, request_id=request_id)]


async def test_same_prompt_same_answer() -> None:
    """The same model and messages always give the same text; another prompt gives another."""
    a = await collect(SimEngine(FAST), request("what is redis?"))
    b = await collect(SimEngine(FAST), request("what is redis?"))
    c = await collect(SimEngine(FAST), request("what is postgres?"))
    d = await collect(SimEngine(FAST), request("what is redis?", model="other"))
    text = "".join(x.text for x in a)
    assert text == "".join(x.text for x in b)
    assert text != "".join(x.text for x in c)
    assert text != "".join(x.text for x in d)


async def test_one_token_per_delta_and_usage_on_last() -> None:
    """Each delta is one token; only the last carries finish_reason and both token counts."""
    deltas = await collect(SimEngine(FAST), request())
    assert all(d.text and d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason == "stop"
    assert last.completion_tokens == len(deltas)
    assert last.prompt_tokens == count_prompt_tokens(request().messages) == (2 + 4) + (2 + 4)
    assert FAST.max_tokens // 2 <= len(deltas) <= FAST.max_tokens


async def test_request_max_tokens_caps_with_length() -> None:
    """A request max_tokens below the natural answer length cuts it there with "length"."""
    deltas = await collect(SimEngine(FAST), request(max_tokens=3))
    assert len(deltas) == 3
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].completion_tokens == 3
    full, reason = plan_answer(request(), FAST.max_tokens)
    assert reason == "stop"
    assert "".join(d.text for d in deltas) == "".join(full[:3])


async def test_counters_finish() -> None:
    """A stream read to the end counts as started and finished, and nothing stays running."""
    engine = SimEngine(FAST)
    await collect(engine, request())
    assert (engine.stats.started, engine.stats.finished, engine.stats.aborted) == (1, 1, 0)
    assert engine.stats.running == 0


async def test_aclose_counts_as_abort() -> None:
    """A consumer that closes the stream after one token counts as aborted, not finished."""
    engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=50, max_tokens=16))
    async with aclosing(engine.stream(request(), request_id="r")) as stream:
        first = await anext(stream)
        assert first.text
        assert engine.stats.running == 1
    assert (engine.stats.finished, engine.stats.aborted, engine.stats.running) == (0, 1, 0)


async def test_cancelled_task_counts_as_abort() -> None:
    """Cancelling the task that iterates the stream counts as an abort."""
    engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=50, max_tokens=16))
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.stream(request(), request_id="r"):
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (engine.stats.finished, engine.stats.aborted, engine.stats.running) == (0, 1, 0)


async def test_abort_ends_stream_promptly() -> None:
    """abort(request_id) wakes a stream mid-sleep; it ends with finish_reason "abort"."""
    engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=5_000, max_tokens=16))
    async with aclosing(engine.stream(request(), request_id="r")) as stream:
        await anext(stream)

        async def abort_soon() -> None:
            await asyncio.sleep(0.02)
            await engine.abort("r")

        aborter = asyncio.create_task(abort_soon())
        started = time.monotonic()
        last = await anext(stream)
        await aborter
        assert time.monotonic() - started < 2
        assert last.finish_reason == "abort"
        assert last.completion_tokens == 1
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
    assert (engine.stats.finished, engine.stats.aborted) == (0, 1)
    await engine.abort("r")  # unknown ids are ignored


async def test_max_seqs_queues_in_fifo_order() -> None:
    """With max_seqs=2, a third stream waits for a slot and starts in arrival order."""
    engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=1, max_seqs=2, max_tokens=8))
    order: list[str] = []
    peak = 0

    async def run(rid: str) -> None:
        nonlocal peak
        async for _ in engine.stream(request(rid), request_id=rid):
            if rid not in order:
                order.append(rid)
            peak = max(peak, engine.stats.running)

    await asyncio.gather(*(run(f"r{i}") for i in range(5)))
    assert peak == 2
    assert order == [f"r{i}" for i in range(5)]
    assert engine.stats.finished == 5
    assert engine.stats.extra["queued"] == 0


async def test_abort_while_queued() -> None:
    """A stream waiting for a slot can be aborted; it never runs and frees nothing twice."""
    engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=20, max_seqs=1, max_tokens=8))
    first = engine.stream(request("a"), request_id="a")
    await anext(first)
    queued = engine.stream(request("b"), request_id="b")
    waiting = asyncio.ensure_future(anext(queued))
    await asyncio.sleep(0.01)
    assert engine.stats.extra["queued"] == 1 and not waiting.done()
    await engine.abort("b")
    assert (await asyncio.wait_for(waiting, 1)).finish_reason == "abort"
    await queued.aclose()
    rest = [d async for d in first]
    assert rest[-1].finish_reason == "stop"
    assert (engine.stats.finished, engine.stats.aborted, engine.stats.running) == (1, 1, 0)
    # The slot is free again.
    assert (await collect(engine, request("c"), "c"))[-1].finish_reason == "stop"


async def test_time_to_first_token_follows_ttft_and_prefill() -> None:
    """The first token comes no earlier than ttft + prefill per prompt token (loose bound)."""
    engine = SimEngine(SimOptions(ttft_ms=60, itl_ms=1, prefill_ms_per_token=5, max_tokens=4))
    req = request()
    expected = (60 + 5 * count_prompt_tokens(req.messages)) / 1000
    started = time.monotonic()
    async with aclosing(engine.stream(req, request_id="r")) as stream:
        await anext(stream)
        ttft = time.monotonic() - started
    assert expected * 0.9 <= ttft < expected + 1.0


async def test_jitter_keeps_text_deterministic() -> None:
    """Jitter changes timing only, never the words."""
    plain = await collect(SimEngine(FAST), request())
    noisy_engine = SimEngine(SimOptions(ttft_ms=1, itl_ms=0, jitter=1, max_tokens=16))
    noisy = await collect(noisy_engine, request())
    assert [d.text for d in plain] == [d.text for d in noisy]


def test_on_step_rounds_up_to_the_clock() -> None:
    assert on_step(0.0, 0.015) == 0.0
    assert on_step(0.001, 0.015) == pytest.approx(0.015)
    assert on_step(0.015, 0.015) == pytest.approx(0.015)  # a boundary stays where it is
    assert on_step(0.0150001, 0.015) == pytest.approx(0.030)


class _RecordingDeadlines(SimEngine):
    """Records when each token is due instead of waiting for it."""

    def __init__(self, options: SimOptions) -> None:
        super().__init__(options)
        self.due: dict[str, list[float]] = {}
        self._current = ""  # the answer being recorded

    async def _sleep_until(self, state: Any, deadline: float) -> bool:
        self.due.setdefault(self._current, []).append(deadline)
        return True


async def test_steps_put_every_answers_tokens_on_one_shared_clock() -> None:
    """With step_ms, answers started apart have their tokens due on the same ticks of one
    clock, one tick apart, whatever itl_ms says; without it, itl_ms apart."""
    step = 0.02
    stepped = _RecordingDeadlines(SimOptions(ttft_ms=5, itl_ms=1, max_tokens=6, step_ms=20))
    for name in ("one", "two"):
        stepped._current = name
        await collect(stepped, request(name), name)
        await asyncio.sleep(0.007)
    for due in stepped.due.values():
        ticks = [d / step for d in due]
        assert all(abs(k - round(k)) < 1e-6 for k in ticks)  # on the clock
        assert [round(b - a) for a, b in itertools.pairwise(ticks)] == [1] * (len(due) - 1)
    plain = _RecordingDeadlines(SimOptions(ttft_ms=5, itl_ms=1, max_tokens=6))
    plain._current = "one"
    await collect(plain, request("one"), "one")
    gaps = [b - a for a, b in itertools.pairwise(plain.due["one"])]
    assert gaps == pytest.approx([0.001 * (1 + ITL_SLOWDOWN_PER_SEQ)] * len(gaps))


def test_options_from_settings_and_factory() -> None:
    """SimOptions mirrors the sim_* settings, and make_engine builds a SimEngine for engine=sim."""
    settings = load_settings(
        engine="sim", sim_ttft_ms=7, sim_itl_ms=3, sim_max_seqs=4, sim_step_ms=2
    )
    options = SimOptions.from_settings(settings)
    assert (options.ttft_ms, options.itl_ms, options.max_seqs, options.step_ms) == (7, 3, 4, 2)
    engine = make_engine(settings)
    assert isinstance(engine, SimEngine) and engine.options == options


def test_options_reject_nonsense() -> None:
    """Negative latencies and zero slots are refused at construction."""
    with pytest.raises(ValueError):
        SimOptions(ttft_ms=-1)
    with pytest.raises(ValueError):
        SimOptions(max_seqs=0)
    with pytest.raises(ValueError):
        SimOptions(step_ms=-1)


def test_vllm_engine_without_vllm_is_config_error() -> None:
    """engine=vllm without vLLM installed fails with a ConfigError saying what to install."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    with pytest.raises(ConfigError, match=r"firsttoken\[vllm\]"):
        make_engine(load_settings(engine="vllm", vllm_model_path="/nonexistent"))


@pytest.mark.parametrize("freeze", [False, True])
async def test_sim_server_freezes_its_start_up_heap_only_when_asked(freeze: bool) -> None:
    """`firsttoken sim-server` moves its start-up objects out of the collector's view once it
    has started, as `vllm serve` does; an app made for a test leaves the test's heap alone."""
    import gc

    from firsttoken.simserver import create_app

    app = create_app(SimOptions(), freeze_heap=freeze)
    gc.unfreeze()
    try:
        async with app.router.lifespan_context(app):
            assert (gc.get_freeze_count() > 0) is freeze
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("model", ["sim", 'odd "model" \\ é'])
@pytest.mark.parametrize("text", ["Lorem", " ipsum.", 'say "hi"\n', "\\", "é 中文 😀", ""])
def test_sim_server_token_event_is_the_generic_chunk_byte_for_byte(model: str, text: str) -> None:
    """The simulator's per-token fast path writes exactly the event the generic chunk would."""
    from firsttoken.simserver import _Events

    events = _Events("chatcmpl-1", model)
    assert events.content(text) == events.chunk({"content": text})
