"""model "auto": the routing table."""

from __future__ import annotations

import pytest

from workers.routing import RoutingRules, classify, decide

RULES = RoutingRules(long_prompt_tokens=1500)
ROLES = [("small-m", "small"), ("large-m", "large")]


@pytest.mark.parametrize(
    ("question", "tokens", "policy", "route", "reason"),
    [
        ("What is the capital of France?", 40, "auto", "small", "default"),
        ("hi", 40, "large", "large", "tenant_policy"),
        ("Why is the sky blue?", 40, "small", "small", "tenant_policy"),
        ("summarise this", 1500, "auto", "large", "long_prompt"),
        ("fix:\n```py\nprint(1)\n```", 40, "auto", "large", "code"),
        ("def f(x):\n    return x + 1", 40, "auto", "large", "code"),
        ("Explain step by step how TLS works", 40, "auto", "large", "reasoning"),
        ("Why does ice float?", 40, "auto", "large", "reasoning"),
        ("为什么天空是蓝色的", 40, "auto", "large", "reasoning"),
        ("请比较这两种方案", 40, "auto", "large", "reasoning"),
        ("Do this:\n1. read\n2. sort\n3. write", 40, "auto", "large", "reasoning"),
        ("Who are you? Where are you?", 40, "auto", "large", "reasoning"),
        ("Tell me about Whyte Avenue", 40, "auto", "small", "default"),
        ("你好", 40, "auto", "small", "default"),
    ],
)
def test_routing_table(question: str, tokens: int, policy: str, route: str, reason: str) -> None:
    """Each documented rule picks its route and names itself as the reason."""
    assert classify(question, tokens, RULES, policy) == (route, reason)


def test_picks_the_model_of_the_role() -> None:
    """The decision names the first model with the route's role."""
    assert decide("hi", 5, RULES, ROLES, "large-m").model == "small-m"
    assert decide("why?", 5, RULES, ROLES, "small-m").model == "large-m"


def test_missing_role_falls_back_to_default_and_says_so() -> None:
    """With no small model configured, the default answers and the reason says why."""
    d = decide("hi", 5, RULES, [("only", "large")], "only")
    assert d.model == "only" and d.route == "small"
    assert "no small model configured" in d.reason


def test_cues_are_configurable() -> None:
    """A deployment's own cue list replaces the default one."""
    rules = RoutingRules(reasoning_cues=("audit",))
    assert classify("please audit this", 5, rules) == ("large", "reasoning")
    assert classify("why?", 5, rules) == ("small", "default")
