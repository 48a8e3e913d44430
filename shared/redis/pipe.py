"""One pipelined Redis connection per process for the commands on a chat's path.

A redis-py call takes a pooled connection, packs, writes, waits for the reply and gives the
connection back: one system call each way per command, and a new pooled connection (a TCP
handshake) whenever a burst needs more than are open. Here a command is queued and the call
returns; a writer task sends everything queued during one turn of the event loop in one write,
and a reader task takes the replies off the socket in order. A chat worker sends every job's
token chunks this way; the gateway its admission and settlement scripts; both read a reply by
awaiting the call's future.

Lingering: with ``linger_s`` the writer waits that long after the first queued command before
it writes, so the commands of many chats go out in one write and Redis wakes once for them
(like Kafka's ``linger.ms``). It applies only to calls nobody waits on (token chunks after a
chat's first, `done`); a call with a reply future, or an ``urgent`` one, writes the buffer
at once as without it. A few milliseconds cost Redis noticeably less CPU per token in a busy
chat worker (docs/benchmarks.md).

Ordering: Redis runs one connection's commands in the order they arrive, so everything sent
through one pipe runs in the order it was sent, without waiting for each reply (a job's tokens,
then its `done`).

Merging: runs of one script queued back to back with :meth:`KeyedScript.merge` (every job's
token chunks, whatever the job) go out as one EVALSHA with their keys and arguments one run
after another, so Redis parses, looks up and starts the script once for all of them and sends
one reply. Anything else queued closes the run of merged calls, so the order above holds.

Faults: replies are matched to the calls in flight in order. An error reply goes to the call's
future, or is logged when the call asked for no reply (a ``NOSCRIPT`` after a ``SCRIPT FLUSH``
is handled like a lost connection, and so is a ``READONLY``: the server was demoted by a
Sentinel failover, and the reconnect asks the Sentinels for the new master). If the connection
drops, the pipe reconnects, loads its scripts again and sends again every call not yet answered
whose caller still waits: **send only commands that may run twice** (a chunk is dropped by its
``seq``; the admission script is idempotent per job). A caller that gave up (its future
cancelled) is not sent again, though a call already written may have run. While Redis is
unreachable the calls wait in memory; after ``down_fail_s`` without Redis, or with
``max_pending`` calls waiting, a new call raises :class:`ConnectionError`, so a chat ends
instead of buffering forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from redis.exceptions import NoScriptError, ReadOnlyError, RedisError, ResponseError

from shared.logs import OutageLog
from shared.redis.address import RedisAddress
from shared.redis.connection import READ_SIZE, RedisConnection
from shared.redis.resp import bulks, pack
from shared.redis.scripts import LuaScript

log = logging.getLogger(__name__)

Reply = asyncio.Future[object]


# Most runs merged into one EVALSHA: Redis runs a script to its end before it serves another
# client, so a long one would hold up every other client for all of its runs.
MAX_MERGED_RUNS = 64


@dataclass(slots=True)
class _Call:
    command: bytes  # packed, sent again as is after a reconnect
    reply: Reply | None  # set to the answer, for the calls that want it
    runs: int = 1  # the calls it stands for (merged runs), as max_pending counts them


@dataclass(slots=True)
class _Merged:
    """Runs of one script queued back to back (see KeyedScript.merge), not yet packed."""

    call: _Call  # in flight already; its command is packed when the run of calls closes
    sha: bytes
    keys: list[bytes]  # each run's keys as RESP bulk strings, one run after another
    args: list[bytes]  # each run's arguments, likewise
    key_count: int = 0
    arg_count: int = 0

    def pack(self) -> bytes:
        head = bulks((b"EVALSHA", self.sha, b"%d" % self.key_count))
        count = 3 + self.key_count + self.arg_count
        return b"*%d\r\n%s%s%s" % (count, head, b"".join(self.keys), b"".join(self.args))


class RedisPipe:
    """Pipelined commands and scripts on one connection; see the module docstring."""

    def __init__(
        self,
        redis_url: str,
        *,
        max_pending: int = 100_000,
        down_fail_s: float = 2.0,
        client_name: str = "firsttoken-pipe",
        linger_s: float = 0.0,
    ) -> None:
        # No read timeout: the reader waits on an idle connection for as long as nothing is
        # sent. Named, so `CLIENT LIST` shows which connection is the pipe.
        self._address = RedisAddress.from_url(redis_url)
        self._client_name = client_name
        self._scripts: dict[bytes, bytes] = {}  # sha -> source, loaded on every connect
        self._max_pending = max_pending
        self._down_fail_s = down_fail_s
        self._linger_s = linger_s
        self._lingering = False  # the writer is holding the buffer for linger_s
        self._prompt = False  # a call someone awaits is queued: no lingering for it
        self._conn: RedisConnection | None = None
        self._buffer: list[bytes] = []
        self._merged: _Merged | None = None  # the last call queued, while runs can join it
        self._in_flight: deque[_Call] = deque()  # written (or about to be), not yet answered
        self._pending = 0  # the runs in _in_flight (a merged call counts each of its runs)
        self._wake = asyncio.Event()
        self._up = asyncio.Event()
        self._drained = asyncio.Event()  # set whenever nothing waits for a reply
        self._down_since: float | None = None
        self._outage = OutageLog(log, "Redis pipe")  # one line per outage, not per retry
        self.up_since = 0.0  # monotonic time of the last (re)connect
        self._task: asyncio.Task[None] | None = None
        self.errors = 0

    def script(self, script: LuaScript) -> PipeScript:
        """A Lua script (shared/redis/scripts/) run by EVALSHA on this pipe (loaded on
        connect, or at once if up)."""
        source, sha = script.source.encode(), script.sha.encode()
        if sha not in self._scripts:
            self._scripts[sha] = source
            if self._up.is_set():  # ahead of any EVALSHA of it: the pipe keeps order
                self.send((b"SCRIPT", b"LOAD", source))
        return PipeScript(self, sha)

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._run(), name="redis-pipe")

    def send(
        self, args: Sequence[bytes], reply: Reply | None = None, *, urgent: bool = False
    ) -> None:
        """Queue one command; returns at once (unless Redis is gone: then it raises).

        `reply`, when given, gets the answer (or its error) once it arrives. `urgent` writes
        it (and whatever was queued before it) now instead of on the writer task's next turn:
        for the few commands a client waits on (an admission, a chat's first token), a pass
        of a busy event loop saved; everything else is batched (and, with `linger_s`, held
        that long unless a call with a `reply` comes)."""
        self.send_packed(pack(args), reply, urgent=urgent)

    def send_packed(
        self, command: bytes, reply: Reply | None = None, *, urgent: bool = False
    ) -> None:
        """:meth:`send` for a command already in RESP bytes (see :meth:`PipeScript.keyed`)."""
        self._check_room()
        if self._merged is not None:
            self._close_merged()
        call = _Call(command, reply)
        self._in_flight.append(call)
        self._pending += 1
        if self._up.is_set():
            self._buffer.append(call.command)
            if reply is not None:
                self._prompt = True
                urgent = urgent or self._lingering
            if not (urgent and self._write_now()):
                self._wake.set()

    def send_merged(
        self, sha: bytes, keys: bytes, key_count: int, args: Sequence[bytes], *, urgent: bool
    ) -> None:
        """Queue one run of the script `sha` (its keys already RESP bulk strings) that wants no
        reply, merged with the runs of the same script queued just before it (see the module
        docstring). `urgent` as for :meth:`send`."""
        self._check_room()
        merged = self._merged
        if merged is None or merged.sha != sha or merged.call.runs >= MAX_MERGED_RUNS:
            if merged is not None:
                self._close_merged()
            call = _Call(b"", None, 0)
            self._in_flight.append(call)
            merged = self._merged = _Merged(call, sha, [], [])
        merged.call.runs += 1
        self._pending += 1
        merged.keys.append(keys)
        merged.key_count += key_count
        merged.args.append(bulks(args))
        merged.arg_count += len(args)
        if self._up.is_set():
            if not (urgent and self._write_now()):
                self._wake.set()

    async def call(self, *args: bytes | str) -> object:
        """Send one command and wait for its answer."""
        reply: Reply = asyncio.get_running_loop().create_future()
        self.send([a.encode() if isinstance(a, str) else a for a in args], reply)
        return await reply

    async def flush(self) -> None:
        """Wait until every queued call has been answered."""
        while self._in_flight:
            self._drained.clear()
            await self._drained.wait()

    async def close(self, grace_s: float = 2.0) -> None:
        """Give queued calls `grace_s` to go out, then close the connection."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._conn is not None:
            await self._conn.aclose()

    # --- internals ------------------------------------------------------------------------
    def _check_room(self) -> None:
        """Raise ConnectionError where a new call must not wait (see the module docstring)."""
        if not self._up.is_set():
            down = time.monotonic() - (self._down_since or time.monotonic())
            if down > self._down_fail_s:
                raise ConnectionError(f"Redis has been unreachable for {down:.1f}s")
        if self._pending >= self._max_pending:
            raise ConnectionError(
                f"{self._pending} commands wait for Redis; it is too slow or unreachable"
            )

    def _close_merged(self) -> None:
        """Pack the open run of merged calls; it joins the buffer where the pipe is up (else
        the reconnect sends it with every call in flight)."""
        merged, self._merged = self._merged, None
        assert merged is not None
        merged.call.command = merged.pack()
        if self._up.is_set():
            self._buffer.append(merged.call.command)

    def _write_now(self) -> bool:
        """Hand the buffer to the socket's transport at once; False where the connection is
        closing (then the writer task sends it, after the reconnect). Order holds: the writer
        task's own write is synchronous, so whatever it wrote is already ahead of this."""
        conn = self._conn
        if conn is None or conn.closing:
            return False
        if self._merged is not None:
            self._close_merged()
        data, self._buffer = self._buffer, []
        conn.writelines(data)
        return True

    async def _connect(self) -> None:
        conn = await RedisConnection.open(self._address, client_name=self._client_name, decode=True)
        try:
            for source in self._scripts.values():
                await conn.call(b"SCRIPT", b"LOAD", source)
        except BaseException:
            await conn.aclose()
            raise
        self._conn = conn
        if self._merged is not None:  # packed now: it goes with the calls in flight below
            self._close_merged()
        # Everything not answered on the old connection goes again, in order, unless its
        # caller has stopped waiting.
        self._in_flight = deque(
            c for c in self._in_flight if c.reply is None or not c.reply.cancelled()
        )
        self._pending = sum(call.runs for call in self._in_flight)
        self._buffer = [call.command for call in self._in_flight]
        self._down_since = None
        self.up_since = time.monotonic()
        self._up.set()
        if self._buffer:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            conn = self._conn
            assert conn is not None
            tasks = {asyncio.create_task(self._read(conn)), asyncio.create_task(self._write(conn))}
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            # Either side ending means the connection is broken (each loops forever).
            errors = [t.exception() for t in done if not t.cancelled()]
            cause = errors[0] if errors else None
            self._outage.failed(cause or ConnectionResetError("the connection was closed"))
            self._up.clear()
            self._down_since = time.monotonic()
            await conn.aclose()
            await self._reconnect()

    async def _reconnect(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._connect()
                self._outage.ok()
                return
            except (ConnectionError, OSError, RedisError) as exc:
                self._outage.failed(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _write(self, conn: RedisConnection) -> None:
        while True:
            await self._wake.wait()
            if self._linger_s and not self._prompt:
                self._lingering = True
                try:
                    await asyncio.sleep(self._linger_s)
                finally:
                    self._lingering = False
            self._wake.clear()
            self._prompt = False
            if self._merged is not None:
                self._close_merged()
            data, self._buffer = self._buffer, []
            if data:
                conn.writelines(data)
                await conn.drain()

    async def _read(self, conn: RedisConnection) -> None:
        # The replies straight off the connection's stream, every reply already read parsed
        # in one pass by the connection's hiredis reader: a chat worker reads one reply per
        # token chunk, so no per-reply await or reply machinery (redis-py's read_response
        # runs its async machinery per call even for a reply already buffered). Errors are
        # redis-py's exception classes (shared/redis/resp.py).
        stream, parser = conn.stream, conn.parser
        in_flight = self._in_flight
        while True:
            data = await stream.read(READ_SIZE)
            if not data:
                raise ConnectionError("Redis closed the connection")
            parser.feed(data)
            while (answer := parser.gets()) is not False:
                if isinstance(answer, ResponseError):  # the one check a good reply costs
                    _check_reconnect(answer)
                    call = in_flight.popleft()
                    self._pending -= call.runs
                    if call.reply is not None and not call.reply.done():
                        call.reply.set_exception(answer)
                    else:
                        self.errors += 1
                        log.error("a pipelined Redis call failed: %s", answer)
                    continue
                call = in_flight.popleft()
                self._pending -= call.runs
                if call.reply is not None and not call.reply.done():
                    call.reply.set_result(answer)
            if not in_flight:
                self._drained.set()


def _check_reconnect(error: ResponseError) -> None:
    """Raise ConnectionError for the error replies the pipe answers by reconnecting; the call
    stays unanswered, so it goes again, with everything after it, on the new connection."""
    if isinstance(error, NoScriptError):
        # The script cache was flushed under us: the reconnect loads the scripts again.
        raise ConnectionError("the script cache was flushed")
    # A replica now (a Sentinel failover): the call did not run; the reconnect asks the
    # Sentinels for the master. A script's write comes back as "ERR ... -READONLY ...".
    if isinstance(error, ReadOnlyError) or "READONLY" in str(error):
        raise ConnectionError("the server is no longer the master")


class PipeScript:
    """A Lua script of a :class:`RedisPipe`: :meth:`send` it, or await a call for its answer."""

    __slots__ = ("_pipe", "_sha")

    def __init__(self, pipe: RedisPipe, sha: bytes) -> None:
        self._pipe = pipe
        self._sha = sha

    def send(
        self,
        keys: Sequence[str],
        args: Sequence[str | int],
        reply: Reply | None = None,
        *,
        urgent: bool = False,
    ) -> None:
        """Queue one run; `reply`, when given, gets the script's answer (see RedisPipe.send)."""
        encoded = [a.encode() if isinstance(a, str) else b"%d" % a for a in args]
        self.keyed(keys).send(encoded, reply, urgent=urgent)

    def keyed(self, keys: Sequence[str]) -> KeyedScript:
        """This script with its keys fixed, for a caller that runs it many times on the same
        keys (a job's token chunks): the command's bytes up to the arguments are built once."""
        return KeyedScript(self._pipe, self._sha, keys)

    async def __call__(
        self, keys: Sequence[str], args: Sequence[str | int], *, urgent: bool = False
    ) -> object:
        """Run once and wait for the answer (cancelling the wait stops a resend)."""
        reply: Reply = asyncio.get_running_loop().create_future()
        self.send(keys, args, reply, urgent=urgent)
        return await reply


class KeyedScript:
    """A :class:`PipeScript` bound to its keys (see :meth:`PipeScript.keyed`): a token chunk's
    command packed in about half the time of packing all eight of its parts each time."""

    __slots__ = ("_head", "_key_count", "_keys", "_pipe", "_sha", "_size")

    def __init__(self, pipe: RedisPipe, sha: bytes, keys: Sequence[str]) -> None:
        self._pipe = pipe
        self._sha = sha
        self._key_count = len(keys)
        self._size = 3 + len(keys)  # EVALSHA, the sha, the key count, the keys
        self._keys = bulks([k.encode() for k in keys])
        self._head = bulks((b"EVALSHA", sha, b"%d" % len(keys))) + self._keys

    def command(self, args: Sequence[bytes]) -> bytes:
        """One run's RESP bytes: the same as ``pack`` of the whole EVALSHA."""
        return b"*%d\r\n" % (self._size + len(args)) + self._head + bulks(args)

    def send(
        self, args: Sequence[bytes], reply: Reply | None = None, *, urgent: bool = False
    ) -> None:
        """Queue one run with these (already encoded) arguments (see :meth:`PipeScript.send`)."""
        self._pipe.send_packed(self.command(args), reply, urgent=urgent)

    def merge(self, args: Sequence[bytes], *, urgent: bool = False) -> None:
        """Queue one run that wants no reply, sent in one EVALSHA with the runs of this script
        (whatever their keys) queued just before and after it (see the module docstring). The
        script must take any number of runs: KEYS and ARGV each one run's after another, as
        many per run as here."""
        self._pipe.send_merged(self._sha, self._keys, self._key_count, args, urgent=urgent)
