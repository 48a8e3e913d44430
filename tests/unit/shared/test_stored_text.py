"""The storage boundary's rule for text PostgreSQL cannot hold (U+0000), without a database."""

from __future__ import annotations

from shared.db.models import NUL_REPLACEMENT, StoredText, storable_text


def test_storable_text_replaces_only_nul() -> None:
    """Text without NUL comes back as the same object; other control characters are kept."""
    text_ok = "tab\tnewline\n你好\x01"
    assert storable_text(text_ok) is text_ok
    assert storable_text("a\x00b\x00") == f"a{NUL_REPLACEMENT}b{NUL_REPLACEMENT}"


def test_the_column_type_applies_it_to_every_bound_value() -> None:
    """StoredText rewrites strings on the way in and leaves None (a NULL summary) alone."""
    column = StoredText()
    assert column.process_bind_param("x\x00", None) == "x\ufffd"  # type: ignore[arg-type]
    assert column.process_bind_param(None, None) is None  # type: ignore[arg-type]
