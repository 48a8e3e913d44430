"""Builds the configured engine; the one place that knows every implementation."""

from __future__ import annotations

from shared.engines.base import Engine
from shared.settings import Settings


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.engine`` names. Imports are lazy so that a process only pays
    for (and only needs installed) the engine it runs."""
    if settings.engine == "sim":
        from shared.engines.sim import SimEngine, SimOptions

        return SimEngine(SimOptions.from_settings(settings))
    if settings.engine == "openai":
        from shared.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(settings)
    from shared.engines.vllm_engine import VLLMEngine

    return VLLMEngine(settings)
