"""Prompt building: the per-tenant template, token counting, and the budgeted builder."""

from workers.prompt.builder import (
    Budget,
    BuiltPrompt,
    ContextChunk,
    PromptParts,
    build_prompt,
    count_messages,
)
from workers.prompt.template import Template, Templates, parse_templates
from workers.prompt.tokens import TokenCounter, counter_for

__all__ = [
    "Budget",
    "BuiltPrompt",
    "ContextChunk",
    "PromptParts",
    "Template",
    "Templates",
    "TokenCounter",
    "build_prompt",
    "count_messages",
    "counter_for",
    "parse_templates",
]
