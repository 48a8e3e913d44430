"""Where and how to reach Redis, read once from the URL every process is configured with.

The URL forms are redis-py's, so one setting serves the ordinary client (shared/redis/client.py),
the connections of this package and Celery's broker:

    redis://[[user]:password@]host[:port][/db]
    rediss://...          TLS; ?ssl_cert_reqs=none|optional|required, ?ssl_ca_certs=FILE,
                          ?ssl_certfile=FILE, ?ssl_keyfile=FILE, ?ssl_check_hostname=false
    unix://[[user]:password@]/path/to/redis.sock[?db=N]
    sentinel://[[user]:password@]host:26379[/db];sentinel://host2:26379;...?master_name=NAME
                          the master Sentinel names NAME (kombu's form: one sentinel:// per
                          Sentinel, joined by ``;``; the user, password and db are the master's,
                          read off the first; ``master_name`` may sit on any part, default
                          ``mymaster``; ``?sentinel_password=`` when the Sentinels want one)

plus ``?db=N``, ``?client_name=NAME`` and ``?socket_connect_timeout=SECONDS`` on any of them.
Other query parameters (redis-py's pool and socket options) are left to redis-py.

A Sentinel URL names no host to connect to: shared/redis/sentinel.py asks the Sentinels for
the master each time a connection opens (every client of this package, redis-py's included,
goes through it); Celery's broker gets kombu's own ``sentinel://`` transport
(:func:`celery_broker_url` and :func:`celery_transport_options`).

Everything here is pure apart from :meth:`TlsOptions.context`, which reads the certificate files.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from shared.redis.resp import pack

SCHEMES = ("redis", "rediss", "unix", "sentinel")
SENTINEL_PORT = 26379
DEFAULT_MASTER_NAME = "mymaster"  # Sentinel's own example name, and kombu's docs'
DEFAULT_CONNECT_TIMEOUT_S = 5.0  # a Redis that is not there fails fast and is retried
_FALSE = ("0", "F", "FALSE", "N", "NO")  # redis-py's spelling of a false query flag
_CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """The TLS settings a ``rediss://`` URL may carry, with redis-py's defaults."""

    cert_reqs: str = "required"
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """An SSL context for these settings (reads the certificate files named)."""
        context = ssl.create_default_context(cafile=self.ca_certs)
        if self.cert_reqs in ("none", "optional"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE if self.cert_reqs == "none" else ssl.CERT_OPTIONAL
        elif not self.check_hostname:
            context.check_hostname = False
        if self.certfile:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where one Redis is and how to open a connection to it (see the module docstring)."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None  # a Unix socket, instead of host and port
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    client_name: str | None = None  # the URL's, used when a connection is given none
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    # Set for a sentinel:// URL: the Sentinels to ask, and for which master. host and port
    # are then the master's once shared/redis/sentinel.py has resolved them.
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = DEFAULT_MASTER_NAME
    sentinel_password: str | None = field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        """Read a redis://, rediss://, unix:// or sentinel:// URL; a ValueError says what is
        wrong with it."""
        if url.startswith("sentinel://"):
            return _parse_sentinel_url(url)
        return _parse_url(url)

    @property
    def sentinel(self) -> bool:
        """Whether the master is found through Sentinels (a sentinel:// URL)."""
        return bool(self.sentinels)

    def at(self, host: str, port: int) -> RedisAddress:
        """This address pointed at one server (the master a Sentinel named)."""
        return replace(self, host=host, port=port, sentinels=())

    def handshake(self, client_name: str | None = None) -> list[bytes]:
        """The commands a new connection sends first, in redis-py's order (AUTH, CLIENT SETNAME,
        SELECT); each is answered ``+OK`` or with an error."""
        commands = []
        if self.password is not None:
            auth = [b"AUTH"]
            if self.username:
                auth.append(self.username.encode())
            auth.append(self.password.encode())
            commands.append(pack(auth))
        name = client_name or self.client_name
        if name:
            commands.append(pack((b"CLIENT", b"SETNAME", name.encode())))
        if self.db:
            commands.append(pack((b"SELECT", b"%d" % self.db)))
        return commands

    def __str__(self) -> str:
        """The address without its credentials, for messages."""
        if self.path is not None:
            return f"unix://{self.path}?db={self.db}"
        if self.sentinels:
            where = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"sentinel://{where}/{self.db} (master {self.master_name!r})"
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{self.host}:{self.port}/{self.db}"


def _parse_url(url: str) -> RedisAddress:
    """:meth:`RedisAddress.from_url`."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"a Redis URL starts with redis://, rediss:// or unix:// (got {_redacted(url)!r})"
        )
    query = {name: values[0] for name, values in parse_qs(parts.query).items() if values}
    timeout = query.get("socket_connect_timeout")
    address = RedisAddress(
        db=_db(query, "" if parts.scheme == "unix" else parts.path),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        client_name=query.get("client_name") or None,
        connect_timeout_s=(DEFAULT_CONNECT_TIMEOUT_S if timeout is None else _seconds(timeout)),
    )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// Redis URL names its socket, as in unix:///run/redis.sock")
        return replace(address, path=unquote(parts.path))
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError(f"the port of a Redis URL is a number (got {_redacted(url)!r})") from None
    return replace(
        address,
        host=unquote(parts.hostname) if parts.hostname else "localhost",
        port=port,
        tls=_tls(query) if parts.scheme == "rediss" else None,
    )


def _parse_sentinel_url(url: str) -> RedisAddress:
    """:meth:`RedisAddress.from_url` of a sentinel:// URL (see the module docstring)."""
    parts = [urlsplit(part) for part in url.split(";") if part.strip()]
    sentinels = []
    query: dict[str, str] = {}
    for part in parts:
        if part.scheme != "sentinel":
            raise ValueError(
                "every part of a Sentinel URL starts with sentinel://, as in "
                f"sentinel://h1:26379;sentinel://h2:26379 (got {_redacted(url)!r})"
            )
        try:
            port = part.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(
                f"the port of a Sentinel is a number (got {_redacted(url)!r})"
            ) from None
        if not part.hostname:
            raise ValueError(f"each sentinel:// part names a host (got {_redacted(url)!r})")
        sentinels.append((unquote(part.hostname), port))
        query.update({k: v[0] for k, v in parse_qs(part.query, keep_blank_values=True).items()})
    if not sentinels:
        raise ValueError("a Sentinel URL names at least one Sentinel, as in sentinel://h1:26379")
    first = parts[0]
    # The master's own options, read as a redis:// URL's (no TLS through Sentinels here).
    master = _parse_url(urlunsplit(("redis", first.netloc, first.path, urlencode(query), "")))
    name = query.get("master_name", DEFAULT_MASTER_NAME)
    if not name:
        raise ValueError(
            "master_name in a Sentinel URL names the master, as in ?master_name=mymaster"
        )
    host, port = sentinels[0]
    return replace(
        master,
        host=host,
        port=port,
        sentinels=tuple(sentinels),
        master_name=name,
        sentinel_password=query.get("sentinel_password") or None,
    )


def _db(query: dict[str, str], path: str) -> int:
    """``?db=N`` or else the URL's path (redis://host/N), as redis-py reads them; 0 if neither."""
    value = query.get("db")
    if value is None:
        value = unquote(path).replace("/", "") or "0"
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"a Redis URL's database is a number, as in redis://host:6379/0 or ?db=0 "
            f"(got {value!r})"
        ) from None


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(
            f"socket_connect_timeout in a Redis URL is a number of seconds (got {value!r})"
        ) from None


