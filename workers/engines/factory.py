"""Builds engines; the one place that knows every implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.settings import Settings
from workers.engines.base import Engine

if TYPE_CHECKING:
    from shared.modeltable import ModelSpec


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.engine`` names (the default, one-model table)."""
    from shared.modeltable import default_table

    return make_model_engine(default_table(settings).get(None), settings)


def make_model_engine(spec: ModelSpec, settings: Settings) -> Engine:
    """The engine of one model table entry. Imports are lazy so that a process only pays
    for (and only needs installed) the engines it runs."""
    if spec.engine == "sim":
        from workers.engines.sim import SimEngine, SimOptions

        return SimEngine(SimOptions.from_settings(settings))
    if spec.engine == "openai":
        from workers.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(settings, url=spec.url, api_key=spec.api_key)
    from workers.engines.vllm_engine import VLLMEngine

    return VLLMEngine(settings, model_path=spec.model_path)
