# ruff: noqa: RUF001, E501  (Chinese punctuation in test data)
"""Guards and normalisation of the semantic cache (pure, no model)."""

from __future__ import annotations

import pytest

from shared.protocol import Message
from workers.cache.guards import disagreement, features
from workers.cache.normalize import canonical, exact_key, normalize, split_turn
from workers.cache.policy import Candidate, Policy, Query, judge


def _differ(a: str, b: str) -> str | None:
    return disagreement(features(a), features(b))


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("Is it safe to take aspirin with ibuprofen?", "Is it unsafe to take aspirin with ibuprofen?", "negation_prefix"),
        ("Track order 48213", "Track order 48231", "numbers"),
        ("What's the weather in Paris tomorrow?", "What's the weather in London tomorrow?", "entities"),
        ("Is the museum open on Monday?", "Is the museum open on Sunday?", "dates"),
        ("How do I enable dark mode?", "How do I disable dark mode?", "antonym"),
        ("How do I delete my files?", "How do I delete all files?", "scope"),
        ("Why does my phone charge?", "Why does my phone not charge?", "negation"),
        ("What foods should I eat before a run?", "What foods should I avoid before a run?", "negation"),
        ("Can I get a refund within 14 days?", "Can I get a refund after 14 days?", "antonym"),
        ("阿司匹林和布洛芬一起吃安全吗？", "阿司匹林和布洛芬一起吃不安全吗？", "negation"),
        ("北京今天天气怎么样？", "上海今天天气怎么样？", "zh_content"),
        ("二十三路公交几点收车？", "三十二路公交几点收车？", "numbers"),
        ("今天天气怎么样？", "明天天气怎么样？", "dates"),
        ("What time does the museum open on weekdays?", "What time does the museum open on weekends?", "dates"),
        ("My suitcase weighs 23 kg, is that too heavy?", "My suitcase weighs 23 lb, is that too heavy?", "units"),
        ("How long do I bake bread at 200 c?", "How long do I bake bread at 200 f?", "units"),
        ("What is 100 dollars in yen?", "What is 100 dollars in euros?", "units"),
        ("Is Rust harder to learn than Go?", "Is Go harder to learn than Rust?", "order"),
        ("How do I move files from my phone to my laptop?", "How do I move files from my laptop to my phone?", "order"),
        ("上海夏天比北京热吗？", "北京夏天比上海热吗？", "order"),
        ("My neighbour owes me money, what can I do?", "I owe my neighbour money, what can I do?", "actor"),
    ],
)  # fmt: skip
def test_traps_disagree(a: str, b: str, reason: str) -> None:
    """Each kind of trap is caught by the guard meant for it."""
    assert _differ(a, b) == reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I reset my password?", "how can i reset my password"),
        ("I can't log in to my account", "I cannot log in to my account"),
        ("今天北京天气怎么样？", "北京今天天气如何？"),
        ("订单二十三号在哪", "订单23号在哪"),
        ("怎么重置密码？", "请问如何重置密码呢？"),
        ("I weigh 70 kilograms, is that healthy?", "I weigh 70 kg, is that healthy?"),
        (
            "What's the difference between TCP and UDP?",
            "What's the difference between UDP and TCP?",
        ),
        ("How do I sort a list in Python?", "In Python, how do I sort a list?"),
        ("Is the shop open on Sundays?", "Is the shop open on Sunday?"),
    ],
)
def test_paraphrases_agree(a: str, b: str) -> None:
    """Wording differences that keep the answer pass every guard."""
    assert _differ(a, b) is None


def test_normalize_folds_case_width_space_and_edge_punctuation() -> None:
    """The exact tier treats case, full-width forms, spacing and end punctuation as equal."""
    assert normalize("  What IS   Docker？ ") == normalize("what is docker") == "what is docker"


def test_canonical_folds_chinese_fillers_and_synonyms() -> None:
    """Polite fillers and interchangeable question words are folded for comparison."""
    assert canonical("请问怎么重置密码呢？") == canonical("如何重置密码")


