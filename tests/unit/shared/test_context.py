"""The conversation window: full history under the threshold, summary + recent window past it."""

from __future__ import annotations

from workers.conversation import StoredMessage, WindowRules, select_window, summary_prompt
from workers.prompt import counter_for

COUNTER = counter_for(None)


def _stored(n: int, text: str = "word " * 50) -> list[StoredMessage]:
    return [
        StoredMessage(i + 1, "user" if i % 2 == 0 else "assistant", f"{i}: {text}")
        for i in range(n)
    ]


def test_short_conversation_sends_everything() -> None:
    """Under the threshold every message is sent and no summary is asked for."""
    w = select_window(_stored(6), None, None, WindowRules(8000, 4), COUNTER)
    assert len(w.history) == 6 and w.summarize_upto is None


def test_long_conversation_sends_window_and_asks_for_summary() -> None:
    """Past the threshold only the recent window is sent; older messages go to the summary."""
    stored = _stored(80)
    w = select_window(stored, None, None, WindowRules(2000, 6), COUNTER)
    assert [m.content for m in w.history] == [m.content for m in stored[-6:]]
    assert w.summarize_upto == stored[-7].id
    assert w.history_tokens > 2000


def test_summaries_replace_old_turns() -> None:
    """Messages the summary covers are never sent again; the summary is."""
    stored = _stored(80)
    w = select_window(stored, "the gist", 74, WindowRules(2000, 6), COUNTER)
    assert w.summary == "the gist"
    assert all(int(m.content.split(":")[0]) >= 74 for m in w.history)
    assert w.summarize_upto is None


def test_window_starts_at_a_user_message() -> None:
    """An odd window size never opens with an assistant answer."""
    w = select_window(_stored(80), None, None, WindowRules(2000, 5), COUNTER)
    assert w.history[0].role == "user"


def test_summary_prompt_carries_previous_summary_and_turns() -> None:
    """The summariser sees the running summary and the new turns, and the word limit."""
    msgs = summary_prompt("old gist", _stored(2, "hi"), 120)
    assert "120 words" in msgs[0].content
    assert "old gist" in msgs[1].content and "0: hi" in msgs[1].content
