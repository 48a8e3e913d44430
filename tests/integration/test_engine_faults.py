"""Engine faults through the whole stack: each ends the chat with a defined error, in time.

One stack serves several models, each a sim-server misbehaving in one way (firsttoken/simserver.py
fault modes), so every fault and every failover path runs on the same gateway and worker.
Deadlines are short: first token 1 s, idle 1 s; the gateway's own watchdog is at 4 s, so
every error seen here comes from the worker's deadlines, not the watchdog.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from firsttoken.procs import Child
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import child_env, free_port, port_open, python_cmd, wait_until

pytestmark = pytest.mark.integration

FIRST_TOKEN_S = 1.0
IDLE_S = 1.0
SIM = ("--ttft-ms", "20", "--itl-ms", "5", "--max-tokens", "16")
FAULTS: dict[str, tuple[str, ...]] = {
    "ok": (),
    "http500": ("--status", "500"),
    "http503": ("--status", "503"),
    "malformed": ("--malformed-after", "3"),
    "stall": ("--stall-after", "3"),
    "silent": ("--stall-after", "0"),
    "drop": ("--drop-after", "3"),
}


def _models(ports: dict[str, int], dead_port: int) -> list[dict[str, Any]]:
    url = "http://127.0.0.1:{}/v1".format
    models: list[dict[str, Any]] = [
        {"name": name, "url": url(port), "served_model": "sim"} for name, port in ports.items()
    ]
    models.append({"name": "down", "url": url(dead_port), "served_model": "sim"})
    # Fallback chains: to "ok" after each kind of failure before the first token, and one
    # after the first token (stall), which must not switch.
    for name, base in (
        ("silent-then-ok", "silent"),
        ("down-then-ok", "down"),
        ("http500-then-ok", "http500"),
        ("stall-then-ok", "stall"),
    ):
        port = dead_port if base == "down" else ports[base]
        models.append({"name": name, "url": url(port), "served_model": "sim", "fallbacks": ["ok"]})
    models.append(
        {
            "name": "all-bad",
            "url": url(ports["silent"]),
            "served_model": "sim",
            "fallbacks": ["down", "http500"],
        }
    )
    return models


@pytest.fixture(scope="module")
def faulty(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A stack whose model table points at one misbehaving sim-server per fault."""
    logs = tmp_path_factory.mktemp("fault-logs")
    sims: list[Child] = []
    ports: dict[str, int] = {}
    try:
        for name, args in FAULTS.items():
            port = ports[name] = free_port()
            cmd = python_cmd("-m", "firsttoken.simserver", "--port", str(port), *SIM, *args)
            sims.append(Child(cmd, child_env(), logs / f"sim-{name}.log"))
        for name, port in ports.items():
            wait_until(lambda p=port: port_open(p), 20, what=f"sim-server {name}")
        settings = {
            "models": json.dumps(_models(ports, free_port())),
            "first_token_deadline_s": str(FIRST_TOKEN_S),
            "engine_idle_timeout_s": str(IDLE_S),
            "stream_idle_timeout_s": "4",
        }
        with make_stack(services, migrated, logs, **settings) as stack:
            stack.wait_ready()
            yield stack
    finally:
        for proc in sims:
            proc.stop()


async def _chat(connect: Any, stack: Stack, model: str) -> tuple[list[str], dict[str, Any], float]:
    client = await connect(stack)
    start = time.monotonic()
    # A fresh question each time: a cached answer would skip the engine under test.
    await client.chat("f", f"tell me {uuid.uuid4().hex}", model=model)
    accepted = await client.next_for("f")
    assert accepted["type"] == "accepted", accepted
    tokens, last = await client.until_end("f", timeout=10)
    return [t["text"] for t in tokens], last, time.monotonic() - start


async def test_unreachable_engine_is_engine_error_naming_it(connect: Any, faulty: Stack) -> None:
    """Nothing listening: `engine_error` saying unreachable, within the first-token deadline;
    the message names the model, never the engine's address."""
    tokens, last, took = await _chat(connect, faulty, "down")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert "unreachable" in last["message"] and not tokens
    assert last["message"].startswith("model 'down': "), last
    _assert_no_address(faulty, last["message"])
    assert took < FIRST_TOKEN_S + 1


@pytest.mark.parametrize("model", ["http500", "http503"])
async def test_http_error_is_engine_error_with_the_status(
    connect: Any, faulty: Stack, model: str
) -> None:
    """An HTTP error status (after retries, for 503) is `engine_error` quoting the status."""
    tokens, last, took = await _chat(connect, faulty, model)
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert f"HTTP {model[-3:]}" in last["message"] and "simulated failure" in last["message"]
    assert took < FIRST_TOKEN_S + 1 and not tokens
    assert last["message"].startswith(f"model {model!r}: "), last
    _assert_no_address(faulty, last["message"])


def _assert_no_address(stack: Stack, message: str) -> None:
    """No engine URL, host or port of the stack's model table in a client's message."""
    assert "127.0.0.1" not in message and "http://" not in message, message
    for entry in json.loads(stack.settings["models"]):
        assert entry["url"].rsplit(":", 1)[1].split("/")[0] not in message, message


