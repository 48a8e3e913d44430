"""An httpx transport on aiohttp, for the `openai` engine's one pooled client per process.

The OpenAI SDK speaks httpx; httpx's own transport (httpcore + h11 over anyio) parses every
streamed token through about ten Python generator layers. aiohttp parses HTTP in C. With this
transport under the same ``AsyncOpenAI`` client a chat worker spends ~27% less CPU per token
(`python scripts/bench_worker_cpu.py`, BENCHMARKS.md). The SDK itself ships the same idea as
``openai.DefaultAioHttpClient`` (package ``httpx-aiohttp``); this one is ours because that
package maps a refused connection to ``ConnectTimeout`` (the SDK then says "timed out" and a
retry is skipped) and a server disconnect mid-stream to a connect error.

Errors come out as the httpx exceptions httpx's own transport raises for the same fault:
refused or unresolvable -> ``ConnectError``; connect deadline -> ``ConnectTimeout``; the server
went away or sent a broken body -> ``ReadError`` / ``RemoteProtocolError``; read deadline ->
``ReadTimeout``. Closing a response before its end closes its connection (never returned
half-read to the pool): that is how a server such as vLLM learns the client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import httpx

READ_CHUNK = 64 * 1024


@contextlib.contextmanager
def _mapped(*, connecting: bool) -> Iterator[None]:
    try:
        yield
    except (aiohttp.ClientConnectorError, aiohttp.InvalidURL) as exc:
        raise httpx.ConnectError(str(exc)) from exc
    except aiohttp.ServerTimeoutError as exc:
        raise (httpx.ConnectTimeout if connecting else httpx.ReadTimeout)(str(exc)) from exc
    except TimeoutError as exc:  # asyncio's, raised by aiohttp's ClientTimeout
        raise (httpx.ConnectTimeout if connecting else httpx.ReadTimeout)(str(exc)) from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc
    except (aiohttp.ClientError, OSError) as exc:  # disconnected, reset, ...
        raise (httpx.ConnectError if connecting else httpx.ReadError)(str(exc)) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped(connecting=False):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            # Half-read: drop the connection so the server sees the client leave.
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over one aiohttp session (created on first use, on the running loop)."""

    def __init__(self, *, max_connections: int, keepalive_s: float = 15.0) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=self._keepalive_s
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeouts.get("connect"), sock_read=timeouts.get("read")
        )
        body = await request.aread()
        with _mapped(connecting=True):
            response = await self._client().request(
                request.method,
                str(request.url),
                headers=list(request.headers.multi_items()),
                data=body or None,
                allow_redirects=False,
                timeout=timeout,
                compress=None,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            # aiohttp closes its sockets on the next loop turn.
            await asyncio.sleep(0)
