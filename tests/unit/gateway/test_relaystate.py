"""The gateway's per-job relay decisions: ordering, gaps, repair, done timings."""

from __future__ import annotations

import json

from gateway.relaystate import Followers, Leave, RelayState, usage_total
from shared.protocol import dumps, encode_chunk, encode_started, encode_token


def tok(seq: int, text: str = "x", chat_id: str = "c") -> str:
    return encode_chunk("T", encode_token(chat_id, seq, text), seq)


def done(chunks: int) -> str:
    return encode_chunk(
        "D",
        dumps(
            {
                "type": "done",
                "id": "c",
                "cached": False,
                "model": "m",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 1, "completion_tokens": chunks},
                "chunks": chunks,
                "points": {"enqueued": 100.001, "worker_start": 100.002},
            }
        ),
    )


def test_in_order_tokens_are_forwarded_verbatim() -> None:
    """Tokens in seq order go out unchanged, and the first send time is recorded."""
    s = RelayState("c", received_at=100.0)
    step = s.feed(tok(0, "Hi"), now=100.05)
    assert step.frames == [encode_token("c", 0, "Hi")] and s.first_sent_at == 100.05
    assert s.feed(tok(1), 100.06).frames and s.next_seq == 2


def test_done_frame_gets_gateway_timings_and_loses_internal_fields() -> None:
    """`done` carries ttft/total/queue timings and no internal `chunks`/`points`."""
    s = RelayState("c", received_at=100.0)
    s.feed(tok(0), 100.010)
    step = s.feed(done(1), 100.020)
    frame = json.loads(step.frames[0])
    assert step.finished and "chunks" not in frame and "points" not in frame
    assert frame["timings"]["ttft_ms"] == 10.0 and frame["timings"]["total_ms"] == 20.0
    assert frame["timings"]["queue_ms"] == 1.0
    assert step.used == 2  # prompt + completion tokens, for the rate limiter's settlement


def test_used_tokens_only_from_a_done_with_usable_usage() -> None:
    assert RelayState("c", received_at=100.0).feed(tok(0), 100.01).used is None
    assert usage_total({"prompt_tokens": "3", "completion_tokens": 4}) == 7
    assert usage_total({}) == 0
    assert usage_total({"prompt_tokens": "many"}) is None
    assert usage_total(None) is None


def test_a_gap_holds_messages_and_repair_restores_order() -> None:
    """A missing seq triggers a repair; the replay log fills the gap, held messages follow."""
    s = RelayState("c", received_at=0.0)
    s.feed(tok(0), 1.0)
    step = s.feed(tok(2), 1.0)
    assert step.repair and not step.frames
    assert s.feed(tok(3), 1.0).frames == []  # held while the repair runs
    repaired = s.apply_repair([tok(0), tok(1), tok(2)], 1.1)
    assert [json.loads(f)["seq"] for f in repaired.frames] == [1, 2, 3]
    assert s.holding is None and s.next_seq == 4


def test_unrepairable_gap_ends_with_engine_error() -> None:
    """If the replay log lacks the missing tokens, the chat ends with `engine_error`."""
    s = RelayState("c", received_at=0.0)
    s.feed(tok(1), 1.0)
    step = s.apply_repair([], 1.1)
    assert step.finished and json.loads(step.frames[0])["code"] == "engine_error"


def test_done_before_all_tokens_waits_for_repair() -> None:
    """A `done` announcing more chunks than were seen is held until the log is read."""
    s = RelayState("c", received_at=0.0)
    s.feed(tok(0), 1.0)
    assert s.feed(done(2), 1.0).repair
    step = s.apply_repair([tok(0), tok(1), done(2)], 1.2)
    types = [json.loads(f)["type"] for f in step.frames]
    assert types == ["token", "done"] and step.finished


def test_resume_under_a_new_id_renames_frames_and_skips_old_tokens() -> None:
    """A resume replays only seq > after_seq, under the resuming chat id."""
    s = RelayState("new", received_at=0.0, next_seq=2, rename=True)
    s.begin_repair()
    step = s.apply_repair([tok(0), tok(1), tok(2), done(3)], 1.0)
    frames = [json.loads(f) for f in step.frames]
    assert [f.get("seq") for f in frames] == [2, None]
    assert all(f["id"] == "new" for f in frames)


def test_a_lone_follower_giving_up_cancels_the_job_and_frees_its_slot_once() -> None:
    """One socket, gone mid-answer: unsubscribe, cancel the worker, settle; a second stop
    of the same follower decides nothing."""
    followers: Followers[str] = Followers()
    followers.join("a")
    assert followers.leave("a", ended=False) == Leave(unsubscribe=True, cancel=True, settle=True)
    assert followers.leave("a", ended=False) is None


def test_a_follower_leaving_while_another_follows_keeps_the_job_running() -> None:
    """The original socket closes while a resume follows: no cancel, no settlement yet; the
    resumer's end then settles once, and a job that ended is never cancelled."""
    followers: Followers[str] = Followers()
    followers.join("original")
    followers.join("resumer")
    assert followers.leave("original", ended=False) == Leave(
        unsubscribe=False, cancel=False, settle=False
    )
    assert followers.leave("resumer", ended=True) == Leave(
        unsubscribe=True, cancel=False, settle=True
    )


def test_the_job_ending_settles_at_the_first_follower_that_sees_it() -> None:
    """Both sockets relay the done: the slot is freed at the first one, not again at the
    second, and the channel goes with the last."""
    followers: Followers[str] = Followers()
    followers.join("a")
    followers.join("b")
    first = followers.leave("b", ended=True)
    second = followers.leave("a", ended=True)
    assert first == Leave(unsubscribe=False, cancel=False, settle=True)
    assert second == Leave(unsubscribe=True, cancel=False, settle=False)


def test_the_last_follower_giving_up_after_an_end_does_not_cancel() -> None:
    """One follower relayed the done; the other then disconnects before relaying it: the
    finished job is not cancelled and its slot is not settled twice."""
    followers: Followers[str] = Followers()
    followers.join("a")
    followers.join("b")
    followers.leave("a", ended=True)
    assert followers.leave("b", ended=False) == Leave(unsubscribe=True, cancel=False, settle=False)


def test_the_answering_model_comes_from_the_first_token_chunks_header() -> None:
    """The frame goes out as it came (the header is the worker's, not the client's); a later
    chunk naming no model leaves it."""
    s = RelayState("c", received_at=100.0, model="asked")
    first = encode_chunk("T", encode_token("c", 0, "x"), 0, 1, "large")
    assert s.feed(first, 100.01).frames == [encode_token("c", 0, "x")]
    assert s.model == "large"
    assert s.feed(encode_chunk("T", encode_token("c", 1, "y"), 1, 2), 100.02).frames
    assert s.model == "large"


def test_the_answering_model_comes_from_the_started_before_the_first_token() -> None:
    """`auto` routed: the worker's `started` names the model; the worker's own one does not
    erase it, and nothing is forwarded for either."""
    s = RelayState("c", received_at=100.0)
    named = encode_chunk("S", encode_started(100.01, model="large"))
    assert s.feed(named, 100.01).frames == [] and s.model == "large"
    assert s.feed(encode_chunk("S", encode_started(100.02, worker="w")), 100.02).frames == []
    assert (s.model, s.worker) == ("large", "w")
