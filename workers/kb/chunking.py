"""Split a document into chunks for retrieval: paragraphs packed up to a size, headings kept.

Chunks are small (default 600 characters, ~150 tokens) because the embedder reads at most 128
tokens and a retrieved chunk costs prompt tokens: several short, relevant chunks beat one long
one. Each Markdown chunk starts with its heading path so it stands on its own in a prompt.
"""

from __future__ import annotations

import re

_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")
# Sentence ends in Latin and CJK text (the ideographic full stop, fullwidth ! and ?).
_SENTENCE = re.compile("(?<=[.!?\u3002\uff01\uff1f])\\s*")


def chunk_text(text: str, *, markdown: bool, max_chars: int = 600) -> list[str]:
    """Non-empty chunks of at most ``max_chars`` (plus the heading line), in document order."""
    chunks: list[str] = []
    headings: list[str] = []
    buf: list[str] = []

    def flush() -> None:
        body = "\n\n".join(buf).strip()
        buf.clear()
        if body:
            prefix = " > ".join(headings)
            chunks.append(f"{prefix}\n{body}" if prefix else body)

    for para in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        para = para.strip()
        if not para:
            continue
        first = para.splitlines()[0]
        match = _HEADING.match(first) if markdown else None
        if match:
            flush()
            level = len(match.group(1))
            headings[:] = [*headings[: level - 1], match.group(2)]
            para = para[len(first) :].strip()
            if not para:
                continue
        for piece in _pieces(para, max_chars):
            if buf and sum(len(b) + 2 for b in buf) + len(piece) > max_chars:
                flush()
            buf.append(piece)
    flush()
    return chunks


def _pieces(para: str, max_chars: int) -> list[str]:
    """A paragraph as is, or cut at sentence ends, or (one huge sentence) hard-cut."""
    if len(para) <= max_chars:
        return [para]
    out: list[str] = []
    cur = ""
    for sentence in (s for s in _SENTENCE.split(para) if s):
        while len(sentence) > max_chars:
            if cur:
                out.append(cur)
                cur = ""
            out.append(sentence[:max_chars])
            sentence = sentence[max_chars:]
        if cur and len(cur) + 1 + len(sentence) > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur} {sentence}" if cur else sentence
    if cur:
        out.append(cur)
    return out
