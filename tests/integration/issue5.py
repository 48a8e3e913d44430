"""Helpers of the issue-5 integration tests: a stack with small/large models and a summarize
worker, tenants of their own, and a database reader."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websockets

from shared.db.session import make_engine, make_sessionmaker
from tests.integration.conftest import Client, Services, Stack, make_stack


async def new_tenant(database_url: str) -> tuple[str, str, str]:
    """A fresh tenant and key: (tenant name, tenant id, api key)."""
    from shared.db.apikeys import create_tenant_and_key

    name = f"t5-{uuid.uuid4().hex[:8]}"
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            tenant_id, _, key = await create_tenant_and_key(session, name)
            await session.commit()
    finally:
        await engine.dispose()
    return name, tenant_id, key


async def scalar(database_url: str, stmt: Any) -> Any:
    engine = make_engine(database_url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await session.scalar(stmt)
    finally:
        await engine.dispose()


@contextmanager
def issue5_stack(services: Services, api_key: str, logs: Path, **settings: str) -> Iterator[Stack]:
    """Sim-server behind two table models (small, large), chat + bulk + summarize workers."""
    with make_stack(
        services, api_key, logs, workers=0, bulk=False, gateway=False, **settings
    ) as stack:
        url = stack.settings["engine_url"]
        stack.settings["models"] = json.dumps(
            [
                {"name": "small", "engine": "openai", "url": url, "served_model": "sim",
                 "role": "small"},
                {"name": "large", "engine": "openai", "url": url, "served_model": "sim",
                 "role": "large"},
            ]
        )  # fmt: skip
        stack.start_worker("chat0")
        stack.start_worker("bulk", "bulk")
        stack.start_worker("summarize", "summarize")
        stack.start_gateway()
        stack.wait_ready()
        yield stack


async def client(stack: Stack, key: str) -> Client:
    ws = await websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {key}"}
    )
    return Client(ws)


async def ask(c: Client, chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    """One chat to its end; returns the `accepted` frame merged under the last frame's key."""
    await c.chat(chat_id, text, **extra)
    accepted = await c.next_for(chat_id)
    _, last = await c.until_end(chat_id, timeout=20)
    if accepted["type"] == "error":
        return accepted
    last["accepted"] = accepted
    return last


def run(coro: Any) -> Any:
    return asyncio.get_event_loop().run_until_complete(coro)
