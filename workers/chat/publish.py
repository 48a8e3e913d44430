"""Publishing a job's chunks: pub/sub for the live path, a capped expiring stream for replay."""

from __future__ import annotations

import asyncio

from shared.errors import ErrorFrame
from shared.keys import Keys
from shared.protocol import (
    CHUNK_DONE,
    CHUNK_ERROR,
    CHUNK_STARTED,
    CHUNK_TOKEN,
    DoneChunk,
    dumps,
    encode_chunk,
    encode_started,
    encode_token,
)
from shared.redis.pipe import PipeScript


class JobPublisher:
    """Sends one job's messages; every message goes to the channel and the replay stream in one
    script call (`chunks`: shared/redis/scripts/chunk_send.lua on the process's pipe), so a
    gap or a reconnect can be repaired from the stream. The calls of every job queued back to
    back go out as one (shared/redis/pipe.py `KeyedScript.merge`).

    Sending only queues the call on the process's Redis pipe (shared/redis/pipe.py), so the
    send methods are plain functions: nothing between two chunks yields to the loop, and a job's
    chunks keep the order they were sent in."""

    def __init__(
        self,
        chunks: PipeScript,
        keys: Keys,
        job_id: str,
        chat_id: str,
        *,
        replay_maxlen: int,
        replay_ttl_s: int,
    ) -> None:
        self._chunks = chunks
        self._maxlen = b"%d" % replay_maxlen
        self._ttl = b"%d" % replay_ttl_s
        self._channel = keys.job_channel(job_id)
        self._stream = keys.replay_stream(job_id)
        self._send = chunks.keyed((self._channel, self._stream)).merge
        self._chat_id = chat_id
        self._expiry_set = False
        self._model: str | None = None  # named by the next token chunk (see name_model)
        self.next_seq = 0

    def send(self, message: str, *, urgent: bool = False) -> None:
        """Queue one chunk on the process's Redis pipe (the first one sets the expiry)."""
        ttl = b"0" if self._expiry_set else self._ttl
        self._expiry_set = True
        self._send((message.encode(), self._maxlen, ttl), urgent=urgent)

    def start(
        self, started_at: float, cancel_flag: str, worker: str | None = None
    ) -> asyncio.Future[object]:
        """Announce that the job started (first on the pipe, so before its tokens).

        The same script call reads the job's cancel flag: the returned future says (1 or 0)
        whether the client cancelled while the job waited in the queue. A cancel after this
        read reaches the worker as a message (the job is registered as running by then)."""
        cancelled: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._expiry_set = True
        started = encode_chunk(CHUNK_STARTED, encode_started(started_at, worker=worker)).encode()
        script = self._chunks.keyed((self._channel, self._stream, cancel_flag))
        script.send((started, self._maxlen, self._ttl), cancelled)
        return cancelled

    def name_model(self, model: str) -> None:
        """The model that answers (`auto` routed, a failover's), named in the next token
        chunk's header: a door whose every chunk names the model (OpenAI's, issue 42) learns
        it with the first token, in the same message (not a `started` of its own)."""
        self._model = model

    def token(self, text: str, tokens: int | None = None) -> None:
        """One token chunk; the answer's first is written at once (the client waits on it).
        `tokens`: the answer's tokens so far, for a worker that may have to continue it."""
        seq = self.next_seq
        self.next_seq += 1
        frame = encode_token(self._chat_id, seq, text)
        if self._model is None:
            message = encode_chunk(CHUNK_TOKEN, frame, seq, tokens)
        else:
            message = encode_chunk(CHUNK_TOKEN, frame, seq, tokens, self._model)
            self._model = None
        self.send(message, urgent=seq == 0)

    def done(self, chunk: DoneChunk) -> None:
        """The answer is complete (shared.protocol.done_chunk builds it)."""
        self.send(encode_chunk(CHUNK_DONE, dumps(chunk)))

    def error(self, frame: ErrorFrame) -> None:
        """The job failed or was cancelled (shared.errors.error_frame builds the frame)."""
        self.send(encode_chunk(CHUNK_ERROR, dumps(frame)))

    def control(self, kind: str, payload: str) -> None:
        """Any other control chunk, its payload already encoded (e.g. a failover's
        `started`, shared.protocol.encode_started)."""
        self.send(encode_chunk(kind, payload))
