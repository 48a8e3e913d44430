"""The overlap verifier (workers/cache/verify.py, pure): the edit's shape adjusts a cosine."""

from __future__ import annotations

import pytest

from shared.protocol import Message
from shared.settings import Settings
from workers.cache.calibrated import CALIBRATION
from workers.cache.policy import Candidate, Policy, Query, judge
from workers.cache.stage import policy_from
from workers.cache.verify import (
    MAX_RAISE,
    MAX_TOKENS,
    SMALL_EDIT_PENALTY,
    content_tokens,
    shape,
    table_key,
    verified_score,
)


def test_content_tokens_drop_stop_words_and_fold_plurals() -> None:
    """The words of "How do I" carry no content; "funds" and "fund" are one word."""
    assert content_tokens("What is an index fund?") == content_tokens("What are index funds?")
    assert content_tokens("How do I do it?") == []


def test_a_one_span_substitution_is_a_small_edit() -> None:
    """Another product in an otherwise identical question: the shape of most traps."""
    s = shape("How do I cook brown rice?", "How do I cook wild rice?")
    assert s.small_edit and 0 < s.jaccard < 1
    assert shape("Suggest a gluten-free dinner for four", "Suggest a dinner for four").small_edit


def test_a_broad_rewording_is_not_a_small_edit_and_overlaps_little() -> None:
    s = shape("Why is the sky blue?", "What makes the sky look blue during the day?")
    assert not s.small_edit and s.jaccard < 0.5


def test_typos_and_fillers_change_nothing() -> None:
    """A misspelt word is folded into the word it misspells: a near repeat, not an edit."""
    s = shape("How do I reset my password?", "how do i resett my pasword??")
    assert s.jaccard == 1.0 and not s.small_edit


def test_verified_score_keeps_a_rewording_and_lowers_a_small_edit() -> None:
    """A rewording is trusted at its cosine: a different question on the same topic rewords
    as broadly ("change my email address" / "set up a new email account")."""
    reworded = verified_score(0.8, shape("Why is the sky blue?", "What makes the sky look blue?"))
    assert reworded == pytest.approx(0.8)
    small = verified_score(
        0.92, shape("A good vegetarian lasagna recipe", "A good meat lasagna recipe")
    )
    assert small == pytest.approx(0.92 - SMALL_EDIT_PENALTY)
    assert verified_score(
        0.95, shape("How do I reset my password?", "How do I reset my password")
    ) == (
        pytest.approx(1.0)  # the same words: a repeat
    )


def test_a_short_question_whose_only_word_flips_is_a_small_edit_not_a_rewording() -> None:
    """Nothing shared is still one span: "Is it open?" / "Is it closed?" (cosine 0.80) is
    lowered, not raised as a rewording would be."""
    assert shape("Is it open?", "Is it closed?").small_edit
    assert verified_score(0.8, shape("Is it open?", "Is it closed?")) == pytest.approx(0.6)


def test_verified_score_handles_empty_and_odd_text() -> None:
    """Empty, emoji-only, code and 100k-character questions score, never raise."""
    for text in ("", "   ", "🙂🙂", "```x = 1```", "word " * 20_000, "混合 mixed 文字"):
        assert isinstance(verified_score(0.9, shape(text, "How do I reset my password?")), float)
    assert len(content_tokens("word " * 20_000)) == MAX_TOKENS  # the alignment stays cheap


def _query(text: str) -> Query:
    return Query(
        Policy(), tenant="t", model="m", embedder="e",
        messages=[Message(role="user", content=text)], max_tokens=64, temperature=None,
    )  # fmt: skip


def _candidate(text: str) -> Candidate:
    return Candidate(text, "", _query(text).context, None, 1)


def test_judge_with_the_verifier_lets_a_rewording_past_one_sided_guards() -> None:
    """A rewording that names a number on one side only: the plain judge refuses it on the
    numbers guard, the verified one serves it at its cosine; a one-word substitution at 0.92 is
    refused with the verifier."""
    cached = "What is the legal drinking age in Japan?"
    asked = "At what age may you buy alcohol in Japan, is it 20?"
    plain, verified = Policy(threshold=0.8), Policy(threshold=0.8, verifier="overlap")
    assert judge(plain, _query(asked), _candidate(cached), 0.85, None) == "numbers"
    assert judge(verified, _query(asked), _candidate(cached), 0.85, None) is None
    assert judge(verified, _query(asked), _candidate(cached), 0.75, None) == "similarity"
    trap = ("What's a good vegetarian lasagna recipe?", "What's a good meat lasagna recipe?")
    assert judge(verified, _query(trap[1]), _candidate(trap[0]), 0.92, None) == "similarity"
    assert verified.min_score == pytest.approx(0.8 - MAX_RAISE) and plain.min_score == 0.8


