"""`python -m gateway`: run one gateway process (same as `firsttoken gateway`)."""

from __future__ import annotations

import argparse

import uvicorn

from shared.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    parser = argparse.ArgumentParser(
        prog="firsttoken gateway", description="Run one gateway process."
    )
    parser.add_argument("--host", default=settings.host, help="bind address (FIRSTTOKEN_HOST)")
    parser.add_argument("--port", type=int, default=settings.port, help="port (FIRSTTOKEN_PORT)")
    args = parser.parse_args(argv)
    from gateway.app import create_app

    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        # Oversize frames get an `invalid_request` from the parser; only far larger ones
        # are cut off by the websocket layer itself.
        ws_max_size=max(4 * settings.max_frame_bytes, 16 << 20),
        ws_per_message_deflate=False,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
