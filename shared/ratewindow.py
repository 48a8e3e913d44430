"""The rate-limit window's length and the prompt estimate a reservation starts from: the part of
the rate-limit arithmetic (gateway/rates.py) that the chat worker shares, since it charges the
cache's background verifications to the tenant's window with the gateway's own script
(workers/cache/charge.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable

WINDOW_MS = 60_000

# A rough, tokenizer-free estimate: ~4 characters per token for English text, plus the few
# tokens a chat template adds around each message. Reservations only need to be in the right
# ballpark: the worker's exact count replaces the estimate when the chat ends.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def estimate_prompt_tokens(contents: Iterable[str]) -> int:
    """Tokens a prompt of these message contents will take, rounded up."""
    total = 0
    for text in contents:
        total += math.ceil(len(text) / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE
    return total
