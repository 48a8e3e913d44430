"""Issue 42: every error of the `firsttoken` command is one line saying what to do, a non-zero
exit, and no traceback; `--debug` shows the traceback. Each through the real command, as a
subprocess, against a real Redis and database or a port where nothing listens."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Services
from tests.support import ROOT, child_env, free_port, python_cmd

pytestmark = pytest.mark.integration


def firsttoken(
    *args: str, cwd: Path = ROOT, pythonpath: str | None = None, **settings: str
) -> subprocess.CompletedProcess[str]:
    env = child_env(**settings)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}:{ROOT}"
    return subprocess.run(
        python_cmd("-m", "firsttoken", *args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line: stderr less the `reading Redis` line the operator commands print."""
    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [
        line
        for line in done.stderr.splitlines()
        if line.strip() and not line.startswith("firsttoken: reading Redis")
    ]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_bad_settings_name_the_variable() -> None:
    line = error_line(firsttoken("workers", redis_prefix="not a prefix"))
    assert "FIRSTTOKEN_REDIS_PREFIX" in line


def test_redis_refusing_connections_is_one_line() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = firsttoken("workers", "--json", redis_url=url)
    line = error_line(done)
    assert "Redis cannot be reached" in line and "FIRSTTOKEN_REDIS_URL" in line, line
    assert done.stdout == "", done.stdout  # --json's stdout stays clean


def test_postgres_refusing_connections_is_one_line() -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/firsttoken"
    line = error_line(firsttoken("keys", "list", database_url=url))
    assert "database" in line and "cannot be reached" in line and "FIRSTTOKEN_DATABASE_URL" in line


def test_an_unmigrated_database_says_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    line = error_line(firsttoken("keys", "create", "--tenant", "x", database_url=url))
    assert "firsttoken migrate" in line


def test_a_missing_openai_package_says_how_to_install_it(tmp_path: Path) -> None:
    """The machine has openai (the test extra): a package of that name that will not import
    stands in for its absence."""
    shadow = tmp_path / "openai"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'openai'\", name='openai')\n"
    )
    done = firsttoken("chat", "--openai", "--api-key", "k", "hi", pythonpath=str(tmp_path))
    line = error_line(done)
    assert "openai" in line and "pip install" in line


def test_bad_key_ids_are_one_line(services: Services, migrated: str) -> None:
    settings = {"database_url": services.database_url, "redis_url": services.redis_url}
    for key_id in ("not-a-key-id", "'; drop table api_keys; --"):
        line = error_line(firsttoken("keys", "revoke", key_id, **settings))
        assert "no active key" in line
    assert "key id or --tenant" in error_line(firsttoken("keys", "revoke", **settings))


def test_debug_shows_the_traceback() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = firsttoken("--debug", "workers", "--json", redis_url=url)
    assert done.returncode != 0 and "Traceback" not in done.stderr  # handled by the command
    done = firsttoken(
        "--debug", "keys", "list", database_url=url.replace("redis", "postgresql+asyncpg")
    )
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("firsttoken: ")