def test_exact_key_depends_on_tenant_model_context_and_sampling() -> None:
    """Any change that can change the answer changes the exact key."""
    msgs = [Message(role="user", content="hi")]
    base = {"tenant": "t", "model": "m", "messages": msgs, "max_tokens": 10, "temperature": None}
    key = exact_key(**base)  # type: ignore[arg-type]
    assert key == exact_key(**{**base, "messages": [Message(role="user", content="HI ")]})  # type: ignore[arg-type]
    for change in (
        {"tenant": "u"},
        {"model": "n"},
        {"max_tokens": 11},
        {"temperature": 0.5},
        {"messages": [Message(role="system", content="be brief"), *msgs]},
    ):
        assert exact_key(**{**base, **change}) != key, change  # type: ignore[arg-type]


def test_split_turn_keeps_every_earlier_turn() -> None:
    """The context is the whole conversation before the question, its first turn included (a
    detail there can change the answer); the system prompt is kept apart."""
    msgs = [Message(role="system", content="S")] + [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"m{i}") for i in range(7)
    ]
    turn = split_turn(msgs)
    assert turn.system == "s" and turn.question == "m6"
    assert [c for _, c in turn.context] == [f"m{i}" for i in range(6)]


def _query(messages: list[Message]) -> Query:
    return Query(
        Policy(), tenant="t", model="m", embedder="e", messages=messages, max_tokens=64,
        temperature=None,
    )  # fmt: skip


def _candidate(query: Query) -> Candidate:
    return Candidate(
        question=query.raw_question,
        context=query.turn.context_text,
        context_key=query.context,
        context_vector=None,
        completion_tokens=1,
    )


def test_judge_serves_only_what_the_model_read_differently() -> None:
    """A model that reads 40 characters scores two texts alike in those as one: they may be
    served for each other only if they agree past them. A difference up front is read."""
    report = "Read this report and tell me the root cause. Disk full on db-2; fixed by cleanup."
    other = "Read this report and tell me the root cause. Bad firewall rule; fixed by revert."
    reworded = (
        "Please read this report: what was the root cause? Disk full on db-2; fixed by cleanup."
    )

    def read40(text: str) -> int:
        return min(len(text), 40)

    def ask(a: str, b: str) -> str | None:
        cached = _query([Message(role="user", content=a)])
        return judge(
            Policy(),
            _query([Message(role="user", content=b)]),
            _candidate(cached),
            0.99,
            None,
            read40,
        )

    assert ask(report, other) == "unread"
    assert ask(report, report.lower()) is None
    short_a, short_b = (
        "Read this report and tell me the cause.",
        "Read this report; what is the cause?",
    )
    assert ask(short_a, short_b) is None  # read whole
    assert ask(report, reworded) == "unread"  # the difference reaches past what was read
    head = "Summarise: " + report
    assert ask(head, "Give me a summary: " + report) is None  # only the front differs
    # A model that reads every text whole (`len`, the default) leaves it to the guards.
    cached = _query([Message(role="user", content=report)])
    assert (
        judge(
            Policy(), _query([Message(role="user", content=other)]), _candidate(cached), 0.99, None
        )
        != "unread"
    )


def test_judge_serves_a_conversation_only_after_the_same_earlier_turns() -> None:
    """By default the earlier turns must be the same, however similar: a follow-up after
    order 90317 is not answered from one after order 90371, nor from the question alone."""

    def convo(order: str, question: str) -> list[Message]:
        return [
            Message(role="user", content=f"Where is order {order}?"),
            Message(role="assistant", content=f"Order {order} shipped yesterday."),
            Message(role="user", content=question),
        ]

    cached = _query(convo("90317", "When will it arrive?"))
    assert (
        judge(
            Policy(), _query(convo("90317", "when will it arrive")), _candidate(cached), 0.99, None
        )
        is None
    )
    assert (
        judge(
            Policy(), _query(convo("90371", "When will it arrive?")), _candidate(cached), 0.99, None
        )
        == "context"
    )
    alone = _query([Message(role="user", content="When will it arrive?")])
    assert judge(Policy(), alone, _candidate(cached), 0.99, None) == "context"
    assert _query(convo("1", "x")).embed_texts == ["x"]  # no context embedding by default


