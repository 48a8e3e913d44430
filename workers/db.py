"""The worker process's database engine and sessionmaker (one per WorkerContext, `ctx.db`),
built on first use on the process loop."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from shared.db.session import make_engine, make_sessionmaker, ping
from shared.settings import get_settings


class Database:
    """Lazily built engine + sessionmaker for `settings.database_url`.

    Call only on the process loop (`workers.runtime.runner`); the lifecycle's `database` step
    closes it. Creation has no `await` in it,
    so on one loop it cannot interleave with another task's creation: no lock is needed (an
    asyncio.Lock would guard nothing, and would bind to whichever loop used it first).
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._engine: AsyncEngine | None = None
        self._sessionmaker: async_sessionmaker[AsyncSession] | None = None

    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        if self._sessionmaker is None:
            self._engine = make_engine(self._url or get_settings().database_url)
            self._sessionmaker = make_sessionmaker(self._engine)
        return self._sessionmaker

    async def warm(self) -> None:
        """Build the engine and open one pooled connection now (a worker's start-up): the
        dialect's imports and the first connect otherwise land on a first chat's latency."""
        self.sessionmaker()
        assert self._engine is not None
        await ping(self._engine)

    async def reset_pool(self) -> None:
        """Drop pooled connections (after an outage they are dead); the engine stays usable."""
        if self._engine is not None:
            await self._engine.dispose()

    async def close(self) -> None:
        engine, self._engine, self._sessionmaker = self._engine, None, None
        if engine is not None:
            await engine.dispose()
