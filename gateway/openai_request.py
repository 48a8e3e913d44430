"""Reading a request body of the OpenAI doors (Chat Completions, gateway/openai_protocol.py;
Responses, gateway/responses_protocol.py): the JSON object, strict models, chat messages and their
text parts, and validation errors as a 400 that names the parameter at fault. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import InvalidRequest
from shared.protocol import Message

# The role OpenAI's newer models use in place of `system`.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class Strict(BaseModel):
    # hide_input_in_errors: an error chained to a logged exception must not quote the text.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, hide_input_in_errors=True)


def names(keys: list[str]) -> str:
    """Parameter names for an error message: quoted, sorted, the first ten."""
    return ", ".join(repr(k) for k in sorted(keys)[:10])


# Where a union's member failed, pydantic names the member in the error's location.
_UNION_MEMBERS = frozenset({"float", "int", "str", "bool"})


def describe(exc: ValidationError) -> tuple[str, str | None]:
    """A validation error as (message, the first parameter at fault), its first five errors."""
    parts = []
    param = None
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"] if p not in _UNION_MEMBERS)
        param = param or (loc or None)
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts), param


class InvalidParameter(InvalidRequest):
    """A 400 that names the request parameter at fault (the error's `param`)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def invalid(message: str, param: str | None = None) -> InvalidParameter:
    """The 400 to raise: `message`, naming `param` where one is at fault."""
    return InvalidParameter(message, param)


def text_content(value: object, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(
                    f"{where}.content[{i}]: only text parts are supported, not {kind!r}",
                    f"{where}.content",
                )
            extra = set(part) - {"type", "text"}
            if extra or not isinstance(part.get("text"), str):
                raise invalid(
                    f"{where}.content[{i}]: a text part is {{'type': 'text', 'text': str}}",
                    f"{where}.content",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(
        f"{where}.content must be a string or a list of text parts, not {type(value).__name__}",
        f"{where}.content",
    )


MESSAGE_FIELDS = frozenset({"role", "content"})


def parse_messages(
    raw: list[dict[str, Any]],
    *,
    name: str = "messages",
    fields: frozenset[str] = MESSAGE_FIELDS,
    content: Callable[[object, str], str] = text_content,
) -> list[Message]:
    """Chat messages from a door's message list (`name`): `fields` are the fields an item may
    have, `content` reads one's content (the Responses door reads its own parts)."""
    out = []
    for i, item in enumerate(raw):
        where = f"{name}[{i}]"
        extra = set(item) - fields
        if extra:
            raise invalid(
                f"{where}: unsupported field(s) {names(list(extra))}; "
                "a message is {'role', 'content'}",
                where,
            )
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(
                f"{where}.role {role!r} is not supported; use one of {', '.join(ROLES)}",
                f"{where}.role",
            )
        if "content" not in item:
            raise invalid(f"{where}.content is required", f"{where}.content")
        out.append(Message(role=ROLES[role], content=content(item["content"], where)))  # type: ignore[arg-type]
    return out


def parse_json_object(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """A request body as a JSON object (every HTTP door's first step), or a 400 saying what is
    wrong with it."""
    if len(body) > max_bytes:
        raise invalid(f"the request body is {len(body)} bytes; the limit is {max_bytes}")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        # orjson refuses lone surrogates and deep nesting too; the standard decoder's message
        # says where the JSON itself breaks, when it does.
        try:
            json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise invalid("the request body is nested too deeply") from None
        raise invalid("the request body is not valid UTF-8 JSON (a lone surrogate?)") from None
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    return data
