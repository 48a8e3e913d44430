"""The pure core of a chat worker's death (shared/failover.py): who is lost, what a takeover
does with the replay log, the continuation request, the gateway's verdict; and the simulator
continuing an answer as vLLM's `continue_final_message` does."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from firsttoken.simserver import _BadRequest, parse_chat_request
from shared.failover import TAKEOVER_GRACE_S, delivered_tokens, owner_verdict, started_worker
from shared.protocol import (
    CHUNK_DONE,
    CHUNK_ERROR,
    CHUNK_STARTED,
    CHUNK_TOKEN,
    Message,
    chunk_model,
    chunk_tokens,
    decode_chunk,
    encode_chunk,
    encode_started,
    encode_token,
)
from workers.chat.takeover import continuation_request, lost_workers, plan_takeover
from workers.engines.base import EngineRequest
from workers.engines.sim import SimEngine, SimOptions, plan_answer, plan_continuation


def token(seq: int, text: str, tokens: int | None) -> str:
    return encode_chunk(CHUNK_TOKEN, encode_token("c", seq, text), seq, tokens)


STARTED = encode_chunk(CHUNK_STARTED, encode_started(1.0, worker="w1"))


def request(max_tokens: int = 40) -> EngineRequest:
    return EngineRequest(
        messages=[Message(role="user", content="tell me more")], model="sim", max_tokens=max_tokens
    )


# --- chunk headers ---------------------------------------------------------------------


def test_a_token_chunk_carries_its_count_and_still_decodes_to_its_seq() -> None:
    message = token(7, "Lorem", 12)
    assert decode_chunk(message)[:2] == (CHUNK_TOKEN, 7)
    assert chunk_tokens(message) == 12
    assert chunk_tokens(token(7, "x", None)) is None
    assert decode_chunk(token(7, "x", None))[1] == 7


def test_a_workers_first_token_chunk_names_the_answering_model_in_its_header() -> None:
    """Any name (colons, a newline) survives the header; the count and the seq still read."""
    for model in ("large", "llama3.1:8b", "odd\nname"):
        frame = encode_token("c", 0, "Lorem")
        message = encode_chunk(CHUNK_TOKEN, frame, 0, 1, model)
        assert decode_chunk(message) == (CHUNK_TOKEN, 0, frame)
        assert (chunk_tokens(message), chunk_model(message)) == (1, model)
    assert chunk_model(token(1, "x", 2)) is None
    assert chunk_model(token(1, "x", None)) is None


def test_the_started_chunk_names_its_worker() -> None:
    assert started_worker(encode_started(1.0, worker="chat-a@h")) == "chat-a@h"
    assert started_worker(encode_started(1.0)) is None
    assert started_worker("not json") is None


# --- the survivor's side ---------------------------------------------------------------


def test_a_worker_is_lost_once_its_beat_is_lost_s_old_and_never_oneself() -> None:
    beats = {"a": 100.0, "b": 98.0, "me": 90.0, "c": 97.9}
    assert lost_workers(beats, now=100.0, lost_s=2.0, me="me") == ["b", "c"]


def test_a_log_with_its_done_or_error_needs_nothing() -> None:
    done = encode_chunk(CHUNK_DONE, "{}")
    error = encode_chunk(CHUNK_ERROR, "{}")
    assert plan_takeover([STARTED, token(0, "A", 1), done]).kind == "ended"
    assert plan_takeover([STARTED, error]).kind == "ended"


def test_a_chat_with_no_token_sent_is_run_again_from_the_start() -> None:
    assert plan_takeover([STARTED]).kind == "rerun"
    assert plan_takeover([]).kind == "rerun"


def test_a_chat_cut_mid_answer_continues_from_the_text_the_next_seq_and_the_count() -> None:
    log = [STARTED, token(0, "Lorem", 1), token(1, " ipsum dolor", 3), token(1, " ipsum dolor", 3)]
    plan = plan_takeover(log)
    assert (plan.kind, plan.text, plan.next_seq, plan.tokens) == (
        "continue",
        "Lorem ipsum dolor",
        2,
        3,
    )


def test_a_cut_cache_replay_or_a_hole_in_the_log_is_not_continued() -> None:
    assert plan_takeover([token(0, "Cached answer", None)]).kind == "fail"
    hole = plan_takeover([token(0, "A", 1), token(2, " c", 3)])
    assert (hole.kind, hole.next_seq, hole.tokens) == ("fail", 1, 1)


def test_the_continuation_request_ends_with_the_partial_answer_and_the_rest_of_the_budget() -> None:
    cont = continuation_request(request(40), "Lorem ipsum", 2)
    assert cont.continue_final and cont.max_tokens == 38
    assert [m.role for m in cont.messages] == ["user", "assistant"]
    assert cont.messages[-1].content == "Lorem ipsum"
    assert continuation_request(request(4), "a b c d", 4).max_tokens == 1


# --- the gateway's side ----------------------------------------------------------------


def test_a_fresh_owner_is_alive_and_a_missing_one_is_left_to_the_idle_deadline() -> None:
    assert owner_verdict("a", {"a": 99.5}, checked_at=100.0, lost_s=2.0) == "alive"
    assert owner_verdict("gone", {"a": 99.5}, checked_at=100.0, lost_s=2.0) == "alive"


def test_a_lost_owner_with_no_other_worker_is_given_up_at_once() -> None:
    assert owner_verdict("a", {"a": 98.0}, checked_at=100.0, lost_s=2.0) == "give_up"
    assert owner_verdict("a", {"a": 98.0, "b": 97.0}, checked_at=100.0, lost_s=2.0) == "give_up"


def test_a_lost_owner_with_a_survivor_is_waited_for_during_the_grace() -> None:
    beats = {"a": 98.0, "b": 99.9}
    assert owner_verdict("a", beats, checked_at=100.0, lost_s=2.0) == "wait"
    late = 98.0 + 2.0 + TAKEOVER_GRACE_S
    assert owner_verdict("a", {"a": 98.0, "b": late}, checked_at=late, lost_s=2.0) == "give_up"


def test_the_tokens_delivered_are_the_last_token_chunks_count() -> None:
    assert delivered_tokens([STARTED, token(0, "A", 1), token(1, " b c", 3)]) == 3
    assert delivered_tokens([STARTED]) == 0
    assert delivered_tokens([token(0, "cached", None)]) == 0


# --- the simulator continues an answer ---------------------------------------------------


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_the_simulator_continues_an_answer_into_the_answer_it_would_have_given(cut: int) -> None:
    whole, reason = plan_answer(request(200), 64)
    prefix = "".join(whole[:cut])
    rest, rest_reason = plan_continuation(continuation_request(request(200), prefix, cut), 64)
    assert prefix + "".join(rest) == "".join(whole) and rest_reason == reason


def test_a_continuation_keeps_the_original_budget() -> None:
    whole, _ = plan_answer(request(10), 64)  # cut by max_tokens: "length"
    cont = continuation_request(request(10), "".join(whole[:4]), 4)
    rest, reason = plan_continuation(cont, 64)
    assert "".join(whole[:4] + rest) == "".join(whole) and reason == "length"


def test_the_in_process_simulator_streams_the_rest_of_the_answer() -> None:
    async def go() -> str:
        engine = SimEngine(SimOptions(ttft_ms=0, itl_ms=0, max_tokens=32))
        whole, _ = plan_answer(request(), 32)
        cont = continuation_request(request(), "".join(whole[:3]), 3)
        async with aclosing(engine.stream(cont, request_id="r")) as deltas:
            text = "".join([d.text async for d in deltas])
        return "".join(whole[:3]) + text

    assert asyncio.run(go()) == "".join(plan_answer(request(), 32)[0])


def test_the_sim_server_reads_vllms_continuation_extras_and_refuses_what_vllm_refuses() -> None:
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    assert parse_chat_request(body, "sim", 16).continue_final
    with pytest.raises(_BadRequest):
        parse_chat_request({**body, "add_generation_prompt": True}, "sim", 16)
    with pytest.raises(_BadRequest):
        parse_chat_request({**body, "messages": body["messages"][:1]}, "sim", 16)
    assert not parse_chat_request(
        {**body, "continue_final_message": False}, "sim", 16
    ).continue_final


def test_a_chat_that_had_moved_to_a_fallback_model_is_continued_by_that_model() -> None:
    moved = encode_chunk(CHUNK_STARTED, encode_started(2.0, {"from": "big", "to": "small"}))
    plan = plan_takeover([STARTED, moved, token(0, "Lorem", 1)])
    assert (plan.kind, plan.model) == ("continue", "small")
    assert plan_takeover([STARTED, token(0, "Lorem", 1)]).model is None


def test_a_chat_still_streaming_is_alive_whatever_its_workers_beat_says() -> None:
    beats = {"a": 90.0}
    verdict = owner_verdict("a", beats, checked_at=100.0, lost_s=2.0, quiet_s=0.2, min_quiet_s=1)
    assert verdict == "alive"
    quiet = owner_verdict("a", beats, checked_at=100.0, lost_s=2.0, quiet_s=1.5, min_quiet_s=1)
    assert quiet == "give_up"


def test_a_routed_chat_is_continued_by_the_model_its_first_token_chunk_named() -> None:
    moved = encode_chunk(CHUNK_STARTED, encode_started(2.0, {"from": "big", "to": "small"}))
    first = encode_chunk(CHUNK_TOKEN, encode_token("c", 0, "Lorem"), 0, 1, "large")
    plan = plan_takeover([STARTED, moved, first, token(1, " ipsum", 2)])
    assert (plan.kind, plan.model, plan.text) == ("continue", "large", "Lorem ipsum")


def test_a_routed_chat_is_continued_by_the_model_its_started_named_before_the_first_token() -> None:
    named = encode_chunk(CHUNK_STARTED, encode_started(2.0, model="large"))
    plan = plan_takeover([STARTED, named, token(0, "Lorem", 1)])
    assert (plan.kind, plan.model) == ("continue", "large")
