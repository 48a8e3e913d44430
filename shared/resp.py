"""Redis commands as RESP bytes, for the connections that write them straight to a socket (the
chat worker's chunk sender, the gateway's pub/sub relay, the relay benchmark's producer)."""

from __future__ import annotations

from collections.abc import Sequence


def pack(args: Sequence[bytes]) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + bulks(args)


def bulks(args: Sequence[bytes]) -> bytes:
    """Bulk strings one after another (a list, not a generator: a quarter less time)."""
    return b"".join([b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args])
