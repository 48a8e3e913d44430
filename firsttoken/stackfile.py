"""Where a running `firsttoken up` is: `.firsttoken/up.json`, beside the dev key file.

`up` starts its embedded Redis on a free port it picks at start; an operator command run in
the same directory (`firsttoken workers`, `keys`, `celery ...`) would otherwise read the
default 127.0.0.1:6379 and find nothing there, or another stack's workers. `up` writes this
file once its stack is ready and removes it when it stops; the commands take their addresses
from it unless the environment names them (an explicit FIRSTTOKEN_REDIS_URL wins), and say on
stderr which Redis they read.

A file whose `up` is no longer running (killed outright, so it could not remove it) is
ignored: its Redis died with it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path

from shared.env import ENV_PREFIX

STATE_DIR = Path(".firsttoken")
STACK_FILE = STATE_DIR / "up.json"
# The settings each operator command takes from the file, by environment name.
FROM_FILE = {
    f"{ENV_PREFIX}REDIS_URL": "redis_url",
    f"{ENV_PREFIX}REDIS_PREFIX": "redis_prefix",
    f"{ENV_PREFIX}DATABASE_URL": "database_url",
}
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "ft"


@dataclass(frozen=True, slots=True)
class StackAddresses:
    """What `up` started, and where (the file's fields)."""

    pid: int
    redis_url: str
    redis_prefix: str
    database_url: str
    gateway_url: str  # http://host:port
    ws_url: str
    page_url: str


def write(addresses: StackAddresses, path: Path = STACK_FILE) -> None:
    """Written whole (a rename), readable by the owner only: the URLs may carry passwords."""
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(addresses), indent=2) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def remove(path: Path = STACK_FILE) -> None:
    path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def read(path: Path = STACK_FILE) -> StackAddresses | None:
    """The running `up`'s addresses; None with no file, an unreadable one, or a dead `up`."""
    try:
        raw = json.loads(path.read_text())
        found = StackAddresses(**{k: raw[k] for k in StackAddresses.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if _alive(int(found.pid)) else None


def redacted(url: str) -> str:
    """`url` with its password, if any, shown as ***."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{password}@", ":***@", 1)).geturl()


def apply(env: MutableMapping[str, str], path: Path = STACK_FILE) -> str:
    """Fill `env`'s unset addresses from a running `up`'s file; returns the one line saying
    which Redis (and prefix) the command will read, and why that one."""
    # An explicit Redis in the environment wins over the file, whole: its prefix or database
    # would belong to another stack.
    found = None if f"{ENV_PREFIX}REDIS_URL" in env else read(path)
    taken = []
    if found is not None:
        for name, field in FROM_FILE.items():
            if name not in env:
                env[name] = str(getattr(found, field))
                taken.append(name)
    url = env.get(f"{ENV_PREFIX}REDIS_URL", DEFAULT_REDIS_URL)
    prefix = env.get(f"{ENV_PREFIX}REDIS_PREFIX", DEFAULT_PREFIX)
    if f"{ENV_PREFIX}REDIS_URL" in taken:
        source = f"the `firsttoken up` running here, {path}"
    elif f"{ENV_PREFIX}REDIS_URL" in env:
        source = f"{ENV_PREFIX}REDIS_URL"
    else:
        source = f"the default: no {ENV_PREFIX}REDIS_URL and no `firsttoken up` running here"
    return f"firsttoken: reading Redis {redacted(url)} prefix {prefix!r} (from {source})"


def announce(env: MutableMapping[str, str] | None = None) -> None:
    """:func:`apply` to this process's environment, and print its line on stderr (stdout
    stays the command's own, `--json` included)."""
    print(apply(os.environ if env is None else env), file=sys.stderr, flush=True)
