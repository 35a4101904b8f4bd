"""PostgreSQL's storage (``core.ports.storage.Storage``): one pool, one object per role.

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


@port_errors_on_methods
class PostgresStore:
    """Every role over one asyncpg pool. ``embedder``: what ``memory_read`` embeds
    its query with (none: full text only); ``raw_retention_days``: how long
    archived raw turns are kept (0: forever); ``single_conversation_transactions``:
    a group of messages is stored in one transaction per conversation."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder | None = None,
        *,
        candidates_per_half: int = 50,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
    ) -> None:
        self._pool = pool
        self._embedder = embedder
        self.ingest = PostgresIngest(pool, per_conversation=single_conversation_transactions)
        self.history = PostgresHistory(pool)
        self.context = PostgresContext(pool)
        self.compactions = PostgresCompactions(pool)
        self.outbox = PostgresOutbox(pool)
        self.archive = PostgresArchive(pool, raw_retention_days=raw_retention_days)
        self.memory = PostgresMemory(pool, embedder, candidates_per_half=candidates_per_half)
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
    ) -> PostgresStore:
        """A store with its own pool, migrating the database first by default.

        Migrations run on a separate connection before the pool exists, since
        the pool's connections register the ``vector`` codec, which needs the
        extension the first migration creates.
        """
        if run_migrations:
            await migrate(dsn)
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=configure_connection,
            setup=refuse_read_only,
            reset=keep_session,
        )
        return cls(
            pool,
            embedder,
            raw_retention_days=raw_retention_days,
            single_conversation_transactions=single_conversation_transactions,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    async def close(self) -> None:
        await self._pool.close()


if TYPE_CHECKING:

    def _implements(store: PostgresStore) -> Storage:
        """Never called: makes mypy prove the store holds every role."""
        return store
