"""Every Lua script firsttoken runs on Redis: one ``<name>.lua`` file each in this folder, read
once at import, and one way to run one.

Each file starts with a comment that says what the script does, its KEYS and ARGV by index and
what it returns; the code that runs it names it by the constant below. A script is always run
by its SHA1 (``EVALSHA``), never by its source (``EVAL`` would send the whole source with every
call), and a ``NOSCRIPT`` reply (the server's script cache was flushed, or this is a new server
after a failover) is answered by loading it (``SCRIPT LOAD``) and running it again. Three
callers do that:

- :func:`run`, for a redis-py client (the ordinary commands: a requeue, a claim);
- the pipe (shared/redis/pipe.py ``RedisPipe.script``), which loads its scripts on every
  connect and reconnects on a ``NOSCRIPT``;
- the chat queue's reads (workers/chat/consumer.py), which load :data:`QUEUE_POP_MORE` on their
  own connection and open a new one after a ``NOSCRIPT``.

A script is never rewritten at load time: every value that varies is a KEY or an ARGV, so the
SHA1 here is the SHA1 of the file and ``SCRIPT LOAD`` of it answers the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError


@dataclass(frozen=True, slots=True)
class LuaScript:
    """One script: its name (its file's, without ``.lua``), its source and its SHA1 (hex)."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> LuaScript:
        """The script in ``<name>.lua`` beside this module (package data when installed)."""
        source = files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


def _load(name: str) -> LuaScript:
    script = LuaScript.load(name)
    _registry[name] = script
    return script


_registry: dict[str, LuaScript] = {}

# gateway/ratelimit.py
RATE_ADMIT = _load("rate_admit")
RATE_SETTLE = _load("rate_settle")
RATE_RENEW = _load("rate_renew")
# gateway/requeue.py
CHAT_REQUEUE = _load("chat_requeue")
# gateway/liveness.py
GATEWAY_BEAT = _load("gateway_beat")
# gateway/responses.py
RESPONSE_MOVE_HEAD = _load("response_move_head")
# gateway/drafts.py, workers/chat/prefill.py
DRAFT_ADMIT = _load("draft_admit")
DRAFT_CLEAR_RUNNING = _load("draft_clear_running")
# workers/chat/publish.py
CHUNK_SEND = _load("chunk_send")
# workers/chat/orphans.py
ORPHANS = _load("orphans")
# workers/chat/consumer.py
QUEUE_POP_MORE = _load("queue_pop_more")
# workers/chat/failover.py
LEASE_CLAIM = _load("lease_claim")
LEASE_HOLD = _load("lease_hold")
# The usage outbox (shared/usage_outbox.py): workers/chat/usage.py, workers/bulk/,
# gateway/lostchats.py
USAGE_ADD = _load("usage_add")
USAGE_QUEUE = _load("usage_queue")
USAGE_CLAIM = _load("usage_claim")
USAGE_TOUCH = _load("usage_touch")
USAGE_WRITTEN = _load("usage_written")

# Every script above, by name.
SCRIPTS: Mapping[str, LuaScript] = _registry


async def run(
    redis: Redis, script: LuaScript, keys: Sequence[str], args: Sequence[str | int | float]
) -> Any:
    """Run `script` on a redis-py client: ``EVALSHA``, and after a ``NOSCRIPT`` ``SCRIPT LOAD``
    and ``EVALSHA`` once more. Returns the script's reply as the client decodes it."""
    try:
        return await redis.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await redis.script_load(script.source)
        return await redis.evalsha(script.sha, len(keys), *keys, *args)
