"""Bring a database to the latest schema: ``python -m firsttoken.migrate [DATABASE_URL]``.

The Alembic config is built in code, pointing at the installed ``migrations`` package, so this
works from any working directory and needs no alembic.ini.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

SCRIPT_LOCATION = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str | None = None, connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    # Through attributes, not set_main_option: ConfigParser would read a '%' in a password
    # as interpolation.
    cfg.attributes["database_url"] = database_url
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(database_url: str) -> None:
    """Migrate `database_url` to head. Synchronous: it runs its own event loop, so call it from
    code that is not inside one (use :func:`upgrade_engine` there)."""
    command.upgrade(alembic_config(database_url), "head")


async def upgrade_engine(engine: AsyncEngine) -> None:
    """Migrate to head over one of `engine`'s connections, from inside a running loop."""

    def _run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection=connection), "head")

    async with engine.begin() as conn:
        await conn.run_sync(_run)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args:
        url = args[0]
    else:
        from shared.settings import get_settings

        url = get_settings().database_url
    upgrade(url)


if __name__ == "__main__":
    main()
