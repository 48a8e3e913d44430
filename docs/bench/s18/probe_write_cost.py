"""What a small loopback write costs when it wakes an idle reader, alone and shared by ten.

    python docs/bench/s18/probe_write_cost.py

A forked reader process reads a TCP socket in a loop; this process writes 300-byte messages,
one per write or ten per write, and spins 0.3 ms between writes so that the reader has gone back
to sleep each time. Prints the writer's CPU (thread time around each send) and the reader's
(process time) per message. Session 18's probe for the Redis pipe's per-turn writes
(shared/redispipe.py).
"""

from __future__ import annotations

import os
import socket
import time

MESSAGES = 3000
SIZE = 300


def reader(server: socket.socket) -> None:
    conn, _ = server.accept()
    start = time.process_time()
    reads = 0
    while conn.recv(65536):
        reads += 1
    per_message = (time.process_time() - start) / MESSAGES * 1e6
    print(f"  reader: {per_message:.1f} us CPU per message, {reads} reads", flush=True)


def writer(port: int, batch: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * SIZE * batch
    spent = 0.0
    for _ in range(MESSAGES // batch):
        start = time.thread_time()
        sock.send(payload)
        spent += time.thread_time() - start
        until = time.perf_counter() + 0.0003
        while time.perf_counter() < until:  # let the reader go idle again
            pass
    sock.close()
    print(
        f"{batch} per write: writer {spent / MESSAGES * 1e6:.1f} us CPU per message "
        f"({spent / (MESSAGES // batch) * 1e6:.1f} per write)",
        flush=True,
    )


def main() -> None:
    for batch in (1, 10):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        pid = os.fork()
        if pid == 0:
            reader(server)
            os._exit(0)
        writer(server.getsockname()[1], batch)
        os.waitpid(pid, 0)
        server.close()


if __name__ == "__main__":
    main()
