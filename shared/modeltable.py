"""The model table: which models a deployment serves, on which engine, and who stands in.

A chat frame's ``model`` names one entry; its ``fallbacks`` are tried in order when the model
gives no first token in time (see ``workers/chat/generate.py``). The table comes from
``FIRSTTOKEN_MODELS`` (a JSON list) or ``FIRSTTOKEN_MODELS_FILE`` (a JSON file of the same
shape); with neither, it is one model built from the ``FIRSTTOKEN_ENGINE*`` settings, so a
deployment that predates the table keeps working unchanged. Example::

    [{"name": "small", "engine": "openai", "url": "http://gpu1:8100/v1",
      "served_model": "Qwen/Qwen3-1.7B", "role": "small", "fallbacks": ["large"]},
     {"name": "large", "engine": "openai", "url": "http://gpu2:8100/v1",
      "served_model": "Qwen/Qwen3-32B", "role": "large",
      "prices": {"input": 0.6, "output": 2.4, "cached_input": 0.15}}]

``prices`` (optional, per 1M tokens, see ``shared/pricing.py``) give each usage row its cost.

Parsing and lookups are pure; only :func:`load_models` reads a file. The settings validate the
table at start-up, so this module reads them only through :class:`TableSettings` and never
imports ``shared.settings``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.env import ENV_PREFIX
from shared.errors import ConfigError, InvalidRequest
from shared.pricing import Prices

EngineKind = Literal["sim", "openai", "vllm"]
Role = Literal["small", "large"]


class TableSettings(Protocol):
    """The settings the table is built from (``shared.settings.Settings`` has them all)."""

    @property
    def models(self) -> str | None: ...
    @property
    def models_file(self) -> str | None: ...
    @property
    def default_model(self) -> str | None: ...
    @property
    def engine(self) -> EngineKind: ...
    @property
    def engine_url(self) -> str | None: ...
    @property
    def engine_model(self) -> str: ...
    @property
    def engine_api_key(self) -> str: ...
    @property
    def vllm_model_path(self) -> str | None: ...


class ModelSpec(BaseModel):
    """One configured model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, description="The name clients ask for.")
    engine: EngineKind = "openai"
    url: str | None = Field(None, description="Base URL of an openai engine, ending in /v1.")
    served_model: str | None = Field(
        None, min_length=1, description="Model name sent to the engine (default: name)."
    )
    model_path: str | None = Field(None, description="Model directory of a vllm engine.")
    api_key: str = "EMPTY"
    role: Role = "large"
    fallbacks: tuple[str, ...] = ()
    prices: Prices | None = Field(
        None, description="Per 1M tokens: input, output, cached_input (shared/pricing.py)."
    )

    @model_validator(mode="after")
    def _check_engine(self) -> ModelSpec:
        if self.engine == "openai" and not self.url:
            raise ValueError(f"model {self.name!r}: engine openai needs a url")
        if self.engine == "vllm" and not self.model_path:
            raise ValueError(f"model {self.name!r}: engine vllm needs a model_path")
        if self.name in self.fallbacks:
            raise ValueError(f"model {self.name!r} lists itself as a fallback")
        return self

    @property
    def engine_model(self) -> str:
        """The model name the engine knows this model by."""
        return self.served_model or self.name

    @property
    def engine_key(self) -> tuple[str, str]:
        """Models with equal keys share one engine client (one connection pool, one AsyncLLM)."""
        if self.engine == "openai":
            return ("openai", f"{self.url}|{self.api_key}")
        if self.engine == "vllm":
            return ("vllm", str(self.model_path))
        return ("sim", "")

    def public(self, default: bool) -> dict[str, Any]:
        """What ``GET /v1/models`` shows: no URLs or keys of internal servers."""
        return {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "firsttoken",
            "engine": self.engine,
            "role": self.role,
            "fallbacks": list(self.fallbacks),
            "default": default,
        }


class ModelTable:
    """The configured models, in order; the first (or ``default``) serves chats naming none."""

    def __init__(self, models: list[ModelSpec], default: str | None = None) -> None:
        if not models:
            raise ConfigError("the model table is empty; configure at least one model")
        self._models: dict[str, ModelSpec] = {}
        for spec in models:
            if spec.name in self._models:
                raise ConfigError(f"model {spec.name!r} is configured twice")
            self._models[spec.name] = spec
        for spec in models:
            unknown = [f for f in spec.fallbacks if f not in self._models]
            if unknown:
                raise ConfigError(
                    f"model {spec.name!r} falls back to unknown model(s) {', '.join(unknown)}; "
                    f"known: {', '.join(self._models)}"
                )
        if default is not None and default not in self._models:
            raise ConfigError(
                f"{ENV_PREFIX}DEFAULT_MODEL {default!r} is not in the model table; "
                f"known: {', '.join(self._models)}"
            )
        self.default = default or models[0].name

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str | None) -> ModelSpec:
        """The model a chat asked for (None: the default); unknown names are the client's error."""
        spec = self._models.get(self.default if name is None else name)
        if spec is None:
            raise InvalidRequest(
                f"unknown model {name!r}; this deployment serves: {', '.join(self._models)}"
            )
        return spec

    def chain(self, name: str | None) -> list[ModelSpec]:
        """The model, then its fallbacks in order, each at most once.

        Only the asked model's own list counts, not its fallbacks' lists: what a request may
        fall back to stays visible in one place of the configuration.
        """
        first = self.get(name)
        return [first, *(self._models[f] for f in dict.fromkeys(first.fallbacks))]

    def public(self) -> dict[str, Any]:
        return {"object": "list", "data": [m.public(m.name == self.default) for m in self]}


def parse_models(raw: str | list[Any], default: str | None = None) -> ModelTable:
    """A table from JSON text or decoded JSON; ConfigError says what is wrong and where."""
    source = f"{ENV_PREFIX}MODELS"
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ConfigError(f"{source} must be a JSON list of models, got {type(data).__name__}")
    models = []
    for i, item in enumerate(data):
        try:
            models.append(ModelSpec.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(_problem(e["loc"], e["msg"]) for e in exc.errors())
            raise ConfigError(f"{source}[{i}] is invalid: {problems}") from exc
    return ModelTable(models, default)


def _problem(loc: tuple[int | str, ...], msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    return f"{'.'.join(str(p) for p in loc)}: {msg}" if loc else msg


def default_table(settings: TableSettings) -> ModelTable:
    """The one-model table of a deployment configured only through FIRSTTOKEN_ENGINE*."""
    spec = ModelSpec(
        name=settings.engine_model,
        engine=settings.engine,
        url=settings.engine_url,
        served_model=settings.engine_model,
        model_path=settings.vllm_model_path,
        api_key=settings.engine_api_key,
        prices=None,  # FIRSTTOKEN_MODELS entries can have prices; this table cannot
    )
    return ModelTable([spec], settings.default_model)


def load_models(settings: TableSettings) -> ModelTable:
    """The table the settings describe: FIRSTTOKEN_MODELS, else the file, else the default."""
    if settings.models:
        return parse_models(settings.models, settings.default_model)
    if settings.models_file:
        path = Path(settings.models_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{ENV_PREFIX}MODELS_FILE {path}: cannot read it ({exc})") from exc
        return parse_models(text, settings.default_model)
    return default_table(settings)


@lru_cache(maxsize=8)
def model_table(settings: TableSettings) -> ModelTable:
    """The table for these (frozen, hashable) settings, parsed once per process."""
    return load_models(settings)