ODD_TEXTS = [
    "",
    "   \n\t ",
    "🙂🙂🙂",
    "Wie geht's? 你好 مرحبا こんにちは 123",
    "```python\nfor i in range(10):\n    print(i)\n```",
    "x" * 100_000,
    " ".join(f"w{i}" for i in range(20_000)),
]


@pytest.mark.parametrize("text", ODD_TEXTS, ids=lambda t: repr(t[:12]))
def test_odd_questions_never_crash_a_guard(text: str) -> None:
    """Empty, whitespace, emoji-only, mixed-script, code and 100k-character questions are
    compared like any other; a question always agrees with itself."""
    for other in ODD_TEXTS:
        disagreement(features(text), features(other))
    assert disagreement(features(text), features(text)) is None


def test_a_long_reordered_text_is_refused_without_a_quadratic_search() -> None:
    """Two long texts with the same words in another order are not served from each other."""
    words = [f"w{i}" for i in range(20_000)]
    assert _differ(" ".join(words), " ".join(reversed(words))) == "order"


def test_requests_never_share_a_partition_across_models_or_system_prompts() -> None:
    """The semantic index searched depends on the model and the system prompt."""

    def query(model: str, system: str) -> Query:
        msgs = [Message(role="system", content=system), Message(role="user", content="hi")]
        return Query(
            Policy(), tenant="t", model=model, embedder="e", messages=msgs, max_tokens=8,
            temperature=None,
        )  # fmt: skip

    keys = {query(m, s).partition for m in ("a", "b") for s in ("be brief", "be long")}
    assert len(keys) == 4


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("how do I parse json in python", "How do I parse JSON in Python?"),
        ("what's the capital of peru", "What's the capital of Peru?"),
        ("My printer wont print", "My printer won't print"),
        ("Whats the fee for a late return", "What's the fee for a late return?"),
        ("dont know my login, what now", "don't know my login, what now"),
    ],
)
def test_near_repeats_agree_whatever_the_case_or_apostrophes(a: str, b: str) -> None:
    """A name typed in lower case is the same name; "wont" is "won't" typed fast."""
    assert _differ(a, b) is None


def test_bare_contractions_expand_as_words_only() -> None:
    assert canonical("Whats up, I cant login") == "what is up, i can not login"
    assert canonical("wonton soup recipe") == "wonton soup recipe"


@pytest.mark.parametrize(
    ("a", "b", "strict"),
    [
        # One side names a number, a date, a unit or a name the other puts in words.
        ("What is the legal drinking age in Japan?", "At what age may you buy alcohol in Japan, is it 20?", "numbers"),
        ("How often should I back up my laptop?", "Should I make a backup of my laptop weekly?", "dates"),
        ("How much water does a lawn need?", "How many litres of water should I give my grass?", "units"),
        ("How do I undo a commit?", "What is the way to revert a change I made in Git?", "entities"),
        ("退款多久能到账？", "申请退款以后，钱大概几天能退回来？", "zh_content"),
    ],
)  # fmt: skip
def test_a_broad_rewording_is_refused_only_for_what_both_name(a: str, b: str, strict: str) -> None:
    """Strictly compared, each pair differs; as a rewording, only a value named on both
    sides and differing would veto, and none is."""
    assert _differ(a, b) == strict
    assert disagreement(features(a), features(b), reworded=True) is None


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("How many days of leave do I get in 2024?", "In 2025, what's my annual leave allowance?", "numbers"),
        ("Can I fly from Paris with a cat?", "Is it allowed to take a pet on a flight out of Rome?", "entities"),
        ("Is it safe to drink tap water here?", "Would drinking water from the tap be dangerous?", "antonym"),
        ("Can I return an item I used?", "Is it possible to send back something unused?", "negation_prefix"),
        ("How do I delete my photos?", "What's the way to erase all the pictures?", "scope"),
        ("怎么把肉冷冻保存？", "冷冻过的肉应该怎样解冻？", "antonym"),
    ],
)  # fmt: skip
def test_a_broad_rewording_is_still_refused_when_both_name_different_things(
    a: str, b: str, reason: str
) -> None:
    """Names, numbers, opposite words, negation and scope on both sides still decide."""
    assert disagreement(features(a), features(b), reworded=True) == reason