def _tls(query: dict[str, str]) -> TlsOptions:
    reqs = query.get("ssl_cert_reqs", "required").lower()
    if reqs not in _CERT_REQS:
        raise ValueError(
            f"ssl_cert_reqs in a Redis URL is none, optional or required (got {reqs!r})"
        )
    check = query.get("ssl_check_hostname")
    return TlsOptions(
        cert_reqs=reqs,
        ca_certs=query.get("ssl_ca_certs"),
        certfile=query.get("ssl_certfile"),
        keyfile=query.get("ssl_keyfile"),
        check_hostname=check is None or check.upper() not in _FALSE,
    )


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def celery_broker_url(redis_url: str) -> str:
    """The Celery (kombu) broker URL of ``redis_url``.

    redis-py and this package read a Unix socket as ``unix:///path?db=N``; kombu has no
    ``unix`` transport and spells the same socket ``redis+socket:///path?virtual_host=N``.
    Other URLs (``redis://``, ``rediss://``) are the same for both and pass unchanged; a
    ``sentinel://`` URL loses its query (the master's name and the timeouts go to kombu as
    transport options: :func:`celery_transport_options`)."""
    if redis_url.startswith("sentinel://"):
        # kombu hands a Sentinel URL's query to Connection() on a switch to the next
        # Sentinel, which takes no such arguments: options go as transport options.
        return ";".join(
            urlsplit(part)._replace(query="").geturl() for part in redis_url.split(";") if part
        )
    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    query = parse_qsl(parts.query, keep_blank_values=True)
    renamed = [("virtual_host" if name == "db" else name, value) for name, value in query]
    url = f"redis+socket://{parts.netloc}{parts.path}"
    return f"{url}?{urlencode(renamed)}" if renamed else url


def celery_transport_options(redis_url: str) -> dict[str, Any]:
    """The kombu transport options ``redis_url`` needs beyond the broker URL: for a Sentinel
    URL the master's name (and the Sentinels' password), as kombu's sentinel transport reads
    them; nothing for the others."""
    if not redis_url.startswith("sentinel://"):
        return {}
    address = _parse_sentinel_url(redis_url)
    options: dict[str, Any] = {
        "master_name": address.master_name,
        "socket_connect_timeout": address.connect_timeout_s,
    }
    if address.sentinel_password is not None:
        options["sentinel_kwargs"] = {"password": address.sentinel_password}
    return options
