"""Settings fail fast with messages that name the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shared.errors import ConfigError
from shared.settings import load_settings
from tests.support import ROOT, child_env


def test_defaults_are_the_embedded_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no environment, the engine is the simulator and the database is SQLite."""
    for name in list(__import__("os").environ):
        if name.startswith("FIRSTTOKEN_"):
            monkeypatch.delenv(name)
    s = load_settings()
    assert s.engine == "sim" and s.database_url.startswith("sqlite+aiosqlite")
    assert s.max_frame_bytes == 1 << 20 and s.queue_deadline_s == 10.0


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"FIRSTTOKEN_PORT": "high"}, "FIRSTTOKEN_PORT"),
        ({"FIRSTTOKEN_ENGINE": "gpt"}, "FIRSTTOKEN_ENGINE"),
        ({"FIRSTTOKEN_QUEUE_DEADLINE_S": "-1"}, "FIRSTTOKEN_QUEUE_DEADLINE_S"),
        ({"FIRSTTOKEN_ENGINE": "openai"}, "FIRSTTOKEN_ENGINE_URL"),
        ({"FIRSTTOKEN_REDIS_PREFIX": "a b"}, "FIRSTTOKEN_REDIS_PREFIX"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str
) -> None:
    """Each bad value raises ConfigError mentioning the variable to fix."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=needle):
        load_settings()


def test_commands_refuse_to_start_on_bad_settings() -> None:
    """`firsttoken gateway` exits 2 and says which variable is wrong."""
    proc = subprocess.run(
        [sys.executable, "-m", "firsttoken", "gateway"],
        cwd=ROOT,
        env=child_env(port="not-a-port"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "FIRSTTOKEN_PORT" in proc.stderr


def test_readme_documents_every_setting() -> None:
    """The README's configuration table lists every FIRSTTOKEN_ variable."""
    from shared.settings import Settings

    readme = (ROOT / "README.md").read_text()
    missing = [n for n in Settings.model_fields if f"FIRSTTOKEN_{n.upper()}" not in readme]
    assert not missing, f"add to README.md: {missing}"
