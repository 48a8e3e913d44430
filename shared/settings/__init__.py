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
from shared.modeltable import load_models
from shared.settings.cache import CacheSettings
from shared.settings.drafts import DraftSettings
from shared.settings.engine import EngineSettings
from shared.settings.gateway import GatewaySettings
from shared.settings.observability import ObservabilitySettings
from shared.settings.prompt import PromptSettings
from shared.settings.services import ServiceSettings
from shared.settings.worker import WorkerSettings

__all__ = [
    "ENV_PREFIX",
    "Settings",
    "describe_validation_error",
    "get_settings",
    "load_settings",
    "settings_table",
]


class Settings(
    ObservabilitySettings,
    PromptSettings,
    CacheSettings,
    WorkerSettings,
    GatewaySettings,
    DraftSettings,
    EngineSettings,
    ServiceSettings,
    BaseSettings,
):
    """firsttoken configuration. Defaults are the embedded mode (`firsttoken up`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # The fields live in one module per subsystem (the classes above, in this order in the
    # settings table); validators that read across subsystems stay here.

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
