"""A deadline on reading a request's headers, for uvicorn's httptools protocol.

uvicorn (0.55) arms its only timer, keep-alive, after a response; a connection that sends its
request headers a byte at a time (slowloris), or connects and sends nothing, is never cut, and
each one holds a socket and a parser until the client gives up. Here a connection must finish
its headers within ``header_timeout_s`` of connecting, and a kept-alive one within that long of
its next request's first byte, or it is closed without an answer (it has not sent a request
one could answer).

The timer is armed once per connection (and once per later request on a kept-alive HTTP
connection) and cancelled when the headers are complete, before any websocket upgrade: a
websocket pays for it once at its handshake, never per frame.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose headers come too slowly."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # a kept-alive connection's next request
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's ``http=``, with this process's deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})
