"""`python -m gateway`: run one gateway process (same as `firsttoken gateway`)."""

from __future__ import annotations

import argparse
import contextlib
import socket

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from gateway.headertimeout import header_timeout_protocol
from gateway.wsprotocol import Utf8WarningProtocol
from shared.errors import ConfigError
from shared.logs import configure_logging
from shared.settings import get_settings


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound with SO_REUSEPORT, so several gateway processes on this host listen on one
    port and the kernel spreads new connections across them (no load balancer in front)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ConfigError("--reuse-port needs SO_REUSEPORT (Linux, BSD, macOS)")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} with --reuse-port: {exc}") from exc
    return sock


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    parser = argparse.ArgumentParser(
        prog="firsttoken gateway", description="Run one gateway process."
    )
    parser.add_argument("--host", default=settings.host, help="bind address (FIRSTTOKEN_HOST)")
    parser.add_argument("--port", type=int, default=settings.port, help="port (FIRSTTOKEN_PORT)")
    parser.add_argument(
        "--reuse-port",
        action="store_true",
        help="share the port with the other gateway processes started with it on this host "
        "(SO_REUSEPORT): one per core, the kernel spreads the connections",
    )
    args = parser.parse_args(argv)
    from gateway.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        host=args.host,
        port=args.port,
        loop="uvloop",
        # httptools, with a deadline on reading headers (gateway/headertimeout.py).
        http=header_timeout_protocol(settings.http_header_timeout_s),
        # websockets-sansio, with invalid UTF-8 as one WARNING line (gateway/wsprotocol.py).
        ws=Utf8WarningProtocol,
        # Oversize frames get an `invalid_request` from the parser; only far larger ones
        # are cut off by the websocket layer itself.
        ws_max_size=max(4 * settings.max_frame_bytes, 16 << 20),
        ws_per_message_deflate=False,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    # After uvicorn's own logging set-up (in Config), which covers only its loggers.
    configure_logging(settings.log_level)
    server = uvicorn.Server(config)
    sockets = [reuse_port_socket(args.host, args.port)] if args.reuse_port else None
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    # As uvicorn.run: a server that never started (its port taken, say) is a failure.
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
