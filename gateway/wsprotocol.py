"""uvicorn's websockets-sansio protocol, with a text frame that is not UTF-8 logged as one
WARNING line.

uvicorn (0.55) decodes each text message itself and, on a UnicodeDecodeError, logs an ERROR
with the traceback on `uvicorn.error` before closing with 1007: any client can write a
traceback into the gateway's log per connection. RFC 6455 (8.1) says the same close is right;
only the log line changes: one WARNING naming the client and the byte, no traceback. Binary
messages and valid text take uvicorn's own path (the text decoded once, as there).
"""

from __future__ import annotations

import logging

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)

# RFC 6455 7.4.1: "inconsistent data within a message (e.g., non-UTF-8 data within a text
# message)".
INVALID_PAYLOAD = 1007


class Utf8WarningProtocol(WebSocketsSansIOProtocol):
    """The `ws=` protocol of the gateway (gateway/__main__.py)."""

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type != "text" or self.close_sent:
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.warning(
                "closed the websocket of %s (code %d): a text message of %d bytes is not "
                "valid UTF-8 (at byte %d)",
                client,
                INVALID_PAYLOAD,
                len(data),
                exc.start,
            )
            self.conn.send_close(INVALID_PAYLOAD, "invalid UTF-8")
            self.handle_parser_exception()
            return
        self.queue.put_nowait({"type": "websocket.receive", "text": text})
