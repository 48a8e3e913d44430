"""`firsttoken chat --openai`: one question through the gateway's OpenAI door
(`POST /v1/chat/completions`) with the official `openai` SDK, the reference client."""

from __future__ import annotations

import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def base_url(url: str) -> str:
    """The OpenAI base URL (`http://host:port/v1`) of a gateway, given its websocket URL
    (`ws://host:port/v1/ws`) or its HTTP address."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme or "http")
    return urlunsplit((scheme, parts.netloc, "/v1", "", ""))


def default_model(client: Any) -> str:
    """The gateway's default model (its /v1/models marks it), else the first one listed."""
    models = list(client.models.list())
    for model in models:
        if getattr(model, "default", False):
            return str(model.id)
    if not models:
        raise ValueError("the gateway lists no models")
    return str(models[0].id)


def run_openai_chat(
    question: str,
    *,
    url: str,
    api_key: str,
    model: str | None,
    max_tokens: int | None,
    no_cache: bool,
) -> int:
    import openai

    client = openai.OpenAI(base_url=base_url(url), api_key=api_key, max_retries=0)
    started = time.perf_counter()
    first: float | None = None
    final: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    try:
        model = model or default_model(client)
        extra: dict[str, Any] = {"x_firsttoken": {"cache": False}} if no_cache else {}
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=max_tokens if max_tokens is not None else openai.omit,
            extra_body=extra or None,
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                if choice.delta.content:
                    if first is None:
                        first = time.perf_counter()
                    print(choice.delta.content, end="", flush=True)
                if choice.finish_reason is not None:
                    final = {
                        "model": chunk.model,
                        "finish_reason": choice.finish_reason,
                        **(getattr(chunk, "x_firsttoken", None) or {}),
                    }
    except openai.APIConnectionError as exc:
        print(f"\nfirsttoken: cannot reach {base_url(url)}: {exc}", file=sys.stderr)
        return 1
    except openai.APIError as exc:
        print(f"\nerror {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    ttft = "" if first is None else f" client_ttft_ms={(first - started) * 1000:.1f}"
    print(
        f"[{final.get('model')} finish={final.get('finish_reason')} "
        f"cached={final.get('cached')} route={final.get('route')} "
        f"prompt={usage.get('prompt_tokens')} completion={usage.get('completion_tokens')}]"
    )
    timings = " ".join(f"{k}={v:g}" for k, v in (final.get("timings") or {}).items())
    print(f"[ms: {timings}{ttft}]")
    return 0