def test_policy_from_uses_the_verified_table_and_falls_back_to_the_plain_cosine() -> None:
    """The default embedder has a verified table; a risk no verified threshold meets gives
    the plain cosine at its strictest, never a verified score against a cosine threshold."""
    name = "all-MiniLM-L6-v2-int8+cjk:use-multilingual-v3"
    assert table_key(name, "overlap") in CALIBRATION and table_key(name, "none") == name
    assert policy_from(Settings(), name).verifier == "overlap"
    strict = policy_from(Settings(cache_max_error_rate=0.001), name)
    assert strict.verifier == "none" and strict.threshold == 0.97
    assert policy_from(Settings(cache_verifier="none"), name).verifier == "none"


def test_a_changed_chinese_word_of_up_to_four_characters_is_a_small_edit() -> None:
    """A Chinese token is one character: "支付宝" / "微信" is one word replaced, not a
    rewording, so the character comparison still applies."""
    s = shape("支付宝怎么提现？", "微信怎么提现？")  # noqa: RUF001
    assert s.small_edit and not s.reworded
    assert shape("退款多久能到账？", "申请退款以后，钱大概几天能退回来？").reworded  # noqa: RUF001


def test_greetings_and_fillers_are_no_edit() -> None:
    """A greeting or filler around the same question is not a small edit to lower."""
    assert not shape("um, how do I cancel my order?", "How do I cancel my order?").small_edit
    assert not shape(
        "Thanks! And how do I thicken a sauce?", "How do I thicken a sauce?"
    ).small_edit
    assert not shape("what is 15 percent of 80", "What is 15% of 80?").small_edit


def test_judge_treats_a_rewording_leniently_and_a_small_edit_strictly() -> None:
    """A number on one side of a rewording does not veto it; one on one side of a small edit
    (a detail added to the same question) does."""
    policy = Policy(threshold=0.5, verifier="overlap")
    reworded = _query("At what age may you buy alcohol in Japan, is it 20?")
    candidate = _candidate("What is the legal drinking age in Japan?")
    assert judge(policy, reworded, candidate, 0.8, None) is None
    small = _query("How much is a 3-night stay?")
    assert judge(policy, small, _candidate("How much is a stay?"), 0.95, None) == "numbers"


def test_another_ending_is_another_word_not_a_typo() -> None:
    """ "employer" / "employee" differ in their last letter: two roles, not a misspelling."""
    assert shape("Can my employer see my email?", "Can my employee see my email?").small_edit
    assert not shape("How do I resett it?", "How do I reset it?").small_edit


def test_asking_for_an_explanation_is_no_edit() -> None:
    assert not shape("What is an index fund?", "Can you explain what index funds are?").small_edit


def test_the_same_words_with_a_typo_or_a_filler_are_a_near_repeat() -> None:
    """A typo costs the cosine far more than the meaning: the same words in the same order
    score as the same text, and the guards decide. A question word is a word ("how" / "why")."""
    s = shape("What is the baggage alowance?", "What is the baggage allowance?")
    assert s.repeat and verified_score(0.8, s) == pytest.approx(1.0)
    assert shape("um, how do I cancel my order?", "How do I cancel my order?").repeat
    assert not shape("How do I cook rice?", "Why do I cook rice?").repeat
    assert not shape("Can my employer read my email?", "Can my employee read my email?").repeat


def test_a_long_text_read_only_by_its_head_is_no_repeat() -> None:
    """Two long texts alike for their first words may ask different things at the end."""
    text = "Here is my email draft: " + "we met last week and agreed on the plan. " * 20
    assert not shape(text + "Summarize it.", text + "Translate it into French.").repeat


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Define 'affect'", "Define 'effect'"),  # two words of the dictionary
        ("What does the file /etc/hosts do?", "What does the file /etc/hostname do?"),  # a path
        ("What's new in Python 3.11?", "What's new in Python 3.12?"),
    ],
)
def test_two_words_alike_are_not_one_mistyped(a: str, b: str) -> None:
    assert not shape(a, b).repeat


def test_a_mistyped_word_or_another_form_of_it_is_folded() -> None:
    assert shape("What is the baggage allowance?", "What is the baggage alowance?").repeat
    assert shape("Do you ship internationally?", "Do you ship international?").repeat


def test_one_long_span_changed_around_agreeing_words_is_an_edit_not_a_rewording() -> None:
    """ "to a five year old" / "to a physicist" changes who the answer is for: the guards
    compare it as strictly as a small edit (here: a number named on one side)."""
    edit = shape(
        "Explain quantum computing to a five year old", "Explain quantum computing to a physicist"
    )
    assert edit.one_span and not edit.reworded
    assert shape(
        "What is inflation and why does it happen?", "Why do prices generally rise over time?"
    ).reworded
