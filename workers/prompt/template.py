"""The structured prompt template (role, constraints, context, query, output format), per tenant.

Compact on purpose: every token of the system message is prefill time on every turn, so the
default template is a few dozen tokens and tenants add only what they need.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shared.errors import ConfigError

RoutePolicy = Literal["auto", "small", "large"]


@dataclass(frozen=True, slots=True)
class Template:
    """One tenant's prompt shape and routing policy."""

    role: str = "You are a concise, accurate assistant."
    constraints: tuple[str, ...] = (
        "Use the context when it answers the question; say so when you do not know.",
    )
    output_format: str = "Plain text; Markdown only for code."
    route_policy: RoutePolicy = "auto"

    def with_overrides(self, data: Mapping[str, Any]) -> Template:
        """This template with the fields ``data`` sets (a tenant's row or settings entry)."""
        changes: dict[str, Any] = {}
        for key in ("role", "output_format"):
            if isinstance(data.get(key), str):
                changes[key] = data[key]
        if isinstance(data.get("constraints"), list):
            changes["constraints"] = tuple(str(c) for c in data["constraints"])
        policy = data.get("route_policy")
        if policy is not None:
            if policy not in ("auto", "small", "large"):
                raise ConfigError(f"route_policy must be auto, small or large, not {policy!r}")
            changes["route_policy"] = policy
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Templates:
    """The default template and each tenant's overrides (from FIRSTTOKEN_PROMPT_TENANTS)."""

    default: Template = field(default_factory=Template)
    tenants: Mapping[str, Template] = field(default_factory=dict)

    def for_tenant(self, tenant_id: str) -> Template:
        return self.tenants.get(tenant_id, self.default)


def parse_templates(raw: str | None, default: Template | None = None) -> Templates:
    """``{"tenant-id": {"role": ..., "constraints": [...], "output_format": ...,
    "route_policy": "auto|small|large"}, ...}``; ConfigError names what is wrong."""
    base = default or Template()
    if not raw:
        return Templates(base, {})
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"FIRSTTOKEN_PROMPT_TENANTS is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError("FIRSTTOKEN_PROMPT_TENANTS must be a JSON object of tenant -> object")
    return Templates(base, {str(k): base.with_overrides(v) for k, v in data.items()})


def summary_line(summary: str) -> str:
    """How the system message gives a conversation's running summary (the cache keys a stored
    conversation's turn on this line too: workers/cache/conversation.py)."""
    return f"Earlier in this conversation (summary): {summary}"


def system_text(
    template: Template,
    *,
    client_system: str | None = None,
    summary: str | None = None,
    context: tuple[str, ...] = (),
) -> str:
    """The system message: role, constraints, output format, then summary and context blocks.

    Context comes last so the fixed part of the message is a stable prefix across turns (the
    engine's prefix cache reuses it).
    """
    lines = [template.role]
    constraints = list(template.constraints)
    if client_system:
        constraints.append(client_system)
    if constraints:
        lines.append("Rules:")
        lines.extend(f"- {c}" for c in constraints)
    lines.append(f"Output: {template.output_format}")
    if summary:
        lines.append(summary_line(summary))
    if context:
        lines.append("Context:")
        lines.extend(f"[{i}] {text}" for i, text in enumerate(context, 1))
    return "\n".join(lines)
