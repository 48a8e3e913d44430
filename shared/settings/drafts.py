"""Settings of drafts (prefill while the user types): how often they are taken, how many.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class DraftSettings(BaseModel):
    """Prefill while the user types (issue 34): how often drafts are taken, and how many."""

    # --- drafts: prefill while the user types (issue 34) ------------------------------------
    drafts_enabled: bool = Field(
        True, description="Accept `draft` frames and prefill their prompts; off: drop them."
    )
    draft_rate_per_s: int = Field(
        10,
        ge=1,
        description="Drafts per second one API key may have prefilled (its own budget, apart "
        "from the chat limits); more are dropped without a word.",
    )
    draft_min_growth_chars: int = Field(
        48,
        ge=0,
        description="A draft whose text only extends the last one sent in its conversation by "
        "fewer characters is dropped at the gateway (an engine caches whole blocks of 16-128 "
        "tokens: a word more prefills nothing it keeps). 0: every draft is sent on.",
    )
    draft_max_age_s: float = Field(
        2.0,
        gt=0,
        description="A worker drops a draft that waited longer than this: the user has typed "
        "on (or sent) since.",
    )
    draft_queue_max: int = Field(
        256,
        ge=1,
        description="Drafts waiting in the chat queue's lowest-priority list at most; a "
        "gateway drops new drafts beyond (the workers are not keeping up).",
    )
    draft_worker_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A chat worker prefills a draft only while fewer than this share of its "
        "chat slots (FIRSTTOKEN_CHAT_CONCURRENCY) are busy, chats and prefills together.",
    )
