"""Settings: prompts, conversation context, retrieval deadlines, the knowledge base and routing.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class PromptSettings(BaseModel):
    """Prompts, conversation context, retrieval deadlines, the knowledge base and routing."""

    # --- prompts, context, retrieval, routing (issue 5) ---
    prompt_budget_tokens: int = Field(
        4096,
        ge=256,
        description="Prompt token budget of a model (system + context + history + question), "
        "unless PROMPT_BUDGETS names it. Leave room for max_tokens in the model's context.",
    )
    prompt_budgets: str | None = Field(
        None, description='Per-model prompt budgets as JSON, e.g. {"small": 3000, "large": 12000}.'
    )
    prompt_tokenizers: str | None = Field(
        None,
        description='Per-model tokenizer.json of the served model, as JSON {"model": "path"}; '
        "models without one are counted with tiktoken cl100k_base (offline copy).",
    )
    prompt_tenants: str | None = Field(
        None,
        description="Per-tenant prompt templates as JSON {tenant_id: {role, constraints, "
        "output_format, route_policy}}; a tenant_prompts row in the database overrides it.",
    )
    context_summary_after_tokens: int = Field(
        8000,
        ge=100,
        description="A conversation whose unsummarised history exceeds this sends only its "
        "recent window plus the running summary, and its older turns are summarised.",
    )
    context_recent_messages: int = Field(
        8, ge=0, le=64, description="Messages in the recent window of a long conversation."
    )
    summary_model: str | None = Field(
        None, description="Model that writes summaries (default: the table's first small model)."
    )
    summary_max_words: int = Field(150, ge=10, description="Longest running summary, in words.")
    retrieval_db_deadline_ms: float = Field(
        150.0, gt=0, description="Deadline of each database source (user, conversation)."
    )
    retrieval_kb_deadline_ms: float = Field(
        150.0, gt=0, description="Deadline of the knowledge-base search (embed + top-k)."
    )
    retrieval_quota_deadline_ms: float = Field(
        50.0, gt=0, description="Deadline of the quota check (one Redis read)."
    )
    retrieval_probe_ms: float = Field(
        0.0,
        ge=0,
        description="Adds a retrieval source that sleeps this long (fault drills, tests, "
        "benchmarks); 0: off. Its deadline is RETRIEVAL_DB_DEADLINE_MS.",
    )
    kb_top_k: int = Field(4, ge=0, le=32, description="Knowledge-base chunks retrieved per chat.")
    kb_min_score: float = Field(
        0.3, ge=-1, le=1, description="Least cosine similarity of a retrieved chunk."
    )
    kb_chunk_chars: int = Field(600, ge=100, description="Largest knowledge-base chunk, in chars.")
    tenant_cache_s: float = Field(
        5.0,
        gt=0,
        description="How long a worker trusts a tenant's prompt and knowledge-base version before "
        "reading them again. `firsttoken kb add|remove|reembed` tells the workers at once; this "
        "bounds other edits (SQL) and a notice lost while Redis was unreachable.",
    )
    route_long_prompt_tokens: int = Field(
        1500, ge=1, description='model "auto": prompts of at least this many tokens go large.'
    )
    route_reasoning_cues: str | None = Field(
        None,
        description='model "auto": comma-separated cues that send a question to the large '
        "model (default: workers/routing.py's English and Chinese list).",
    )
