"""Exercise VLLMEngine (in-process AsyncLLM) and print what happened as one JSON line.

Run with the vLLM virtualenv's python (tests/vllm/test_asyncllm.py does):

    ~/.cache/firsttoken/vllm/bin/python tests/vllm/asyncllm_check.py MODEL_DIR

Three requests: one streamed to its end, one stopped by ``abort(request_id)`` from another
task, one stopped by cancelling the consuming task. The test asserts on the JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from shared.protocol import Message
from shared.settings import load_settings
from workers.engines.base import EngineRequest
from workers.engines.vllm_engine import VLLMEngine


def _unfinished(engine: VLLMEngine) -> int:
    # AsyncLLM's own count of requests it is still tracking: 0 once an abort has landed.
    llm: Any = engine._llm
    return int(llm.output_processor.get_num_unfinished_requests())


async def main(model_dir: str) -> dict[str, Any]:
    settings = load_settings(engine="vllm", vllm_model_path=model_dir)
    engine = VLLMEngine(
        settings, max_model_len=1024, dtype="float32", enforce_eager=True, disable_log_stats=True
    )
    request = EngineRequest(
        messages=[Message(role="user", content="w1 w2 w3")], model="tiny", max_tokens=16
    )
    result: dict[str, Any] = {}
    try:
        # 1. streamed to the end
        start = time.perf_counter()
        deltas = [d async for d in engine.stream(request, request_id="full")]
        result["full"] = {
            "texts": sum(1 for d in deltas if d.text),
            "finish_reason": deltas[-1].finish_reason,
            "prompt_tokens": deltas[-1].prompt_tokens,
            "completion_tokens": deltas[-1].completion_tokens,
            "seconds": round(time.perf_counter() - start, 3),
        }
        # 2. abort(request_id) from another task after 3 deltas
        long = EngineRequest(messages=request.messages, model="tiny", max_tokens=900)
        seen: list[str | None] = []
        three = asyncio.Event()

        async def consume() -> None:
            async for d in engine.stream(long, request_id="aborted"):
                seen.append(d.finish_reason)
                if len(seen) == 3:
                    three.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three.wait(), 60)
        aborted_at = time.perf_counter()
        await engine.abort("aborted")
        await asyncio.wait_for(task, 10)
        result["abort"] = {
            "deltas": len(seen),
            "last": seen[-1],
            "ended_ms": round((time.perf_counter() - aborted_at) * 1000, 1),
            "unfinished": _unfinished(engine),
        }
        # 3. the consuming task cancelled (a worker's cancel path)
        count = 0
        three = asyncio.Event()

        async def consume_until_cancelled() -> None:
            nonlocal count
            async for _ in engine.stream(long, request_id="cancelled"):
                count += 1
                if count == 3:
                    three.set()

        task = asyncio.create_task(consume_until_cancelled())
        await asyncio.wait_for(three.wait(), 60)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(200):  # the abort reaches the engine core asynchronously
            if _unfinished(engine) == 0:
                break
            await asyncio.sleep(0.01)
        result["cancel"] = {"unfinished": _unfinished(engine)}
        stats = engine.stats
        result["stats"] = {
            "started": stats.started,
            "finished": stats.finished,
            "aborted": stats.aborted,
            "running": stats.running,
        }
    finally:
        await engine.aclose()
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
