"""Reading the files given to ``kb add``: text and Markdown only, checked before anything is
written, so one bad file fails the whole invocation with nothing stored."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from shared.errors import InvalidRequest

MAX_FILE_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KbFile:
    name: str
    text: str
    sha256: str
    markdown: bool


def decode_text(name: str, data: bytes) -> str:
    """The file's text, or InvalidRequest saying why it is not a text file."""
    if not data.strip():
        raise InvalidRequest(f"{name}: the file is empty")
    # NUL bytes never occur in UTF-8 text and nearly always in binaries (images, PDFs, zips).
    if b"\x00" in data[:65536]:
        raise InvalidRequest(f"{name}: binary file (not text or Markdown); nothing was added")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"{name}: not UTF-8 text (byte {exc.start}); convert it to UTF-8; nothing was added"
        ) from exc


def read_file(path: Path) -> KbFile:
    """Read and check one file; InvalidRequest names the file and the problem."""
    name = str(path)
    if path.is_dir():
        raise InvalidRequest(f"{name}: is a directory; pass the files in it")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InvalidRequest(f"{name}: {size} bytes; the limit is {MAX_FILE_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"{name}: cannot read it ({exc.strerror or exc})") from exc
    text = decode_text(name, data)
    markdown = path.suffix.lower() in (".md", ".markdown", ".mdx")
    return KbFile(path.name, text, hashlib.sha256(data).hexdigest(), markdown)
