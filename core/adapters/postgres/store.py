"""PostgreSQL adapter for every storage port (``WorkerStore``): the facade.

``PostgresStore`` owns the pool and the settings; the work is done by one
module per role, each a set of functions over the pool:

* ``messages``: one message stored, the history a compaction plans from;
* ``ingest``: a group of messages stored in a few statements (the hot path);
* ``compaction``: everything one compaction writes, in one transaction;
* ``outbox``: the rows a compaction wrote for the relay to publish;
* ``archive``: archived batches and raw turns, and their retention;
* ``memory``: ``memory_read``, full text and vectors fused by rank;
* ``tallies``: the token counts the worker's table caches;
* ``privacy``: erasure;
* ``tenants``: moving a conversation without a tenant into one.

Every public coroutine raises the ports' errors and none of the driver's
(``errors``): an outage is ``StoreUnavailable``.

The reads the HTTP views make (``load_history``, ``expand_batch``,
``memory_read``) take the caller's ``ReadScope``; with one,
they run in a READ ONLY transaction as ``compactor_reader`` with
``compactor.tenant`` set (``connection.reading``), and row-level security
(migration 0009) shows them only the scope's rows. Without one (the worker,
the CLI) they run on the pool as the tables' owner, whom the
``compactor_writer`` policy lets see everything.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING

import asyncpg

from core.adapters.postgres import archive as pg_archive
from core.adapters.postgres import compaction as pg_compaction
from core.adapters.postgres import ingest as pg_ingest
from core.adapters.postgres import memory as pg_memory
from core.adapters.postgres import messages as pg_messages
from core.adapters.postgres import outbox as pg_outbox
from core.adapters.postgres import privacy as pg_privacy
from core.adapters.postgres import tallies as pg_tallies
from core.adapters.postgres import tenants as pg_tenants
from core.adapters.postgres import usage as pg_usage
from core.adapters.postgres.connection import (
    CONVERSATION_LOCK_CLASS,
    configure_connection,
    keep_session,
    reading,
    refuse_read_only,
)
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.migrate import migrate
from core.domain.compaction import CompactionPlan, StoredBatch
from core.domain.messages import ConversationMessage
from core.domain.usage import UsageDay
from core.ports.embedding import Embedder
from core.ports.storage import (
    AlreadyApplied,
    Applied,
    CompactionInputs,
    CompactionOutbox,
    CompactionRecord,
    EraseOutcome,
    Erasure,
    ExpandedBatch,
    IncomingMessage,
    MemorySearchResult,
    MessageKey,
    OutboxRow,
    QueryMode,
    ReadScope,
    SaveOutcome,
    SearchSources,
    StoreTotals,
    WorkerStore,
)


@port_errors_on_methods
class PostgresStore:
    """Every storage port over one asyncpg pool.

    With an ``embedder``, ``memory_read`` embeds its query and fuses vector and
    full-text ranks; without one, search is full-text only. (What a compaction
    archives comes with its vectors on the plan, ``CompactionPlan.embeddings``.)
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        embedder: Embedder | None = None,
        *,
        candidates_per_half: int = 50,
        raw_retention_days: int = 0,
        single_conversation_transactions: bool = False,
    ) -> None:
        if candidates_per_half < 1:
            raise ValueError("candidates_per_half must be >= 1")
        if raw_retention_days < 0:
            raise ValueError("raw_retention_days must be >= 0 (0 keeps raw turns forever)")
        self._pool = pool
        self._embedder = embedder
        self._candidates_per_half = candidates_per_half
        self._raw_retention_days = raw_retention_days
        self._single_conversation_transactions = single_conversation_transactions

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

    # -- MessageStore --------------------------------------------------------

    async def save_messages(self, batch: Sequence[IncomingMessage]) -> list[SaveOutcome]:
        """A group in one transaction (``core.adapters.postgres.ingest``).

        A message that a compaction already summarised and deleted must not
        come back when it is delivered again (Kafka redelivers after a crash,
        a producer retries, a transcript is replayed): it would sit in the
        history next to the summary that covers it and be compacted twice.
        Archived batches keep their source message ids, so they are the
        record of what was compacted. The check runs under the conversation's
        advisory lock, the one ``apply_compaction`` holds while it deletes,
        so a redelivery racing a compaction sees either the row or its batch.

        A message an erase of the conversation covers (``core.domain.erasure``)
        is not written.
        """
        return await pg_ingest.save_group(
            self._pool,
            batch,
            lock_class=CONVERSATION_LOCK_CLASS,
            per_conversation=self._single_conversation_transactions,
        )

    async def load_history(
        self,
        conversation_id: str,
        *,
        as_of: datetime | None = None,
        up_to_seq: int | None = None,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> list[ConversationMessage]:
        if scope is None:
            return await pg_messages.load_history(
                self._pool,
                conversation_id,
                as_of=as_of,
                up_to_seq=up_to_seq,
                after=after,
                limit=limit,
            )
        async with reading(self._pool, scope) as conn:
            return await pg_messages.load_history(
                conn, conversation_id, as_of=as_of, up_to_seq=up_to_seq, after=after, limit=limit
            )

    async def compaction_applied(self, compaction_id: str) -> bool:
        return await pg_messages.compaction_applied(self._pool, compaction_id)

    async def compaction_inputs(
        self, compaction_id: str, conversation_id: str, *, up_to_seq: int | None
    ) -> CompactionInputs:
        """Applied?, stored total and history up to ``up_to_seq``: one round trip."""
        return await pg_messages.compaction_inputs(
            self._pool, compaction_id, conversation_id, up_to_seq
        )

    async def apply_compaction(
        self, plan: CompactionPlan, outbox: CompactionOutbox | None = None
    ) -> Applied | AlreadyApplied:
        """One transaction (``core.adapters.postgres.compaction``)."""
        return await pg_compaction.apply(self._pool, plan, outbox)

    # -- OutboxStore ---------------------------------------------------------

    async def pending_outbox(
        self, *, older_than_seconds: float = 0.0, limit: int = 100
    ) -> list[OutboxRow]:
        return await pg_outbox.pending(
            self._pool, older_than_seconds=older_than_seconds, limit=limit
        )

    async def outbox_rows(self, compaction_id: str) -> list[OutboxRow]:
        return await pg_outbox.rows_of(self._pool, compaction_id)

    async def mark_published(self, ids: Sequence[int]) -> None:
        await pg_outbox.mark_published(self._pool, ids)

    async def mark_compaction_published(self, compaction_id: str) -> None:
        await pg_outbox.mark_compaction_published(self._pool, compaction_id)

    # -- MemoryStore ---------------------------------------------------------

    async def live_batches(self, conversation_id: str) -> list[StoredBatch]:
        return await pg_archive.live_batches(self._pool, conversation_id)

    async def memory_read(
        self,
        query: str,
        conversation_id: str | None = None,
        limit: int = 5,
        *,
        sources: SearchSources = "both",
        mode: QueryMode = "plain",
        tenant_id: str | None = None,
        scope: ReadScope | None = None,
    ) -> MemorySearchResult:
        """Batches ranked by summary and raw turns (see ``core.adapters.postgres.memory``).

        With a ``scope``, in one READ ONLY transaction as ``compactor_reader``
        (``connection.reading``): row-level security holds the search to the
        scope whatever its own filters say."""
        # One connection for the search's 3-5 statements (not one each).
        connection = self._pool.acquire() if scope is None else reading(self._pool, scope)
        async with connection as conn:
            return await pg_memory.search(
                conn,
                self._embedder,
                query,
                conversation_id=conversation_id,
                limit=limit,
                sources=sources,
                mode=mode,
                tenant_id=tenant_id,
                candidates_per_half=self._candidates_per_half,
            )

    async def expand_batch(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        scope: ReadScope | None = None,
        after: MessageKey | None = None,
        limit: int | None = None,
    ) -> ExpandedBatch | None:
        if scope is None:
            return await pg_archive.expand_batch(
                self._pool, conversation_id, batch_id, after=after, limit=limit
            )
        async with reading(self._pool, scope) as conn:
            return await pg_archive.expand_batch(
                conn, conversation_id, batch_id, after=after, limit=limit
            )

    async def compaction_log(
        self, conversation_id: str, *, scope: ReadScope | None = None
    ) -> list[CompactionRecord]:
        if scope is None:
            return await pg_archive.compaction_log(self._pool, conversation_id)
        async with reading(self._pool, scope) as conn:
            return await pg_archive.compaction_log(conn, conversation_id)

    async def expire_raw_turns(self) -> int:
        return await pg_archive.expire_raw_turns(self._pool, self._raw_retention_days)

    # -- PrivacyStore --------------------------------------------------------

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        return await pg_privacy.erase_conversation(self._pool, conversation_id, erasure)

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        return await pg_tenants.move_to_tenant(self._pool, conversation_id, tenant_id)

    # -- TallySource ---------------------------------------------------------

    async def last_seq(self, conversation_id: str) -> int | None:
        return await pg_tallies.last_seq(self._pool, conversation_id)

    async def totals_of(self, conversation_ids: Collection[str]) -> dict[str, StoreTotals]:
        return await pg_tallies.totals_of(self._pool, conversation_ids)

    async def conversations_over(self, threshold: int) -> list[tuple[str, int]]:
        return await pg_tallies.conversations_over(self._pool, threshold)

    async def tenant_llm_tokens(self, tenant_id: str, since: datetime) -> int:
        return await pg_usage.tenant_llm_tokens(self._pool, tenant_id, since)

    async def usage_by_day(
        self, *, scope: ReadScope, tenant_id: str | None = None, since: date | None = None
    ) -> list[UsageDay]:
        """Read as ``scope`` (row-level security), like the other views' reads."""
        async with reading(self._pool, scope) as conn:
            return await pg_usage.usage_by_day(conn, tenant_id, since)


if TYPE_CHECKING:

    def _implements_ports(store: PostgresStore) -> WorkerStore:
        """Never called: makes mypy prove the store satisfies every port."""
        return store
