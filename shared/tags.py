"""Who a chat was for and how the client labels it: the frame's ``user`` and ``tags``. Pure.

Both land in the chat's usage row (``usage_events.end_user``, ``usage_events.tags``) for
analysts to group and filter by; nothing else reads them. ``user`` is OpenAI's field name (the
end user of the client's own application); ``tags`` is a small dict of short strings (what the
OpenAI door's ``metadata`` is) or a small list of short labels. The bounds follow OpenAI's
``metadata`` (16 pairs, keys up to 64 characters, values up to 512), so whatever OpenAI accepts
there is accepted here; list labels are keys, at most 64 characters. Control characters are
refused: these strings are grouped, printed in tables and written to CSV.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, PlainValidator

MAX_TAGS = 16
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 512
MAX_USER = 256

Tags = dict[str, str] | list[str]


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text)


def _check_text(text: object, what: str, longest: int, *, empty_ok: bool = False) -> str:
    """`text` if it is a string within bounds; `what` ("" for the field itself) starts the
    message, after the field's name the parser puts first."""
    what = f"{what} " if what else ""
    if not isinstance(text, str):
        raise ValueError(f"{what}must be a string, not {_json_type(text)}")
    if not text and not empty_ok:
        raise ValueError(f"{what}must not be empty")
    if len(text) > longest:
        raise ValueError(f"{what}is {len(text)} characters; the limit is {longest}")
    if _has_control(text):
        raise ValueError(f"{what}must not contain control characters")
    return text


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "a value"


def check_user(value: object) -> str:
    """The end user's id as sent, or ValueError saying what is wrong with it."""
    return _check_text(value, "", MAX_USER)


def check_tags(value: object, *, lists: bool = True) -> Tags:
    """``value`` as tags (a dict of strings, or with ``lists`` a list of labels), or
    ValueError saying exactly what is wrong."""
    shape = "an object of strings or an array of strings" if lists else "an object of strings"
    if isinstance(value, dict):
        if len(value) > MAX_TAGS:
            raise ValueError(f"has {len(value)} entries; the limit is {MAX_TAGS}")
        for key, item in value.items():
            _check_text(key, "a key", MAX_TAG_KEY)
            _check_text(item, f"{key!r}", MAX_TAG_VALUE, empty_ok=True)
        return dict(value)
    if lists and isinstance(value, list):
        if len(value) > MAX_TAGS:
            raise ValueError(f"has {len(value)} entries; the limit is {MAX_TAGS}")
        for i, item in enumerate(value):
            _check_text(item, f"entry {i}", MAX_TAG_KEY)
        return list(value)
    raise ValueError(f"must be {shape}, not {_json_type(value)}")


def _tags_or_none(value: Any) -> Tags | None:
    return None if value is None else check_tags(value)


def _metadata_or_none(value: Any) -> dict[str, str] | None:
    return None if value is None else check_tags(value, lists=False)  # type: ignore[return-value]


# Field types for the frames: plain validators, so the messages above reach the client as they
# are, not pydantic's one error per member of the union.
UserField = Annotated[str, AfterValidator(check_user)]
TagsField = Annotated[Tags | None, PlainValidator(_tags_or_none)]
MetadataField = Annotated[dict[str, str] | None, PlainValidator(_metadata_or_none)]
