"""`firsttoken kb` against the real database and a chat that uses the knowledge base."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Services, Stack
from tests.integration.issue5 import ask, client, issue5_stack, new_tenant
from tests.support import child_env, python_cmd

pytestmark = pytest.mark.integration

DOC = """# Falcon runbook

## Restarting the falcon service

To restart the falcon service, run `falconctl restart --graceful` on the primary host,
then wait for the health page to show green. Never restart both replicas at once.

## Falcon ports

The falcon admin console listens on port 7443.
"""


@pytest.fixture(scope="module")
def kb_stack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # A generous kb deadline: the worker's first kb search loads the embedding model.
    with issue5_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("logs5k"),
        retrieval_kb_deadline_ms="5000",
        stream_idle_timeout_s="10",
    ) as s:
        yield s


def kb(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(database_url=stack.services.database_url, redis_url=stack.services.redis_url)
    return subprocess.run(
        python_cmd("-m", "firsttoken", "kb", *args), env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


async def test_kb_add_then_chat_lists_the_chunks_used(kb_stack: Stack, tmp_path: Path) -> None:
    """A Markdown file is ingested; a chat about it reports the chunk ids it put in the prompt;
    list shows the document and remove takes it out."""
    name, _, key = await new_tenant(kb_stack.services.database_url)
    doc = tmp_path / "falcon.md"
    doc.write_text(DOC)
    added = kb(kb_stack, "add", "--tenant", name, str(doc))
    assert added.returncode == 0, added.stderr
    assert "chunks" in added.stdout
    again = kb(kb_stack, "add", "--tenant", name, str(doc))
    assert "already present" in again.stdout
    c = await client(kb_stack, key)
    try:
        done = await ask(c, "k1", "How do I restart the falcon service?", cache=False)
        assert done["type"] == "done", done
        assert done["retrieval"]["sources"]["kb"]["status"] == "ok"
        assert done["chunk_ids"] and all(i.startswith("kb:") for i in done["chunk_ids"])
    finally:
        await c.ws.close()
    listed = kb(kb_stack, "list", "--tenant", name)
    assert "falcon.md" in listed.stdout
    doc_id = listed.stdout.split()[0]
    removed = kb(kb_stack, "remove", "--tenant", name, doc_id)
    assert removed.returncode == 0 and "removed 1" in removed.stdout
    assert "no documents" in kb(kb_stack, "list", "--tenant", name).stdout


async def test_reembed_brings_chunks_of_another_model_back_to_retrieval(
    kb_stack: Stack, tmp_path: Path
) -> None:
    """Chunks stored by MiniLM alone (an earlier version's default) are not retrieved by the
    per-language embedder until `kb reembed` stores them again with it; a second run has
    nothing to do."""
    name, _, key = await new_tenant(kb_stack.services.database_url)
    doc = tmp_path / "falcon.md"
    doc.write_text(DOC)
    env = child_env(
        database_url=kb_stack.services.database_url,
        redis_url=kb_stack.services.redis_url,
        embed_local_model="minilm",
    )
    added = await asyncio.to_thread(
        subprocess.run,
        python_cmd("-m", "firsttoken", "kb", "add", "--tenant", name, str(doc)), env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    c = await client(kb_stack, key)
    try:
        done = await ask(c, "r1", "How do I restart the falcon service?", cache=False)
        assert done["type"] == "done", done
        assert not done.get("chunk_ids")  # another model's vectors are not compared
        again = kb(kb_stack, "reembed", "--tenant", name)
        assert again.returncode == 0, again.stderr
        assert "re-embedded" in again.stdout and "use-multilingual" in again.stdout
        # Workers check the tenant's knowledge-base version every few seconds.
        for attempt in range(30):
            done = await ask(
                c, f"r2-{attempt}", "How do I restart the falcon service?", cache=False
            )
            if done.get("chunk_ids"):
                break
            await asyncio.sleep(0.5)
        assert done["chunk_ids"] and all(i.startswith("kb:") for i in done["chunk_ids"])
    finally:
        await c.ws.close()
    assert "nothing to do" in kb(kb_stack, "reembed", "--tenant", name).stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        (b"caf\xe9 latin-1 text", "not UTF-8"),
        (None, "cannot read it"),
    ],
)
async def test_bad_file_fails_the_whole_add(
    kb_stack: Stack, tmp_path: Path, content: bytes | None, expected: str
) -> None:
    """A binary, non-UTF-8 or missing file among good ones: clear error, nothing written."""
    name, _, _ = await new_tenant(kb_stack.services.database_url)
    good = tmp_path / "good.md"
    good.write_text(DOC)
    bad = tmp_path / "bad.bin"
    if content is not None:
        bad.write_bytes(content)
    result = kb(kb_stack, "add", "--tenant", name, str(good), str(bad))
    assert result.returncode == 2
    assert expected in result.stderr and "bad.bin" in result.stderr
    assert "no documents" in kb(kb_stack, "list", "--tenant", name).stdout


def test_unknown_tenant_is_a_clear_error(kb_stack: Stack) -> None:
    """kb list for a tenant that does not exist says so."""
    result = kb(kb_stack, "list", "--tenant", "nobody-here")
    assert result.returncode == 2 and "no tenant named 'nobody-here'" in result.stderr
