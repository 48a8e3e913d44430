"""Which error replies make the pipe reconnect (and send the call again) instead of failing it."""

from __future__ import annotations

import pytest
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

from shared.redis.pipe import _check_reconnect
from shared.redis.resp import parse_error


@pytest.mark.parametrize(
    "error",
    [
        NoScriptError("No matching script."),
        ReadOnlyError("You can't write against a read only replica."),
        # What a script's write on a replica answers (Redis 6.2).
        parse_error(
            "ERR Error running script (call to f_x): @user_script:2: @user_script: 2: "
            "-READONLY You can't write against a read only replica."
        ),
    ],
)
def test_a_flushed_script_cache_or_a_demoted_master_means_reconnect(error: ResponseError) -> None:
    with pytest.raises(ConnectionError):
        _check_reconnect(error)


def test_any_other_error_reply_goes_to_its_caller() -> None:
    _check_reconnect(parse_error("WRONGTYPE Operation against a key holding the wrong value"))
    _check_reconnect(ResponseError("ERR unknown command 'NOPE'"))
