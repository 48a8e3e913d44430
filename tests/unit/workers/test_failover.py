"""First-token failover: the pure decisions, and the stage driving in-process simulated engines."""

from __future__ import annotations

import time

import pytest

from shared.errors import DeadlineExceeded, EngineError, InvalidRequest
from shared.modeltable import ModelSpec, parse_models
from shared.protocol import Message
from workers.chat.generate import Failure, Generation, final_error, from_model, next_step
from workers.engines.base import Delta, Engine, EngineRequest
from workers.engines.deadlines import EngineStalled, FirstTokenTimeout
from workers.engines.sim import SimEngine, SimOptions

# --- pure decisions ---------------------------------------------------------------------------


def test_fail_over_only_before_the_first_token_and_while_models_remain() -> None:
    """Engine errors and deadlines fail over before the first token; never after it."""
    for error in (EngineError("down"), FirstTokenTimeout("slow")):
        assert next_step(error, first_token_seen=False, models_left=1) == "failover"
        assert next_step(error, first_token_seen=True, models_left=1) == "fail"
        assert next_step(error, first_token_seen=False, models_left=0) == "fail"
    assert next_step(InvalidRequest("bad"), first_token_seen=False, models_left=2) == "fail"


def test_final_error_keeps_a_single_failure_as_it_is() -> None:
    """With one model tried, the client gets that model's own error."""
    error = EngineError("engine at http://x unreachable")
    assert final_error([Failure("a", error)]) is error


def test_an_engine_error_is_told_with_the_model_name_and_keeps_its_detail() -> None:
    """The client reads which model failed; the engine's address stays in the detail only;
    deadline errors, which name their model already, are kept as they are."""
    error = EngineError("the engine returned HTTP 500: boom", detail="engine at http://x:1/v1")
    named = from_model(error, "big")
    assert type(named) is EngineError and named.__cause__ is error
    assert named.message == "model 'big': the engine returned HTTP 500: boom"
    assert named.detail == "engine at http://x:1/v1"
    stalled = EngineStalled("model 'big' stalled")
    slow = FirstTokenTimeout("model 'big' sent no first token")
    assert from_model(stalled, "big") is stalled and from_model(slow, "big") is slow


def test_final_error_is_timeout_only_if_every_model_was_too_slow() -> None:
    """All deadlines: `timeout`; any engine failure among them: `engine_error`; all named."""
    slow = [Failure("a", FirstTokenTimeout("a slow")), Failure("b", FirstTokenTimeout("b slow"))]
    err = final_error(slow)
    assert isinstance(err, DeadlineExceeded) and "a: a slow" in err.message
    mixed = [Failure("a", FirstTokenTimeout("a slow")), Failure("b", EngineError("b down"))]
    err = final_error(mixed)
    assert isinstance(err, EngineError) and "2 tried" in err.message and "b: b down" in err.message


# --- the stage over simulated engines ---------------------------------------------------------


class Engines:
    """One in-process SimEngine per model name, with chosen timings."""

    def __init__(self, **options: SimOptions) -> None:
        self.by_name: dict[str, SimEngine] = {n: SimEngine(o) for n, o in options.items()}

    def engine_for(self, spec: ModelSpec) -> Engine:
        return self.by_name[spec.name]


TABLE = parse_models(
    [
        {"name": "a", "engine": "sim", "fallbacks": ["b"]},
        {"name": "b", "engine": "sim"},
    ]
)
REQUEST = EngineRequest(messages=[Message(role="user", content="hi")], model="a", max_tokens=8)
FAST = SimOptions(ttft_ms=5, itl_ms=1, max_tokens=8)


async def _run(engines: Engines, asked: str | None, **kw: float) -> tuple[Generation, list[Delta]]:
    gen = Generation(
        engines,
        TABLE,
        REQUEST,
        asked=asked,
        request_id="r1",
        first_token_s=kw.get("first_token_s", 0.2),
        idle_s=kw.get("idle_s", 0.2),
    )
    return gen, [d async for d in gen.stream()]


async def test_a_healthy_model_answers_without_failover() -> None:
    """The asked model answers; `model` names it and nothing was given up."""
    engines = Engines(a=FAST, b=FAST)
    gen, deltas = await _run(engines, "a")
    assert gen.model == "a" and not gen.failures
    assert deltas[-1].finish_reason in ("stop", "length")
    assert engines.by_name["b"].stats.started == 0


async def test_no_first_token_in_time_moves_to_the_fallback_and_aborts_the_first() -> None:
    """A model slower than the deadline is aborted; the fallback answers and is named."""
    engines = Engines(a=SimOptions(ttft_ms=5_000), b=FAST)
    start = time.monotonic()
    gen, deltas = await _run(engines, "a", first_token_s=0.1)
    assert gen.model == "b" and [f.model for f in gen.failures] == ["a"]
    assert isinstance(gen.failures[0].error, FirstTokenTimeout)
    assert "".join(d.text for d in deltas) and time.monotonic() - start < 1.0
    assert engines.by_name["a"].stats.aborted == 1 and engines.by_name["a"].stats.running == 0


async def test_after_the_first_token_a_stall_is_an_engine_error_not_a_switch() -> None:
    """A model that goes silent mid-answer ends the stream with EngineStalled; b is untouched."""
    engines = Engines(a=SimOptions(ttft_ms=5, itl_ms=5_000, max_tokens=8), b=FAST)
    seen: list[Delta] = []
    gen = Generation(
        engines, TABLE, REQUEST, asked="a", request_id="r2", first_token_s=0.2, idle_s=0.1
    )
    with pytest.raises(EngineStalled, match="stalled"):
        async for delta in gen.stream():
            seen.append(delta)
    assert len(seen) == 1 and gen.model == "a"
    assert engines.by_name["b"].stats.started == 0
    assert engines.by_name["a"].stats.aborted == 1


async def test_every_model_too_slow_is_a_timeout_naming_each() -> None:
    """When the whole chain misses the deadline the chat ends `timeout`, listing every model."""
    engines = Engines(a=SimOptions(ttft_ms=5_000), b=SimOptions(ttft_ms=5_000))
    with pytest.raises(DeadlineExceeded) as err:
        await _run(engines, "a", first_token_s=0.05)
    assert "a: " in err.value.message and "b: " in err.value.message


async def test_unknown_model_is_invalid_request() -> None:
    """A job naming a model outside the table fails with invalid_request, starting no engine."""
    engines = Engines(a=FAST, b=FAST)
    with pytest.raises(InvalidRequest, match="a, b"):
        await _run(engines, "zz")
    assert engines.by_name["a"].stats.started == 0
