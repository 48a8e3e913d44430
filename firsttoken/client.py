"""`firsttoken chat`: a small websocket client that streams one answer and prints the timings."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import websockets

from shared.errors import ErrorFrame
from shared.protocol import DoneFrame, parse_server_frame

DEV_FILE = Path(".firsttoken") / "dev.json"


def _defaults() -> dict[str, str]:
    try:
        return dict(json.loads(DEV_FILE.read_text()))
    except (OSError, ValueError):
        return {}


async def ask(
    question: str,
    *,
    url: str,
    api_key: str,
    model: str | None = None,
    max_tokens: int | None = None,
    cache: bool = True,
    out: Any = sys.stdout,
) -> DoneFrame | ErrorFrame:
    """Stream one answer to `out`; return the final `done` or `error` frame."""
    chat_id = uuid.uuid4().hex[:8]
    frame: dict[str, Any] = {
        "type": "chat",
        "id": chat_id,
        "messages": [{"role": "user", "content": question}],
        "cache": cache,
    }
    if model:
        frame["model"] = model
    if max_tokens:
        frame["max_tokens"] = max_tokens
    headers = {"Authorization": f"Bearer {api_key}"}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps(frame))
        async for raw in ws:
            msg = parse_server_frame(raw)
            if msg["type"] == "token":
                out.write(msg["text"])
                out.flush()
            elif msg["type"] == "done" or msg["type"] == "error":
                return msg
    return {
        "type": "error",
        "id": chat_id,
        "code": "closed",
        "message": "the gateway closed the connection before the answer ended; retry",
    }


def run_chat(
    question: str,
    *,
    url: str | None,
    api_key: str | None,
    model: str | None,
    max_tokens: int | None,
    no_cache: bool,
    openai: bool = False,
) -> int:
    dev = _defaults()
    url = url or dev.get("url") or "ws://127.0.0.1:8000/v1/ws"
    api_key = (
        api_key
        or os.environ.get("FIRSTTOKEN_API_KEY")
        or os.environ.get("FIRSTTOKEN_DEV_API_KEY")
        or dev.get("api_key")
    )
    if not api_key:
        print("firsttoken: no API key; pass --api-key or set FIRSTTOKEN_API_KEY", file=sys.stderr)
        return 2
    if openai:
        from firsttoken.openaiclient import run_openai_chat

        return run_openai_chat(
            question,
            url=url,
            api_key=api_key,
            model=model,
            max_tokens=max_tokens,
            no_cache=no_cache,
        )
    try:
        result = asyncio.run(
            ask(
                question,
                url=url,
                api_key=api_key,
                model=model,
                max_tokens=max_tokens,
                cache=not no_cache,
            )
        )
    except OSError as exc:
        print(
            f"firsttoken: cannot reach {url}: {exc} (is `firsttoken up` running?)", file=sys.stderr
        )
        return 1
    except ValueError as exc:  # a frame this client cannot read
        print(f"firsttoken: {exc}", file=sys.stderr)
        return 1
    print()
    if result["type"] == "error":
        print(f"error {result['code']}: {result['message']}", file=sys.stderr)
        return 1
    timings = " ".join(f"{k}={v:g}" for k, v in result["timings"].items())
    usage = result["usage"]
    print(
        f"[{result['model']} finish={result['finish_reason']} cached={result['cached']} "
        f"prompt={usage['prompt_tokens']} completion={usage['completion_tokens']}]"
    )
    print(f"[ms: {timings}]")
    return 0
