"""shared/redis/address.py: a Redis URL read as redis-py reads it, without a socket."""

from __future__ import annotations

import ssl

import pytest
from redis.asyncio.connection import parse_url

from shared.redis.address import RedisAddress, TlsOptions, celery_broker_url
from shared.redis.resp import pack


def test_a_tcp_url_gives_host_port_db_and_credentials() -> None:
    address = RedisAddress.from_url("redis://user:s%40cret@10.0.0.5:6380/3")
    assert (address.host, address.port, address.path, address.db) == ("10.0.0.5", 6380, None, 3)
    assert (address.username, address.password, address.tls) == ("user", "s@cret", None)
    assert "s@cret" not in repr(address) and "s@cret" not in str(address)
    assert str(address) == "redis://10.0.0.5:6380/3"


def test_defaults_are_redis_pys() -> None:
    address = RedisAddress.from_url("redis://")
    assert (address.host, address.port, address.db) == ("localhost", 6379, 0)
    assert address.connect_timeout_s == 5.0 and address.client_name is None


def test_a_unix_url_gives_the_socket_and_its_db() -> None:
    address = RedisAddress.from_url("unix:///tmp/redis.sock?db=2")
    assert (address.path, address.db, address.tls) == ("/tmp/redis.sock", 2, None)
    assert str(address) == "unix:///tmp/redis.sock?db=2"


def test_query_db_wins_over_the_path_and_options_are_read() -> None:
    address = RedisAddress.from_url(
        "redis://h/1?db=4&client_name=me&socket_connect_timeout=0.5&health_check_interval=3"
    )
    assert (address.db, address.client_name, address.connect_timeout_s) == (4, "me", 0.5)


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:p@h:6390/3",
        "redis://h",
        "redis://:p@h/0",
        "rediss://h:6390/1?ssl_cert_reqs=none",
        "unix:///run/r.sock?db=5",
        "unix://:p@/run/r.sock",
    ],
)
def test_the_same_fields_as_redis_py(url: str) -> None:
    theirs = parse_url(url)
    ours = RedisAddress.from_url(url)
    assert ours.db == theirs.get("db", 0)
    assert ours.password == theirs.get("password")
    assert ours.username == theirs.get("username")
    if url.startswith("unix"):
        assert ours.path == theirs["path"]
    else:
        assert (ours.host, ours.port) == (theirs.get("host", "localhost"), theirs.get("port", 6379))


def test_the_handshake_authenticates_names_and_selects_in_redis_pys_order() -> None:
    address = RedisAddress.from_url("redis://user:secret@h:6380/3")
    assert address.handshake("n") == [
        pack((b"AUTH", b"user", b"secret")),
        pack((b"CLIENT", b"SETNAME", b"n")),
        pack((b"SELECT", b"3")),
    ]
    assert RedisAddress.from_url("redis://:pw@h/0").handshake() == [pack((b"AUTH", b"pw"))]
    named = RedisAddress.from_url("unix:///tmp/r.sock?client_name=url-name")
    assert named.handshake() == [pack((b"CLIENT", b"SETNAME", b"url-name"))]
    assert named.handshake("given") == [pack((b"CLIENT", b"SETNAME", b"given"))]
    assert RedisAddress.from_url("redis://h").handshake() == []


def test_tls_options_as_redis_py_reads_them() -> None:
    strict = RedisAddress.from_url("rediss://h:6390/0")
    assert strict.tls == TlsOptions()
    assert str(strict) == "rediss://h:6390/0"
    context = strict.tls.context()
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED

    loose = RedisAddress.from_url("rediss://h/0?ssl_cert_reqs=none").tls
    assert loose is not None
    context = loose.context()
    assert not context.check_hostname and context.verify_mode == ssl.CERT_NONE

    optional = RedisAddress.from_url("rediss://h/0?ssl_cert_reqs=optional").tls
    assert optional is not None and optional.context().verify_mode == ssl.CERT_OPTIONAL

    unchecked = RedisAddress.from_url("rediss://h/0?ssl_check_hostname=false").tls
    assert unchecked is not None and not unchecked.check_hostname
    context = unchecked.context()
    assert not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED

    files = RedisAddress.from_url(
        "rediss://h/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
    ).tls
    assert files == TlsOptions(ca_certs="/ca.pem", certfile="/c.pem", keyfile="/k.pem")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://h:6379", "redis://, rediss:// or unix://"),
        ("postgres://u:secret@h/0", "u:***@h"),
        ("redis://h/x", "database is a number"),
        ("redis://h/0?db=one", "database is a number"),
        ("redis://h:port/0", "port of a Redis URL"),
        ("redis://h/0?socket_connect_timeout=soon", "number of seconds"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "none, optional or required"),
        ("unix://", "names its socket"),
    ],
)
def test_a_wrong_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("*", r"\*")) as raised:
        RedisAddress.from_url(url)
    assert "secret" not in str(raised.value)


def test_urls_translate_for_kombu() -> None:
    assert celery_broker_url("unix:///run/redis.sock?db=3") == (
        "redis+socket:///run/redis.sock?virtual_host=3"
    )
    assert celery_broker_url("unix://:secret@/run/redis.sock") == (
        "redis+socket://:secret@/run/redis.sock"
    )
    for url in ("redis://127.0.0.1:6379/0", "rediss://cache.example:6380/1"):
        assert celery_broker_url(url) == url
