"""API key minting and hashing (pure, no database)."""

from __future__ import annotations

import hashlib
import re

from shared.db.apikeys import display_prefix, generate_key, hash_key


def test_generated_key_has_prefix_and_256_random_bits() -> None:
    """A key is 'ft-' plus 43 URL-safe characters (32 bytes), and keys never repeat."""
    keys = {generate_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert re.fullmatch(r"ft-[A-Za-z0-9_-]{43}", key), key


def test_hash_is_sha256_hex_of_utf8() -> None:
    """hash_key is the lowercase SHA-256 hex digest of the key's UTF-8 bytes."""
    assert hash_key("ft-abc") == hashlib.sha256(b"ft-abc").hexdigest()
    assert hash_key("clé") == hashlib.sha256("clé".encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", hash_key(generate_key()))


def test_hash_is_deterministic_and_distinguishes_keys() -> None:
    """The same key always hashes the same; different keys hash differently."""
    key = generate_key()
    assert hash_key(key) == hash_key(key)
    assert hash_key(key) != hash_key(key + "x")


def test_display_prefix_is_first_eight_chars() -> None:
    """The displayed prefix is the key's first 8 characters, too short to use the key."""
    key = generate_key()
    assert display_prefix(key) == key[:8]
    assert len(display_prefix(key)) == 8
