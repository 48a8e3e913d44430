"""What one hop between two processes costs on this machine when the other side is asleep.

    python bench/hop.py [--rounds 500] [--idle-ms 10,150]

A child process echoes 32-byte messages over loopback TCP (TCP_NODELAY, blocking sockets).
The parent sends one, waits for the echo, and times the round trip: back to back, and after
a pause before each send (10 and 150 ms by default; the 150 ms cases a tenth as many), so
both processes, and both vCPUs when nothing else runs, are idle when the message is written.
How late each pause's sleep woke is printed too. A lone chat's processes all sleep through
the simulator's 150 ms to a first token; its path crosses eight hops in the stack, two in the
direct mode.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time


def _echo(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := sock.recv(64):
            sock.sendall(data)


def _rounds(sock: socket.socket, rounds: int, pause_s: float) -> tuple[list[float], list[float]]:
    """Round trips (µs), and how late each pause's sleep woke (µs)."""
    times, late = [], []
    for _ in range(rounds):
        if pause_s:
            slept = time.perf_counter()
            time.sleep(pause_s)
            late.append((time.perf_counter() - slept - pause_s) * 1e6)
        start = time.perf_counter()
        sock.sendall(b"x" * 32)
        got = 0
        while got < 32:
            got += len(sock.recv(64))
        times.append((time.perf_counter() - start) * 1e6)
    return times, late


def _pauses(text: str) -> list[float]:
    try:
        pauses = [float(ms) for ms in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ms") from None
    if any(ms <= 0 for ms in pauses):
        raise argparse.ArgumentTypeError("every pause must be more than 0 ms")
    return pauses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=500, help="round trips per case")
    p.add_argument(
        "--idle-ms",
        type=_pauses,
        default=[10.0, 150.0],
        help="comma-separated pauses before each send, ms (default 10,150: 150 is the "
        "simulator's wait for a first token, which every process of a lone chat sleeps through)",
    )
    args = p.parse_args()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        pid = os.fork()
        if pid == 0:
            server.close()
            _echo(port)
            os._exit(0)
        sock, _ = server.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _rounds(sock, 100, 0.0)  # warm-up
    for pause_ms in (0.0, *args.idle_ms):
        label = f"after {pause_ms:g} ms idle" if pause_ms else "back to back"
        rounds = args.rounds if pause_ms < 50 else max(20, args.rounds // 10)
        times, late = _rounds(sock, rounds, pause_ms / 1000)
        t = sorted(times)
        line = f"{label:>18}: round trip p50 {statistics.median(t):7.1f} us, "
        line += f"p90 {t[int(len(t) * 0.9)]:7.1f} us"
        if late:
            line += f"; the sleep woke late by p50 {statistics.median(late):6.1f} us"
        print(line)
    sock.close()
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
