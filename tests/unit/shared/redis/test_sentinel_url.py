"""A sentinel:// URL read without a socket: the Sentinels, the master's name and options, and
what Celery's broker is given for it."""

from __future__ import annotations

import pytest
from kombu.utils.url import parse_url as kombu_parse_url

from shared.redis.address import RedisAddress, celery_broker_url, celery_transport_options
from shared.redis.sentinel import check_master

URL = "sentinel://:pw@10.0.0.1:26380/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26381?master_name=m1"


def test_a_sentinel_url_names_every_sentinel_and_the_masters_options() -> None:
    address = RedisAddress.from_url(URL)
    assert address.sentinels == (("10.0.0.1", 26380), ("10.0.0.2", 26379), ("10.0.0.3", 26381))
    assert (address.master_name, address.db, address.password) == ("m1", 2, "pw")
    assert address.sentinel and "pw" not in str(address) and "pw" not in repr(address)


def test_the_master_name_defaults_to_mymaster_and_may_sit_on_any_part() -> None:
    assert RedisAddress.from_url("sentinel://h1").master_name == "mymaster"
    assert RedisAddress.from_url("sentinel://h1?master_name=a;sentinel://h2").master_name == "a"


def test_a_resolved_address_is_the_master_with_the_same_options() -> None:
    master = RedisAddress.from_url(URL).at("10.0.0.9", 6390)
    assert (master.host, master.port, master.db, master.password) == ("10.0.0.9", 6390, 2, "pw")
    assert not master.sentinel and str(master) == "redis://10.0.0.9:6390/2"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1;redis://h2", "every part"),
        ("sentinel://h1:port", "port"),
        ("sentinel://h1?master_name=", "master_name"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RedisAddress.from_url(url)


def test_celery_gets_kombus_form_and_the_master_name_as_a_transport_option() -> None:
    url = "sentinel://h1:26379/0?master_name=m1&sentinel_password=sp;sentinel://h2:26379"
    broker = celery_broker_url(url)
    assert broker == "sentinel://h1:26379/0;sentinel://h2:26379"
    first = kombu_parse_url(broker.split(";")[0])
    assert (first["transport"], first["hostname"], first["port"]) == ("sentinel", "h1", 26379)
    assert celery_transport_options(url) == {
        "master_name": "m1",
        "socket_connect_timeout": 5.0,
        "sentinel_kwargs": {"password": "sp"},
    }
    assert celery_transport_options("redis://h1") == {}


def test_a_server_that_is_no_longer_master_is_refused() -> None:
    address = RedisAddress.from_url("sentinel://h1").at("h9", 6379)
    check_master([b"master", 10, []], address)
    with pytest.raises(ConnectionError, match="slave, not the master"):
        check_master(["slave", "h1", 6379, "connected", 10], address)
