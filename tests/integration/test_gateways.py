"""Several gateway processes on one port (`gateway --reuse-port`), as the bench's --gateways and
a one-host deployment without a load balancer run them."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from gateway.__main__ import reuse_port_socket
from shared.errors import ConfigError
from tests.integration.conftest import Services, Stack, make_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration


def _answering(stack: Stack, tries: int = 60) -> set[str]:
    """The gateway processes that answered /readyz (ready) over `tries` new connections."""
    names = set()
    for _ in range(tries):
        status, body = stack.get("/readyz")
        if status == 200:
            names.add(json.loads(body)["gateway"])
    return names


async def _answer(client: Any, chat_id: str) -> dict[str, Any]:
    await client.chat(chat_id)
    frames, done = await client.until_end(chat_id, timeout=15)
    assert done["type"] == "done", done
    assert [f["seq"] for f in frames] == list(range(len(frames)))
    return done


async def test_two_gateways_share_a_port_and_survive_each_other(
    services: Services, migrated: str, tmp_path: Path, connect: Any
) -> None:
    with make_stack(services, migrated, tmp_path, gateway=False) as stack:
        stack.start_gateway(2)
        wait_until(lambda: len(_answering(stack, 10)) == 2, 60, what="both gateways ready")
        # Connections spread over both processes; every chat is answered whole.
        clients = [await connect(stack) for _ in range(8)]
        for i, client in enumerate(clients):
            await _answer(client, f"c{i}")

        # One gateway gone: its clients lose their connection, new ones reach the other.
        stack.procs["gateway0"].kill()
        wait_until(lambda: not stack.procs["gateway0"].alive(), 10, what="gateway0 gone")
        assert len(_answering(stack, 20)) == 1
        for i in range(4):
            await _answer(await connect(stack), f"after{i}")


def test_reuse_port_socket_binds_beside_its_peers_and_names_a_taken_port() -> None:
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)  # a peer: allowed
    plain = socket.socket()
    try:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        taken = plain.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{taken} with --reuse-port"):
            reuse_port_socket("127.0.0.1", taken)  # held by a process without SO_REUSEPORT
    finally:
        for sock in (first, second, plain):
            sock.close()


def test_a_gateway_whose_port_is_taken_exits_with_a_startup_failure(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """As `uvicorn.run` does: status 3 and uvicorn's message naming the address, not 0."""
    with make_stack(services, migrated, tmp_path, workers=0, bulk=False, gateway=False) as stack:
        held = socket.socket()
        try:
            held.bind(("127.0.0.1", 0))
            held.listen()
            port = held.getsockname()[1]
            gateway = stack.start("gateway", ["-m", "gateway", "--port", str(port)])
            wait_until(lambda: not gateway.alive(), 60, what="the gateway to give up")
            assert gateway.popen.returncode == 3
            assert "address already in use" in gateway.output()
        finally:
            held.close()
