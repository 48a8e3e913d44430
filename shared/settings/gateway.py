"""Settings: the gateway: bind address, frame and token limits, keys, rates and input safety.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class GatewaySettings(BaseModel):
    """The gateway: bind address, frame and token limits, keys, rates and input safety."""

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
    responses_ttl_s: int = Field(
        30 * 86400,
        ge=60,
        description="How long a stored response of the Responses API door (`store`, the "
        "default) can be retrieved and continued with previous_response_id (30 days, as "
        "OpenAI keeps them).",
    )
    max_message_chars: int = Field(
        100_000, ge=1, description="Most characters in one message of a chat frame."
    )
