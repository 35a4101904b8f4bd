"""The two stores the contract suite runs over, and what a test may look at beside
the ports (a table's rows, the erase audit, a row's age) on each of them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from core.adapters.postgres.archive import PostgresArchive
from core.adapters.postgres.store import PostgresStore
from tests.support.memory_store import InMemoryStore

TABLES = ("messages", "archival_memory", "archived_messages", "compactions", "outbox")


class Backend(Protocol):
    """A store under test (``store``) and the look behind its ports."""

    name: str

    @property
    def store(self) -> Any: ...

    async def rows(self) -> dict[str, int]:
        """Rows per table (``TABLES``): what a call wrote, or did not."""
        ...

    async def tenant(self, conversation_id: str) -> tuple[bool, str | None]:
        """(has a ``conversations`` row, its tenant)."""
        ...

    async def audit(self, conversation_id: str) -> list[tuple[str, str, str, int, dict[str, int]]]:
        """(request id, requester, reason, epoch, counts) of each audited erase, oldest first."""
        ...

    async def stored_tokens(self, conversation_id: str) -> dict[str, int]:
        """Each live message's stored token count."""
        ...

    async def age_outbox(self, seconds: float) -> None:
        """Every outbox row written ``seconds`` earlier than it was."""
        ...

    async def age_archived(self, batch_id: str, days: int) -> None:
        """The raw turns of ``batch_id`` archived ``days`` earlier than they were."""
        ...

    def archive_keeping(self, days: int) -> Any:
        """The store's archive role with ``[archive].raw_retention_days = days``."""
        ...


class MemoryBackend:
    name = "memory"

    def __init__(self) -> None:
        self.store = InMemoryStore()

    async def rows(self) -> dict[str, int]:
        tables = self.store
        counted = (tables.messages, tables.batches, tables.archived, tables.applied)
        return dict(zip(TABLES, [*map(len, counted), len(tables.outbox_entries)], strict=True))

    async def tenant(self, conversation_id: str) -> tuple[bool, str | None]:
        known = conversation_id in self.store.tenants
        return known, self.store.tenants.get(conversation_id)

    async def audit(self, conversation_id: str) -> list[tuple[str, str, str, int, dict[str, int]]]:
        return [
            (e.request_id, e.requester, e.reason, e.epoch, e.counts)
            for e in self.store.audit
            if e.conversation_id == conversation_id
        ]

    async def stored_tokens(self, conversation_id: str) -> dict[str, int]:
        return {
            m: row.tokens for (c, m), row in self.store.messages.items() if c == conversation_id
        }

    async def age_outbox(self, seconds: float) -> None:
        for entry in self.store.outbox_entries:
            entry.created_at -= timedelta(seconds=seconds)

    async def age_archived(self, batch_id: str, days: int) -> None:
        archived = self.store.archived
        for key, entry in archived.items():
            if entry.batch_id == batch_id:
                archived[key] = replace(entry, archived_at=entry.archived_at - timedelta(days))

    def archive_keeping(self, days: int) -> Any:
        self.store.raw_retention_days = days
        return self.store.archive


class PostgresBackend:
    name = "postgres"

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    async def rows(self) -> dict[str, int]:
        pool = self.store.pool
        return {t: int(await pool.fetchval(f"SELECT count(*) FROM {t}")) for t in TABLES}

    async def tenant(self, conversation_id: str) -> tuple[bool, str | None]:
        row = await self.store.pool.fetchrow(
            "SELECT tenant_id FROM conversations WHERE conversation_id = $1", conversation_id
        )
        return (row is not None, None if row is None else row["tenant_id"])

    async def audit(self, conversation_id: str) -> list[tuple[str, str, str, int, dict[str, int]]]:
        rows = await self.store.pool.fetch(
            "SELECT * FROM erase_audit WHERE conversation_id = $1 ORDER BY erased_at, request_id",
            conversation_id,
        )
        return [
            (r["request_id"], r["requester"], r["reason"], r["epoch"], dict(r["counts"]))
            for r in rows
        ]

    async def stored_tokens(self, conversation_id: str) -> dict[str, int]:
        rows = await self.store.pool.fetch(
            "SELECT id, token_estimate FROM messages WHERE conversation_id = $1", conversation_id
        )
        return {r["id"]: int(r["token_estimate"]) for r in rows}

    async def age_outbox(self, seconds: float) -> None:
        await self.store.pool.execute(
            "UPDATE outbox SET created_at = created_at - make_interval(secs => $1)", seconds
        )

    async def age_archived(self, batch_id: str, days: int) -> None:
        await self.store.pool.execute(
            "UPDATE archived_messages SET archived_at = archived_at - make_interval(days => $2) "
            "WHERE batch_id = $1",
            batch_id,
            days,
        )

    def archive_keeping(self, days: int) -> Any:
        return PostgresArchive(self.store.pool, raw_retention_days=days)
