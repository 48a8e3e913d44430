"""Settings: the engines: which one, the model table, its deadlines, and the simulator.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.modeltable import EngineKind


class EngineSettings(BaseModel):
    """The engines: which one, the model table, its deadlines, and the simulator."""

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
    engine_warm_s: float = Field(
        600.0,
        ge=0,
        description="Keep a connection to each OpenAI-compatible engine open ahead of need "
        "until this long after its last request (renewed before the server's keep-alive "
        "closes it), so a chat after a quiet spell pays no connect before its first token; "
        "0: connect only for requests.",
    )
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
