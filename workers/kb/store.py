"""Knowledge-base rows in the database. Callers own the transaction (as in shared.db.writes):
``kb add`` writes every file of one invocation in one transaction, so it is all or nothing."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import KbChunk, KbDocument
from workers.embeddings.base import Vectors
from workers.kb.files import KbFile


@dataclass(frozen=True, slots=True)
class Added:
    document_id: str
    name: str
    chunks: int
    existed: bool


async def add_document(
    session: AsyncSession,
    tenant_id: str,
    file: KbFile,
    chunks: Sequence[str],
    vectors: Vectors,
    embed_model: str,
) -> Added:
    """Insert one document and its chunks; the same content again is reported, not duplicated."""
    existing = await session.scalar(
        select(KbDocument).where(
            KbDocument.tenant_id == tenant_id, KbDocument.sha256 == file.sha256
        )
    )
    if existing is not None:
        return Added(existing.id, existing.name, existing.chunks, True)
    doc_id = uuid.uuid4().hex
    session.add(
        KbDocument(
            id=doc_id,
            tenant_id=tenant_id,
            name=file.name[:500],
            sha256=file.sha256,
            chars=len(file.text),
            chunks=len(chunks),
        )
    )
    await session.flush()  # the document row first: chunks reference it
    rows = np.asarray(vectors, dtype=np.float32)
    session.add_all(
        KbChunk(
            document_id=doc_id,
            tenant_id=tenant_id,
            position=i,
            text=text,
            embedding=rows[i].tobytes(),
            embed_model=embed_model,
        )
        for i, text in enumerate(chunks)
    )
    await session.flush()
    return Added(doc_id, file.name, len(chunks), False)


async def list_documents(session: AsyncSession, tenant_id: str) -> list[KbDocument]:
    result = await session.scalars(
        select(KbDocument).where(KbDocument.tenant_id == tenant_id).order_by(KbDocument.created_at)
    )
    return list(result)


async def remove_documents(session: AsyncSession, tenant_id: str, ids: Sequence[str]) -> int:
    """Delete the tenant's documents (and their chunks) with these ids or names."""
    docs = await session.scalars(
        select(KbDocument.id).where(
            KbDocument.tenant_id == tenant_id,
            (KbDocument.id.in_(ids)) | (KbDocument.name.in_(ids)),
        )
    )
    doc_ids = list(docs)
    if not doc_ids:
        return 0
    # Chunks explicitly: SQLite enforces ON DELETE CASCADE only with foreign_keys on.
    await session.execute(delete(KbChunk).where(KbChunk.document_id.in_(doc_ids)))
    await session.execute(delete(KbDocument).where(KbDocument.id.in_(doc_ids)))
    return len(doc_ids)


async def stale_chunks(session: AsyncSession, tenant_id: str, embed_model: str) -> list[KbChunk]:
    """The tenant's chunks embedded by another model than ``embed_model``: retrieval, which
    compares vectors of one model only, does not see them."""
    result = await session.scalars(
        select(KbChunk)
        .where(KbChunk.tenant_id == tenant_id, KbChunk.embed_model != embed_model)
        .order_by(KbChunk.id)
    )
    return list(result)


async def replace_embeddings(
    session: AsyncSession, chunks: Sequence[KbChunk], vectors: Vectors, embed_model: str
) -> None:
    """Store ``chunks`` again with ``vectors`` of ``embed_model``, as new rows: new ids change
    the tenant's `kb_version`, so every worker reloads its index."""
    rows = np.asarray(vectors, dtype=np.float32)
    kept = [(c.document_id, c.tenant_id, c.position, c.text) for c in chunks]
    await session.execute(delete(KbChunk).where(KbChunk.id.in_([c.id for c in chunks])))
    session.add_all(
        KbChunk(
            document_id=doc_id,
            tenant_id=tenant_id,
            position=position,
            text=text,
            embedding=rows[i].tobytes(),
            embed_model=embed_model,
        )
        for i, (doc_id, tenant_id, position, text) in enumerate(kept)
    )
    await session.flush()


async def kb_version(session: AsyncSession, tenant_id: str) -> tuple[int, int]:
    """(chunk count, highest chunk id): changes whenever a document is added or removed."""
    row = (
        await session.execute(
            select(func.count(KbChunk.id), func.coalesce(func.max(KbChunk.id), 0)).where(
                KbChunk.tenant_id == tenant_id
            )
        )
    ).one()
    return int(row[0]), int(row[1])


async def load_chunks(
    session: AsyncSession, tenant_id: str, embed_model: str
) -> list[tuple[int, str, bytes]]:
    rows = await session.execute(
        select(KbChunk.id, KbChunk.text, KbChunk.embedding).where(
            KbChunk.tenant_id == tenant_id, KbChunk.embed_model == embed_model
        )
    )
    return [(int(r[0]), str(r[1]), bytes(r[2])) for r in rows]
