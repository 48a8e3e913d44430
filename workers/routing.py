"""``model: "auto"``: send a chat to the small or the large model by a fixed, documented rule set.

The rules, first match wins (``reason`` in the `done` frame names the one that decided):

1. ``tenant_policy``: the tenant's policy is ``small`` or ``large`` -> that model.
2. ``long_prompt``: the prompt is at least ``long_prompt_tokens`` (default 1500) -> large
   (long inputs need the large model's attention span; prefill dominates either way).
3. ``code``: the question holds code (a fence, or lines that look like code) -> large.
4. ``reasoning``: a reasoning or multi-step cue ("step by step", "prove", "why", "compare",
   "为什么", "证明", ...; or a numbered list of asks; or several questions) -> large.
5. ``default``: otherwise -> small (short, plain questions are most traffic, and the small
   model's first token comes sooner).

A route whose role has no model in the table falls to the table's default model, and the
reason says so. Pure: the caller passes the counted prompt and the table's roles.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Route = Literal["small", "large"]

AUTO = "auto"

DEFAULT_REASONING_CUES: tuple[str, ...] = (
    "step by step",
    "step-by-step",
    "prove",
    "proof",
    "derive",
    "why",
    "explain how",
    "compare",
    "trade-off",
    "tradeoff",
    "analyze",
    "analyse",
    "plan",
    "calculate",
    "debug",
    "为什么",
    "证明",
    "推导",
    "分析",
    "比较",
    "步骤",
    "计算",
)

_FENCE = re.compile(r"```|~~~")
_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |function |const |let |var |public |#include|"
    r"SELECT |for \(|if \(|return |fn |package |func )|[;{}]\s*$",
    re.MULTILINE,
)
_NUMBERED = re.compile(r"^\s*(\d+[.)]|[-*])\s+\S", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class RoutingRules:
    long_prompt_tokens: int = 1500
    reasoning_cues: tuple[str, ...] = DEFAULT_REASONING_CUES
    min_numbered_steps: int = 3
    min_questions: int = 2


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route
    reason: str
    model: str


def classify(
    question: str, prompt_tokens: int, rules: RoutingRules, tenant_policy: str = "auto"
) -> tuple[Route, str]:
    """Small or large, and the rule that decided."""
    if tenant_policy in ("small", "large"):
        return tenant_policy, "tenant_policy"  # type: ignore[return-value]
    if prompt_tokens >= rules.long_prompt_tokens:
        return "large", "long_prompt"
    if _FENCE.search(question) or len(_CODE_LINE.findall(question)) >= 2:
        return "large", "code"
    if _cue_pattern(rules.reasoning_cues).search(question):
        return "large", "reasoning"
    if len(_NUMBERED.findall(question)) >= rules.min_numbered_steps:
        return "large", "reasoning"
    if question.count("?") + question.count("\uff1f") >= rules.min_questions:  # + fullwidth ?
        return "large", "reasoning"
    return "small", "default"


@lru_cache(maxsize=8)
def _cue_pattern(cues: tuple[str, ...]) -> re.Pattern[str]:
    # Whole words for Latin cues ("why" must not match "whyte"); CJK has no word boundaries.
    alternatives = [
        rf"\b{re.escape(c.strip())}\b" if c.isascii() else re.escape(c) for c in cues if c.strip()
    ]
    return re.compile("|".join(alternatives) or r"(?!x)x", re.IGNORECASE)


def pick_model(route: Route, roles: Sequence[tuple[str, str]], default: str) -> tuple[str, str]:
    """The first model of ``route``'s role in table order, else the default (and why)."""
    for name, role in roles:
        if role == route:
            return name, ""
    return default, f"no {route} model configured; used {default}"


def decide(
    question: str,
    prompt_tokens: int,
    rules: RoutingRules,
    roles: Sequence[tuple[str, str]],
    default: str,
    tenant_policy: str = "auto",
) -> Decision:
    route, reason = classify(question, prompt_tokens, rules, tenant_policy)
    model, note = pick_model(route, roles, default)
    return Decision(route, f"{reason}; {note}" if note else reason, model)