def test_the_chinese_yes_no_form_is_no_negation() -> None:
    """ "要不要" / "会不会" ask a question; "不要" says no."""
    assert _differ("去日本要签证吗？", "去日本要不要签证？") is None
    assert _differ("去日本要签证吗？", "去日本不要签证吗？") == "negation"


def test_a_possessive_names_its_word() -> None:
    """ "everyone's salaries" is a scope word, as "everyone" is."""
    assert _differ("Can I see my team's salaries?", "Can I see everyone's salaries?") == "scope"


def test_who_acts_is_compared_in_a_rewording_too() -> None:
    """A role swap is often worded anew: the actor still decides."""
    a = "My landlord is suing me for unpaid rent, what should I do?"
    b = "What should I do when I take my tenant to court over rent they owe?"
    assert disagreement(features(a), features(b), reworded=True) == "actor"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I write a reference letter for my former employee?", "How do I ask my former employer for a reference letter?"),
        ("Can my landlord keep the deposit for small scratches?", "Can I keep my tenant's deposit for small scratches?"),
        ("房东可以随便进我租的房子吗？", "租客可以随便进房东的房子吗？"),
        ("Can the insurer cancel the policy at any time?", "Can the policyholder cancel the policy at any time?"),
        ("网约车司机有哪些权利？", "网约车乘客有哪些权利？"),
    ],
)  # fmt: skip
def test_the_other_side_of_a_relation_is_another_question(a: str, b: str) -> None:
    """Employer / employee, landlord / tenant: who the question is about decides the answer."""
    assert disagreement(features(a), features(b), reworded=True) in ("role", "actor")
    assert disagreement(features(a), features(b)) is not None


def test_a_role_named_in_the_plural_is_the_same_role() -> None:
    assert (
        _differ("What must employers pay for overtime?", "What must an employer pay for overtime?")
        is None
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How can I speed up my computer's fan?", "How can I slow down my computer's fan?"),
        ("How do I freeze fresh basil?", "How do I thaw frozen basil?"),
        ("Fun party ideas for kids indoors", "Fun party ideas for kids outdoors"),
    ],
)
def test_opposite_phrases_disagree(a: str, b: str) -> None:
    assert _differ(a, b) == "antonym"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("后车追尾了我，谁来赔？", "我追尾了别人的车，谁来赔偿损失？"),
        ("朋友欠我两百块不还怎么办？", "我欠朋友两百块还不上怎么办？"),
        ("房东起诉我拖欠房租，怎么应对？", "我想告租客拖欠房租，该怎么处理？"),
    ],
)  # fmt: skip
def test_who_acts_in_chinese_is_read_from_where_wo_stands(a: str, b: str) -> None:
    """我 is "I" at the start of a clause and "me" after a verb or a preposition: "后车追尾了我"
    (someone hit me) and "我追尾了别人" (I hit someone) ask two things, even reworded."""
    assert disagreement(features(a), features(b), reworded=True) == "actor"


@pytest.mark.parametrize(
    ("text", "actor"),
    [
        ("我要起诉租客", "self"),
        ("如果我辞职了，年假怎么算？", "self"),
        ("护照丢了，我该怎么办？", "self"),
        ("我的护照丢了怎么办？", "other"),
        ("老板让我周末加班合法吗？", "other"),
        ("周末加班合法吗？", ""),
        ("这个我不太懂", ""),
    ],
)  # fmt: skip
def test_the_chinese_actor(text: str, actor: str) -> None:
    assert features(text).actor == actor


def test_sides_exchanged_around_a_possessive_are_another_question() -> None:
    """ "the tenant's permission" names the tenant as "the tenant" does: the sides swapped."""
    assert (
        _differ(
            "Can a landlord enter the flat without the tenant's permission?",
            "Can a tenant enter the flat without the landlord's permission?",
        )
        == "order"
    )


