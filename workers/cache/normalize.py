# ruff: noqa: RUF001  (Chinese and typographic punctuation are the point here)
"""Text normalisation and the exact-tier key. Pure functions, no I/O.

Two strengths of normalisation:
- ``normalize`` is what the exact tier hashes: Unicode NFKC (full-width -> half-width), case-fold,
  collapsed whitespace, trailing punctuation dropped. Two requests that differ only in those
  ways get the same answer from any model, so hashing them together is safe.
- ``canonical`` goes further for the guards and the Chinese comparison: polite fillers and
  sentence-final particles removed, a small table of interchangeable question words mapped to one
  form. It is never used to decide a hit on its own; only to *compare* two questions.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from shared.protocol import Message

_SPACE = re.compile(r"\s+")
_LEAD = r"^[\s\"'“”‘’`(\[]+"
_TRAIL = r"[\s?!.。？！,，;；:：~…\"'“”‘’`)\]]+$"
_EDGE_PUNCT = re.compile(f"{_LEAD}|{_TRAIL}")
_LEADING_PUNCT = re.compile(_LEAD)
# A text of several lines or with code keeps its closing brackets and quotes: "b()" is code.
_TRAILING_PUNCT = re.compile(r"[\s?!.。？！,，;；:：~…]+$")
# A fenced code block (to its closing fence, or to the end when unclosed) or inline code.
CODE_SPAN = re.compile(r"```.*?(?:```|$)|`[^`\n]+`", re.S)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# Chinese question words and fillers that never change the answer. Longest first, so that
# "请问一下" goes before "请问".
_ZH_FILLERS = (
    "请问一下",
    "请问",
    "麻烦问一下",
    "麻烦",
    "能不能告诉我",
    "能告诉我",
    "告诉我",
    "我想知道",
    "想知道",
    "一下",
    "谢谢",
    "你好",
    "您好",
    "请",
    "吗",
    "呢",
    "呀",
    "啊",
    "吧",
    "的",
    "了",
)
# Interchangeable Chinese wordings -> one form (only pairs that are true synonyms in questions).
_ZH_SYNONYMS = (
    ("怎么样", "如何"),
    ("怎样", "如何"),
    ("怎么", "如何"),
    ("如何才能", "如何"),
    ("该如何", "如何"),
    ("要如何", "如何"),
    ("是什么意思", "是什么"),
    ("什么意思", "是什么"),
    ("什么是", "是什么"),
    ("为何", "为什么"),
    ("为啥", "为什么"),
    ("啥", "什么"),
    ("多少钱", "价格"),
    ("价钱", "价格"),
    ("更改", "修改"),
    ("更换", "修改"),
    ("改掉", "修改"),
    ("能否", "能"),
    ("可不可以", "可以"),
    ("能不能", "能"),
    ("可以", "能"),
    ("是否", ""),
    ("我们", "我"),
    ("咱们", "我"),
    ("您", "你"),
)
# "要不要", "会不会", "有没有": the Chinese yes/no question form asks what "要", "会", "有"
# ask; it is no negation.
_ZH_A_NOT_A = re.compile(r"([\u3400-\u4dbf\u4e00-\u9fff])[不没]\1")
_EN_CONTRACTIONS = (
    ("what's", "what is"),
    ("how's", "how is"),
    ("where's", "where is"),
    ("who's", "who is"),
    ("it's", "it is"),
    ("i'm", "i am"),
    ("can't", "can not"),
    ("cannot", "can not"),
    ("won't", "will not"),
    ("don't", "do not"),
    ("doesn't", "does not"),
    ("didn't", "did not"),
    ("isn't", "is not"),
    ("aren't", "are not"),
    ("wasn't", "was not"),
    ("weren't", "were not"),
    ("shouldn't", "should not"),
    ("wouldn't", "would not"),
    ("couldn't", "could not"),
    ("haven't", "have not"),
    ("hasn't", "has not"),
)

# The same contractions typed without the apostrophe ("whats", "dont", "wont"), as words only:
# "wont" inside "wonton" is no contraction. "its" (the possessive) and "well" are left alone.
_BARE_EXPANSIONS = {
    "whats": "what is", "hows": "how is", "wheres": "where is", "whos": "who is", "im": "i am",
    "cant": "can not", "wont": "will not", "dont": "do not", "doesnt": "does not",
    "didnt": "did not", "isnt": "is not", "arent": "are not", "wasnt": "was not",
    "werent": "were not", "shouldnt": "should not", "wouldnt": "would not",
    "couldnt": "could not", "havent": "have not", "hasnt": "has not",
}  # fmt: skip
_EN_BARE_CONTRACTIONS = re.compile(rf"\b(?:{'|'.join(_BARE_EXPANSIONS)})\b")


def _expand_bare(match: re.Match[str]) -> str:
    return _BARE_EXPANSIONS[match.group(0)]


def normalize(text: str) -> str:
    """The exact tier's form: NFKC, case-folded, one space, no edge punctuation. Code is kept
    as written, and so are the lines and indentation of a text of several lines: "print(i" and
    "print(i)", "String" and "string" in Java, an indented line and a dedented one ask
    different things."""
    if "`" not in text and "\n" not in text:
        return _EDGE_PUNCT.sub("", _fold(text))
    parts: list[tuple[bool, str]] = []  # (is code, text)
    pos = 0
    for match in CODE_SPAN.finditer(text):
        parts.append((False, _fold_lines(text[pos : match.start()])))
        parts.append((True, _code_form(match.group())))
        pos = match.end()
    parts.append((False, _fold_lines(text[pos:])))
    parts = [(code, part) for code, part in parts if part]
    if parts and not parts[0][0]:
        parts[0] = (False, _LEADING_PUNCT.sub("", parts[0][1]))
    if parts and not parts[-1][0]:
        parts[-1] = (False, _TRAILING_PUNCT.sub("", parts[-1][1]))
    return " ".join(part for _, part in parts if part)


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.replace("’", "'").replace("‘", "'")
    return _SPACE.sub(" ", text).strip()


def _fold_lines(text: str) -> str:
    """Prose of several lines: each line folded, its indentation kept, blank lines dropped."""
    lines = []
    for i, line in enumerate(text.split("\n")):
        body = _fold(line)
        if body:
            # Indentation starts a line; the first piece may follow code on its line.
            indent = line[: len(line) - len(line.lstrip(" \t"))] if i else ""
            lines.append(indent + body)
    return "\n".join(lines)


def _code_form(code: str) -> str:
    """Code as written: only line ends and trailing spaces are not the code's."""
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def canonical(text: str) -> str:
    """A comparison form: ``normalize`` plus contractions expanded, fillers and synonyms folded."""
    text = normalize(text)
    for short, long in _EN_CONTRACTIONS:
        text = text.replace(short, long)
    text = _EN_BARE_CONTRACTIONS.sub(_expand_bare, text)
    if has_cjk(text):
        text = _ZH_A_NOT_A.sub(r"\1", text)
        for src, dst in _ZH_SYNONYMS:
            text = text.replace(src, dst)
        for filler in _ZH_FILLERS:
            text = text.replace(filler, "")
        text = _SPACE.sub(" ", text).strip()
    return text


