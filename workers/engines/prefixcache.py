"""The simulated engine's prefix cache (issue 34): which of a prompt's tokens are cached.

A model of vLLM's automatic prefix caching, enough for prefill cost to behave the same way:
the prompt's tokens are cut into blocks of :data:`BLOCK_TOKENS`; each full block is named by a
hash chained over every token before it (so a block is reused only behind the same prefix);
a prompt's cached tokens are its leading blocks found in the cache; a prompt that has been
prefilled puts all its full blocks in, the least recently used blocks going first when the
cache is full. Pure: no clock, no I/O (workers/engines/sim.py times it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from shared.protocol import Message

# vLLM's default block size on CPU and GPU.
BLOCK_TOKENS = 16
# The chat-template framing the simulator counts per message (workers/engines/sim.py
# TOKENS_PER_MESSAGE): role marker first, then separators.
_FRAMING = ("<|>", "<|>", "<|>")


def prompt_token_words(messages: Sequence[Message]) -> list[str]:
    """The simulator's stand-in tokens of a prompt, as many as ``count_prompt_tokens``."""
    words: list[str] = []
    for m in messages:
        words.append(f"<{m.role}>")
        words.extend(_FRAMING)
        words.extend(m.content.split())
    return words


def block_hashes(tokens: Sequence[str]) -> list[bytes]:
    """One hash per full block, each chained on the one before (a partial tail has none)."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = "\x00".join(tokens[start : start + BLOCK_TOKENS]).encode()
        parent = hashlib.blake2b(parent + b"\x01" + block, digest_size=16).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """An LRU set of block hashes holding at most ``capacity_tokens`` tokens."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(0, capacity_tokens // BLOCK_TOKENS)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """How many of the prompt's leading tokens are cached (whole blocks only). Never the
        last token: as vLLM, the engine computes it again for its logits, so a prompt found
        whole in the cache still prefills its last block."""
        hit = 0
        for h in hashes[: max(0, prompt_tokens - 1) // BLOCK_TOKENS]:
            if h not in self._blocks:
                break
            hit += 1
        return hit * BLOCK_TOKENS

    def insert(self, hashes: Sequence[bytes]) -> None:
        """A prompt was prefilled: its blocks are now the most recently used."""
        if not self.capacity_blocks:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)


def prefilled_tokens(elapsed_ms: float, to_prefill: int, ms_per_token: float) -> int:
    """Tokens of a prefill done `elapsed_ms` after it started, at `ms_per_token` each (a
    prefill with no cost modelled has no progress to speak of: 0 until it is done)."""
    if ms_per_token <= 0 or elapsed_ms <= 0:
        return 0
    return min(to_prefill, int(elapsed_ms / ms_per_token))