def test_an_article_beside_a_symmetric_word_keeps_it_symmetric() -> None:
    """ "the buyer or the seller" asks what "the seller or the buyer" asks."""
    assert (
        _differ(
            "Who pays the closing costs, the buyer or the seller?",
            "Who pays the closing costs, the seller or the buyer?",
        )
        is None
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What should I do if my dog bit someone?", "What should I do if someone's dog bit me?"),
        ("What should I do if I hit someone with my car?", "What should I do if someone hit me with their car?"),
    ],
)  # fmt: skip
def test_behind_a_shared_frame_the_user_as_object_is_another_question(a: str, b: str) -> None:
    """The frame's "I" is the first first-person word on both sides; what follows it decides."""
    assert _differ(a, b) == "actor"
    assert disagreement(features(a), features(b), reworded=True) == "actor"


def test_the_user_named_in_other_words_behind_a_frame_is_no_swap() -> None:
    assert _differ("How do I cancel my order?", "How do I cancel the order I placed?") is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Why does this fail?\n```\nfor i in range(3): print(i\n```", "Why does this fail?\n```\nfor i in range(3): print(i)\n```"),
        ("What does `String.valueOf(x)` return?", "What does `string.valueOf(x)` return?"),
        ("Why does this fail?\nif x:\n    a()\nb()", "Why does this fail?\nif x:\n    a()\n    b()"),
    ],
)  # fmt: skip
def test_code_is_kept_as_written_by_the_exact_tier(a: str, b: str) -> None:
    """A broken snippet and the fixed one, Java's String and string, an indented line and a
    dedented one: never one exact key."""
    assert normalize(a) != normalize(b)


def test_prose_around_code_is_still_folded() -> None:
    assert normalize("  What does `len(x)` RETURN?? ") == normalize("what does `len(x)` return")
    assert normalize("```\nprint(1)   \r\n```") == "```\nprint(1)\n```"


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("What does x = a / b do in Python?", "What does x = a // b do in Python?", "operators"),
        ("What is the difference between == and === in JavaScript?", "What is the difference between = and == in JavaScript?", "operators"),
        ("Is 5 > 3 in Python?", "Is 5 < 3 in Python?", "operators"),
        ("Is C++ faster than C#?", "Is C faster than C#?", "operators"),
        ("Why does `print(i` fail?", "Why does `print(i)` fail?", "code"),
    ],
)  # fmt: skip
def test_code_and_operators_must_agree(a: str, b: str, reason: str) -> None:
    assert _differ(a, b) == reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 15% of 80?", "what is 15 percent of 80"),
        ("How do I set up two-factor e-mail and/or SMS login?", "How do I set up two-factor e-mail and/or SMS login"),
        ("Help! My Wi-Fi is down.", "My Wi-Fi is down."),
    ],
)  # fmt: skip
def test_prose_punctuation_is_no_operator(a: str, b: str) -> None:
    assert features(a).operators == features(b).operators == ()


def test_one_emoji_for_another_is_another_question() -> None:
    """The model reads emoji as unknown tokens: 🙂 and 🙁 embed alike."""
    assert _differ("\U0001f642", "\U0001f641") == "symbols"
    assert (
        _differ("What does \U0001f525 mean in a text?", "What does \U0001f480 mean in a text?")
        == "symbols"
    )
    assert _differ("How do I reset my password? \U0001f64f", "How do I reset my password?") is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Which is cheaper, a Kindle or an iPad?", "Which is more expensive, a Kindle or an iPad?"),
        ("How long should I boil an egg for a soft yolk?", "How long should I boil an egg for a hard yolk?"),
    ],
)  # fmt: skip
def test_comparatives_and_more_opposites(a: str, b: str) -> None:
    assert _differ(a, b) == "antonym"


def test_words_on_one_side_of_an_antonym_group_agree() -> None:
    """ "delete" and "remove" are both the opposite of "add": not opposites of each other."""
    assert _differ("How do I delete my account?", "How do I remove my account?") is None
    assert (
        _differ(
            "Is it dangerous to mix bleach and vinegar?", "Is it risky to mix bleach and vinegar?"
        )
        is None
    )
    assert _differ("How do I add a user?", "How do I remove a user?") == "antonym"
    assert features("怎么冷冻牛肉？").polarity[-1] == features("怎么冻结牛肉？").polarity[-1]
    assert _differ("怎么冷冻牛肉？", "怎么解冻牛肉？") == "antonym"