@dataclass(frozen=True, slots=True)
class Turn:
    """A request split the way the cache compares it."""

    system: str  # normalised system prompt(s), "" when none
    context: tuple[tuple[str, str], ...]  # earlier (role, normalised content), oldest first
    question: str  # the last user message, normalised

    @property
    def context_text(self) -> str:
        """The earlier turns as one string (what the context embedding is made from)."""
        return "\n".join(content for _, content in self.context)


def split_turn(messages: Sequence[Message]) -> Turn:
    """System prompt, every earlier turn, and the final user message.

    The context is the whole conversation before the question: a detail in its first turn (an
    order number, a city, an allergy) can change the answer as much as one in its last.
    """
    system = "\n".join(normalize(m.content) for m in messages if m.role == "system")
    rest = [m for m in messages if m.role != "system"]
    question = normalize(rest[-1].content) if rest else ""
    context = tuple((m.role, normalize(m.content)) for m in rest[:-1])
    return Turn(system=system, context=context, question=question)


def _digest(value: object) -> str:
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def partition_key(model: str, system: str, history: str = "") -> str:
    """Which semantic index a request searches: same model route and same system prompt only,
    and for a follow-up, when ``history`` (its earlier turns' ``context_key``) is given, the
    same earlier turns only. A first turn's key is the same with or without it."""
    if history and history != _NO_HISTORY:
        return _digest(["p1", model, system, history])
    return _digest(["p1", model, system])


def exact_key(
    *,
    tenant: str,
    model: str,
    messages: Sequence[Message],
    max_tokens: int,
    temperature: float | None,
) -> str:
    """Hash of everything that changes the answer (the exact tier promises the very same
    request)."""
    convo = [(m.role, normalize(m.content)) for m in messages]
    return _digest(["x1", tenant, model, convo, max_tokens, temperature])


def context_key(context: tuple[tuple[str, str], ...]) -> str:
    """The earlier turns, each normalised as the exact tier normalises (``normalize``)."""
    return _digest(["c1", list(context)])


_NO_HISTORY = context_key(())
