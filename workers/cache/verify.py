"""The overlap verifier: the shape of the edit between two questions.

On the evaluation sets (issue 28) the traps that pass every guard are nearly all *small
edits*: one short span of an otherwise identical question is replaced, added or dropped
("brown rice" / "wild rice", "vegetarian lasagna" / "meat lasagna", "... while breastfeeding"
dropped). Their cosine is as high as a paraphrase's. So the score a threshold is compared with
is, over the questions' content words (stop words dropped, a typo folded into the word it
misspells):

    verified = max(cosine, REPEAT_SCORE)          for a near repeat (the same words, typos
                                                   and fillers aside)
    verified = cosine - SMALL_EDIT_PENALTY         for a small edit
    verified = cosine                              otherwise

A short question whose one content word is replaced shares nothing, yet is a small edit ("Is
it open?" / "Is it closed?"). The shape also tells the guards how strictly to compare
(``Shape.reworded``, workers/cache/guards.py). A broad rewording is *not* trusted more than its
cosine: a different question on the same topic ("How do I change my email address?" / "How do
I set up a new email account?") rewords as broadly as a paraphrase, and until 2026-12-07 a
bonus for low overlap served such questions (the related-question sets, docs/benchmarks.md).
The threshold for an operator's risk comes from this verifier's own calibration table
(``<embedder>+overlap`` in workers/cache/calibrated.json). The guards still veto first. Pure, no
model: tens of microseconds a candidate.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass

from workers.cache.guards import _TOKEN, _ZH_FUNCTION
from workers.cache.normalize import canonical, has_cjk

NAME = "overlap"
SMALL_EDIT_PENALTY = 0.2
# Candidates are fetched from this far below the threshold: a near repeat's cosine, which a
# typo lowers, is raised to REPEAT_SCORE; one scored lower than this below is not looked at.
MAX_RAISE = 0.3

# Greetings and fillers a user types around a question ("um, ...", "Thanks! And ...").
_FILLERS = frozenset("hi hello hey thanks thank um uh ok okay oh well just please so".split())
# Words that carry no content of the question's topic (a rewording adds or drops them freely).
_STOP = frozenset(
    "a an the i you we my your me do does did is are was were be can could should would will "
    "how what which who whom when where why to of in on for at by with from and or it its this "
    "that there their as if so am have has had get please any some".split()
    + list(_FILLERS)
    # Asking for an explanation asks the question ("Can you explain what index funds are?").
    + "explain tell describe define mean meaning wonder wondering curious".split()
    # A unit the units guard compares; "15%" has no word for it and "15 percent" has one.
    + ["percent"]
)
_SUFFIXES = ("ing", "es", "s", "ed")
# Two spellings this close (difflib ratio) of words longer than this are one word mistyped.
_TYPO_RATIO = 0.8
_TYPO_MIN_LEN = 4
# A small edit: one differing span of at most this many words on either side; in Chinese,
# where a token is one character and a word one to four, of at most this many characters.
_SMALL_SPAN = 2
_SMALL_SPAN_CJK = 4
# A broad rewording: not a small edit, and at most this share of content words in common.
# The guards then compare only what both questions name (workers/cache/guards.py).
REWORDED_JACCARD = 0.5
# Content words that must agree around a single differing span for it to be an edit.
_ONE_SPAN_AGREEING = 2
# What a near repeat (Shape.repeat) scores at least: the same text, so the guards decide.
REPEAT_SCORE = 1.0
# Content words compared per question: the alignment is quadratic, and a 100k-character
# question must not cost a lookup more than a short one (questions are far shorter).
MAX_TOKENS = 64
_HEAD_CHARS = 32 * MAX_TOKENS


def content_tokens(text: str) -> list[str]:
    """The question's first MAX_TOKENS content words in order (Chinese: its content
    characters), crudely stemmed so that "index fund" and "index funds" agree."""
    return _tokens(_head(text), _STOP, _ZH_FUNCTION)


def _head(text: str) -> str:
    """The canonical form of as much of ``text`` as MAX_TOKENS words can come from: a
    100k-character question costs what a short one does."""
    return canonical(text[:_HEAD_CHARS])


def _tokens(canon: str, skip: frozenset[str], skip_zh: set[str] | frozenset[str]) -> list[str]:
    out: list[str] = []
    for match in _TOKEN.finditer(canon):
        if len(out) >= MAX_TOKENS:
            break
        token = match.group()
        if has_cjk(token):
            if token in skip_zh:
                continue
        elif token in skip:
            continue
        else:
            for suffix in _SUFFIXES:
                if len(token) > _TYPO_MIN_LEN and token.endswith(suffix):
                    token = token[: -len(suffix)]
                    break
        out.append(token)
    return out


def _other_ending(x: str, y: str) -> bool:
    """Two words of one length that differ only in their last two letters are two words, not
    a typo: "employer" / "employee", "payer" / "payee", "cheap" / "cheat"."""
    return len(x) == len(y) and x[:-2] == y[:-2]


@functools.cache
def dictionary() -> frozenset[str]:
    """English words MiniLM's tokenizer knows whole (about 21,700): two of them are two words,
    however alike ("affect" / "effect"), never one mistyped. Empty without the tokenizer."""
    from workers.embeddings.onnx_minilm import default_tokenizer_path

    path = default_tokenizer_path()
    if path is None:
        return frozenset()
    vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    return frozenset(w for w in vocab if w.isascii() and w.isalpha())


def _typo_of(word: str, known: str) -> bool:
    """Whether ``word``, spelled at least _TYPO_RATIO like ``known``, is ``known`` mistyped or
    another form of it ("internationally"). Names with digits or punctuation (a path, a
    version: "etc/hosts" / "etc/hostname") are compared as written; two dictionary words
    neither of which begins the other are two words ("affect" / "effect")."""
    if not _wordlike(known) or _other_ending(known, word):
        return False
    words = dictionary()
    if word in words and known in words:
        return word.startswith(known) or known.startswith(word)
    return True


def _wordlike(token: str) -> bool:
    return token.replace("'", "").isalpha()


def _fold_typos(a: list[str], b: list[str]) -> list[str]:
    """``b`` with each word that misspells a word of ``a`` replaced by that word."""
    out = []
    for word in b:
        if has_cjk(word) or len(word) < _TYPO_MIN_LEN or word in a or not _wordlike(word):
            out.append(word)
            continue
        # The closest word of ``a`` (the first of equals), each ratio computed once.
        best, closest = "", 0.0
        for known in a:
            ratio = difflib.SequenceMatcher(a=known, b=word).ratio()
            if ratio > closest:
                best, closest = known, ratio
        out.append(best if closest >= _TYPO_RATIO and _typo_of(word, best) else word)
    return out


@dataclass(frozen=True, slots=True)
class Shape:
    jaccard: float  # shared content words / all content words of the two
    small_edit: bool  # one span of at most _SMALL_SPAN words differs (the rest, if any, agrees)
    # Every word the same and in the same order, typos and fillers aside: "What is the baggage
    # alowance?" / "What is the baggage allowance?". The embedding scores a typo far lower
    # than the question's meaning warrants.
    repeat: bool = False
    # One span differs, however long, and at least two content words agree around it: "explain
    # X to a five year old" / "explain X to a physicist". An edit of the question, not the
    # question in other words.
    one_span: bool = False

    @property
    def reworded(self) -> bool:
        """The one question put in other words, not one detail of it changed."""
        return not self.small_edit and not self.one_span and self.jaccard <= REWORDED_JACCARD


def shape(a: str, b: str) -> Shape:
    ca, cb = _head(a), _head(b)
    ta = _tokens(ca, _STOP, _ZH_FUNCTION)
    tb = _fold_typos(ta, _tokens(cb, _STOP, _ZH_FUNCTION))
    sa, sb = set(ta), set(tb)
    jaccard = len(sa & sb) / len(sa | sb) if sa | sb else 1.0
    spans = [
        op
        for op in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes()
        if op[0] != "equal"
    ]
    small = one_span = False
    if len(spans) == 1:
        _, i1, i2, j1, j2 = spans[0]
        cjk = any(has_cjk(t) for t in ta[i1:i2] + tb[j1:j2])
        small = max(i2 - i1, j2 - j1) <= (_SMALL_SPAN_CJK if cjk else _SMALL_SPAN)
        one_span = len(ta) - (i2 - i1) >= _ONE_SPAN_AGREEING
    repeat = False
    if not spans and max(len(a), len(b)) <= _HEAD_CHARS:
        # The content agrees; so must every other word ("how" / "why", "can" / "should"), all
        # of them: a long text compared by its head is no repeat.
        wa, wb = _tokens(ca, _FILLERS, frozenset()), _tokens(cb, _FILLERS, frozenset())
        repeat = max(len(wa), len(wb)) < MAX_TOKENS and _fold_typos(wa, wb) == wa
    return Shape(jaccard, small, repeat, one_span)


def verified_score(score: float, s: Shape) -> float:
    """The cosine ``score`` of two questions adjusted by the shape ``s`` of their edit."""
    if s.repeat:
        return max(score, REPEAT_SCORE)
    if s.small_edit:
        return score - SMALL_EDIT_PENALTY
    return score


def table_key(embedder: str, verifier: str) -> str:
    """The calibration table of an embedding model's scores under ``verifier``."""
    return embedder if verifier == "none" else f"{embedder}+{verifier}"
