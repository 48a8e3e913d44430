"""`firsttoken metrics-server`: GET /metrics for every firsttoken process of a host that runs no
gateway (a chat-worker or bulk-worker host, docs/operations.md "Several hosts").

A gateway already answers for its whole host (shared/metrics/: prometheus_client's
multiprocess mode); on a host of workers only nobody would read their directory. This serves
it, merged the same way and with the same dead-process sweep. Queue depths are the gateways'
to report (one reading per scrape of the cluster, not one per host).
"""

from __future__ import annotations

import argparse
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared.metrics import multiproc


def _handler(directory: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only GET /metrics is served here")
                return
            multiproc.sweep_dead(directory)
            body = generate_latest(multiproc.collected(directory))
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape is noise

    return Handler


def _cmd_metrics_server(args: argparse.Namespace) -> int:
    from shared.settings import get_settings

    directory = get_settings().metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not os.path.isdir(directory):
        print(
            "firsttoken metrics-server: set FIRSTTOKEN_METRICS_DIR to the directory this host's "
            f"workers write their series to (now: {directory or 'unset'})",
            file=sys.stderr,
        )
        return 2
    server = ThreadingHTTPServer((args.host, args.port), _handler(directory))
    print(f"firsttoken metrics-server: http://{args.host}:{server.server_port}/metrics")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def add_parser(sub: Any) -> None:
    help_ = (
        "Serve GET /metrics for the firsttoken processes of a host without a gateway (workers "
        "only): every series of FIRSTTOKEN_METRICS_DIR, merged as a gateway's /metrics does."
    )
    p = sub.add_parser("metrics-server", help=help_, description=help_)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=9101, help="port to listen on (default 9101)")
    p.set_defaults(fn=_cmd_metrics_server)