async def test_malformed_chunk_mid_stream_is_engine_error(connect: Any, faulty: Stack) -> None:
    """A chunk that is not JSON after 3 tokens: the 3 tokens, then `engine_error` (malformed)."""
    tokens, last, _ = await _chat(connect, faulty, "malformed")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert "malformed" in last["message"] and "".join(tokens)


async def test_connection_cut_mid_stream_is_engine_error(connect: Any, faulty: Stack) -> None:
    """The server drops the connection after 3 tokens: `engine_error` (broke off)."""
    tokens, last, _ = await _chat(connect, faulty, "drop")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert "broke off" in last["message"] and "".join(tokens)


async def test_stall_mid_stream_ends_within_the_idle_deadline(connect: Any, faulty: Stack) -> None:
    """Silence after 3 tokens: `engine_error` (stalled) about IDLE_S later, not the watchdog's."""
    tokens, last, took = await _chat(connect, faulty, "stall")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert "stalled" in last["message"] and "".join(tokens)
    assert IDLE_S <= took < IDLE_S + 1.5


async def test_no_first_token_is_timeout_within_the_deadline(connect: Any, faulty: Stack) -> None:
    """A model that never sends a token: `timeout` about FIRST_TOKEN_S after the chat."""
    tokens, last, took = await _chat(connect, faulty, "silent")
    assert last["type"] == "error" and last["code"] == "timeout", last
    assert "first token" in last["message"] and not tokens
    assert FIRST_TOKEN_S <= took < FIRST_TOKEN_S + 1.5


@pytest.mark.parametrize("model", ["silent-then-ok", "down-then-ok", "http500-then-ok"])
async def test_failure_before_first_token_fails_over_and_done_names_the_model(
    connect: Any, faulty: Stack, model: str
) -> None:
    """Before any token, the fallback answers; `done.model` names the fallback."""
    tokens, last, took = await _chat(connect, faulty, model)
    assert last["type"] == "done", last
    assert last["model"] == "ok" and "".join(tokens)
    assert took < FIRST_TOKEN_S + 2


async def test_after_first_token_there_is_no_silent_switch(connect: Any, faulty: Stack) -> None:
    """A stall after tokens ends with `engine_error` even though a fallback exists."""
    tokens, last, _ = await _chat(connect, faulty, "stall-then-ok")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    assert "stall-then-ok" in last["message"] and "".join(tokens)


async def test_whole_chain_failing_names_every_model(connect: Any, faulty: Stack) -> None:
    """silent -> down -> http500: one `engine_error` listing all three, in bounded time."""
    tokens, last, took = await _chat(connect, faulty, "all-bad")
    assert last["type"] == "error" and last["code"] == "engine_error", last
    for name in ("all-bad", "down", "http500"):
        assert f"{name}:" in last["message"]
    assert not tokens and took < FIRST_TOKEN_S * 3 + 1.5


async def test_unknown_model_is_refused_by_the_gateway_listing_known(
    connect: Any, faulty: Stack
) -> None:
    """A model outside the table: `invalid_request` before enqueue, naming the known models."""
    client = await connect(faulty)
    await client.chat("u", "hi", model="gpt-9")
    frame = await client.next_for("u")
    assert frame["type"] == "error" and frame["code"] == "invalid_request", frame
    assert "gpt-9" in frame["message"] and "down-then-ok" in frame["message"]


def test_models_route_lists_the_table(faulty: Stack) -> None:
    """GET /v1/models (with a key) lists every configured model; without a key it is 401."""
    req = urllib.request.Request(
        faulty.http + "/v1/models", headers={"Authorization": f"Bearer {faulty.api_key}"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        listing = json.loads(resp.read())
    names = [m["id"] for m in listing["data"]]
    assert names[:2] == ["ok", "http500"] and "all-bad" in names
    assert listing["data"][0]["default"] is True
    assert faulty.get("/v1/models")[0] == 401


async def test_failover_aborts_the_given_up_request_on_its_server(
    connect: Any, faulty: Stack
) -> None:
    """The model given up on sees its request closed: its sim counts it aborted, none running."""
    table = json.loads(faulty.settings["models"])
    url = next(m["url"] for m in table if m["name"] == "silent")
    metrics = url.removesuffix("/v1") + "/metrics"

    def metric(name: str) -> float:
        with urllib.request.urlopen(metrics, timeout=2) as resp:
            text = resp.read().decode()
        return float(next(ln for ln in text.splitlines() if ln.startswith(name + " ")).split()[1])

    before = metric("firsttoken_sim_requests_aborted_total")
    _, last, _ = await _chat(connect, faulty, "silent-then-ok")
    assert last["type"] == "done" and last["model"] == "ok", last
    wait_until(lambda: metric("firsttoken_sim_requests_running") == 0, 5, what="abort")
    assert metric("firsttoken_sim_requests_aborted_total") == before + 1
