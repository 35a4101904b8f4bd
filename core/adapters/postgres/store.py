"""PostgreSQL's storage (``core.ports.storage.Storage``): two pools, one object per role.

Reads made on a caller's behalf (the HTTP views, ``memory_read``) take a
smaller pool of their own whose statements PostgreSQL cancels after
``read_statement_timeout`` seconds, so however many searches are in flight the
writers' pool (ingest, compaction, the outbox) keeps every connection it has.
The writers' statements have no timeout: a cancelled write is retried whole,
so a bound a large legitimate write exceeds (an erase, a retention sweep)
would retry it forever; the worker's watchdog is what notices a stall there.

``PostgresStore`` opens the pool (migrating first) and holds the role objects
the composition root hands out; each role is implemented in its own module,
where a component's call lands directly:

* ``ingest.PostgresIngest``: a group of messages stored in a few statements;
* ``history.PostgresHistory``: the history a reader pages and a compaction plans from;
* ``compaction.PostgresCompactions``: everything one compaction writes, in one transaction;
* ``outbox.PostgresOutbox``: the rows a compaction wrote for the relay to publish;
* ``archive.PostgresArchive``: archived batches and raw turns, and their retention;
* ``memory.PostgresMemory``: ``memory_read``, full text and vectors fused by rank;
* ``tallies.PostgresTallies``: the token counts the worker's table caches;
* ``privacy.PostgresPrivacy``: erasure, and moving a conversation into a tenant;
* ``usage.PostgresUsage``: what compactions cost;
* ``calibration.PostgresTokenRates``: each model's measured tokens per character.

Every public coroutine of a role raises the ports' errors and none of the
driver's (``errors.port_errors_on_methods`` on each class): an outage is
``StoreUnavailable``.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres.archive import PostgresArchive
from core.adapters.postgres.calibration import PostgresTokenRates
from core.adapters.postgres.compaction import PostgresCompactions
from core.adapters.postgres.connection import configure_connection, keep_session, refuse_read_only
from core.adapters.postgres.context import PostgresContext
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.history import PostgresHistory
from core.adapters.postgres.ingest import PostgresIngest
from core.adapters.postgres.memory import PostgresMemory
from core.adapters.postgres.migrate import migrate
from core.adapters.postgres.outbox import PostgresOutbox
from core.adapters.postgres.privacy import PostgresPrivacy
from core.adapters.postgres.tallies import PostgresTallies
from core.adapters.postgres.usage import PostgresUsage
from core.ports.embedding import Embedder
from core.ports.storage import Storage

INGEST_POOL_SIZE = 2
"""The accounting agent stores one group at a time, and its held part next: two."""


@port_errors_on_methods
class PostgresStore:
    """Every role over the writers' pool, the callers' reads over ``reads`` (None:
    the same pool). ``embedder``: what ``memory_read`` embeds its query with
    (none: full text only); ``threads``: where a search's text work runs (None:
    the loop's default executor); ``raw_retention_days``: how long archived raw
    turns are kept (0: forever); ``single_conversation_transactions``: a group of
    messages is stored in one transaction per conversation; ``ingest``: the pool
    the accounting agent stores groups of messages with (None: the writers')."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder | None = None,
        *,
        candidates_per_half: int = 50,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
        reads: asyncpg.Pool | None = None,
        threads: Executor | None = None,
        ingest: asyncpg.Pool | None = None,
    ) -> None:
        self._pool = pool
        self._reads = reads
        self._ingest = ingest
        self._threads = threads
        self._embedder = embedder
        read_pool = pool if reads is None else reads
        self.ingest = PostgresIngest(
            pool if ingest is None else ingest, per_conversation=single_conversation_transactions
        )
        self.history = PostgresHistory(pool, reads=read_pool)
        self.context = PostgresContext(read_pool)
        self.compactions = PostgresCompactions(pool)
        self.outbox = PostgresOutbox(pool)
        self.archive = PostgresArchive(pool, raw_retention_days=raw_retention_days, reads=read_pool)
        self.memory = PostgresMemory(
            read_pool, embedder, candidates_per_half=candidates_per_half, threads=threads
        )
        self.tallies = PostgresTallies(pool)
        self.privacy = PostgresPrivacy(pool)
        self.usage = PostgresUsage(pool)
        self.calibration = PostgresTokenRates(pool)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        embedder: Embedder | None = None,
        min_size: int = 1,
        max_size: int = 10,
        run_migrations: bool = True,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
        read_pool: ReadPool | None = None,
        ingest_pool_size: int = INGEST_POOL_SIZE,
    ) -> PostgresStore:
        """A store with its own pools, migrating the database first by default.

        Migrations run on a separate connection before the pools exist, since
        their connections register the ``vector`` codec, which needs the
        extension the first migration creates. Groups of messages are stored on
        a pool of their own (``ingest_pool_size``), so the accounting agent never
        queues for a connection behind compactions (a wave of them held the
        writers' 10 for up to 0.8 s, docs/performance.md section 10); with
        ``single_conversation_transactions`` a group's calls run side by side on
        the writers' pool instead.
        """
        if run_migrations:
            await migrate(dsn)
        read = ReadPool() if read_pool is None else read_pool
        pools: list[asyncpg.Pool] = [await _create_pool(dsn, min_size, max_size)]
        try:
            pools.append(await _create_pool(dsn, 0, read.max_size, read.server_settings()))
            if not single_conversation_transactions:
                pools.append(await _create_pool(dsn, 1, ingest_pool_size))
        except BaseException:
            for opened in pools:
                await opened.close()
            raise
        return cls(
            pools[0],
            embedder,
            raw_retention_days=raw_retention_days,
            single_conversation_transactions=single_conversation_transactions,
            reads=pools[1],
            threads=ThreadPoolExecutor(SEARCH_THREADS, thread_name_prefix="memory-read"),
            ingest=pools[2] if len(pools) > 2 else None,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    @property
    def reads(self) -> asyncpg.Pool:
        """The pool the callers' reads take (the writers' pool when it has none)."""
        return self._pool if self._reads is None else self._reads

    async def close(self) -> None:
        try:
            await self._pool.close()
            for own in (self._reads, self._ingest):
                if own is not None:
                    await own.close()
        finally:
            if self._threads is not None:
                self._threads.shutdown(wait=False, cancel_futures=True)


SEARCH_THREADS = 2
"""Threads for searches' text work: Python code, one core at a time (the GIL)."""


@dataclass(frozen=True)
class ReadPool:
    """The callers' reads' pool: at most ``max_size`` connections, each statement
    cancelled by PostgreSQL after ``statement_timeout`` seconds (0: never)."""

    max_size: int = 4
    statement_timeout: float = 5.0

    def server_settings(self) -> dict[str, str]:
        return {"statement_timeout": f"{round(self.statement_timeout * 1000)}ms"}


async def _create_pool(
    dsn: str, min_size: int, max_size: int, server_settings: dict[str, str] | None = None
) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        dsn,
        min_size=min(min_size, max_size),
        max_size=max_size,
        init=configure_connection,
        setup=refuse_read_only,
        reset=keep_session,
        server_settings=server_settings,
    )


if TYPE_CHECKING:

    def _implements(store: PostgresStore) -> Storage:
        """Never called: makes mypy prove the store holds every role."""
        return store
