"""Which conversations each write transaction touched, recorded by PostgreSQL itself.

Why: the plan past one PostgreSQL (``docs/scaling.md``) distributes every
table by ``conversation_id``. That only stays cheap if every write
transaction stays inside one conversation: a transaction spanning two
conversations becomes a multi-shard (two-phase) commit there. Reading the
store's code cannot prove that for every path, and new paths appear, so the
database records it: an ``AFTER INSERT OR UPDATE OR DELETE FOR EACH ROW``
trigger on every table with a ``conversation_id`` column (found in
``information_schema``, so a new table is covered without touching this file)
writes ``(txid_current(), table, operation, conversation_id, statement)`` to
an audit table. The audit row is part of the audited transaction: a
transaction that rolls back leaves no trace, one that commits is grouped by
its txid afterwards.

A table without ``conversation_id`` is reported by ``install`` unless it is
listed in ``NOT_CONVERSATION_DATA`` with the reason it holds no
conversation's data: a new table that forgets the column cannot slip past.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

AUDIT_TABLE = "write_scope_audit"
TRIGGER_NAME = "write_scope_audit_trigger"
TRUNCATE_TRIGGER_NAME = "write_scope_audit_truncate"

# Tables that hold no conversation's data, with why. Everything else in the
# public schema must have a conversation_id column.
NOT_CONVERSATION_DATA: dict[str, str] = {
    "schema_migrations": "migration bookkeeping (core.adapters.postgres.migrate), one row per migration",
    "usage_aggregates": "LLM spend per tenant and UTC day (migration 0014): the failed "
    "compactions' and the erased conversations' usage, folded in with no conversation id "
    "and no content",
    "token_calibration": "tokens per character of each provider and model (migration 0016): "
    "a rate, no conversation's data",
}

# Tables with a conversation_id that only a migration writes, with why: the
# service never writes them, so no path of the flow can (or need) be audited.
WRITTEN_BY_MIGRATIONS_ONLY: dict[str, str] = {
    "legacy_erasures": "erase marks from before conversation keys (migration 0010), read-only since",
}

_SETUP_SQL = f"""
CREATE TABLE {AUDIT_TABLE} (
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    txid            bigint      NOT NULL,
    table_name      text        NOT NULL,
    operation       text        NOT NULL,
    conversation_id text,
    statement       text        NOT NULL
);

CREATE FUNCTION write_scope_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO {AUDIT_TABLE} (txid, table_name, operation, conversation_id, statement)
        VALUES (txid_current(), TG_TABLE_NAME, TG_OP, OLD.conversation_id,
                left(current_query(), 300));
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO {AUDIT_TABLE} (txid, table_name, operation, conversation_id, statement)
        VALUES (txid_current(), TG_TABLE_NAME, TG_OP, NEW.conversation_id,
                left(current_query(), 300));
    END IF;
    RETURN NULL;
END
$$;

-- TRUNCATE fires no row triggers; it touches every conversation, recorded as NULL.
CREATE FUNCTION write_scope_record_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {AUDIT_TABLE} (txid, table_name, operation, conversation_id, statement)
    VALUES (txid_current(), TG_TABLE_NAME, TG_OP, NULL, left(current_query(), 300));
    RETURN NULL;
END
$$;
"""


@dataclass(frozen=True)
class Tables:
    """The public schema's tables as the audit sees them."""

    keyed: tuple[str, ...]
    """With a ``conversation_id`` column: audited."""
    unkeyed: tuple[str, ...]
    """Without one and not in ``NOT_CONVERSATION_DATA``: a scope the audit cannot see."""


@dataclass(frozen=True)
class Transaction:
    """One committed write transaction that touched more than one conversation
    (or a row without a conversation id, or a whole table)."""

    txid: int
    conversations: tuple[str | None, ...]
    writes: tuple[str, ...]
    """``table OPERATION`` pairs, e.g. ``messages INSERT``."""
    statements: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join("NULL" if c is None else repr(c) for c in self.conversations[:6])
        more = len(self.conversations) - 6
        if more > 0:
            shown += f", … ({more} more)"
        statements = " || ".join(" ".join(s.split())[:160] for s in self.statements[:3])
        return (
            f"txid {self.txid}: {len(self.conversations)} conversations [{shown}] "
            f"by {', '.join(self.writes)}; statement(s): {statements}"
        )


async def discover(conn: asyncpg.Connection) -> Tables:
    rows = await conn.fetch(
        """
        SELECT t.table_name,
               EXISTS (SELECT 1 FROM information_schema.columns AS c
                        WHERE c.table_schema = t.table_schema AND c.table_name = t.table_name
                          AND c.column_name = 'conversation_id') AS keyed
          FROM information_schema.tables AS t
         WHERE t.table_schema = 'public' AND t.table_type = 'BASE TABLE'
           AND t.table_name <> $1
         ORDER BY t.table_name
        """,
        AUDIT_TABLE,
    )
    keyed = tuple(r["table_name"] for r in rows if r["keyed"])
    unkeyed = tuple(
        r["table_name"]
        for r in rows
        if not r["keyed"] and r["table_name"] not in NOT_CONVERSATION_DATA
    )
    return Tables(keyed=keyed, unkeyed=unkeyed)


async def install(conn: asyncpg.Connection) -> Tables:
    """Create the audit table and a trigger on every keyed table; the tables found."""
    await conn.execute(_SETUP_SQL)
    tables = await discover(conn)
    for table in tables.keyed:
        await conn.execute(
            f'CREATE TRIGGER {TRIGGER_NAME} AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
            "FOR EACH ROW EXECUTE FUNCTION write_scope_record()"
        )
        await conn.execute(
            f'CREATE TRIGGER {TRUNCATE_TRIGGER_NAME} AFTER TRUNCATE ON "{table}" '
            "FOR EACH STATEMENT EXECUTE FUNCTION write_scope_record_truncate()"
        )
    return tables


async def wide_transactions(conn: asyncpg.Connection) -> list[Transaction]:
    """Every audited transaction that touched two conversations or more, a row
    without a conversation id, or a whole table (TRUNCATE), oldest first."""
    rows = await conn.fetch(
        f"""
        SELECT txid,
               array_agg(DISTINCT conversation_id) AS conversations,
               array_agg(DISTINCT table_name || ' ' || operation) AS writes,
               array_agg(DISTINCT statement) AS statements
          FROM {AUDIT_TABLE}
         GROUP BY txid
        HAVING count(DISTINCT conversation_id) > 1 OR bool_or(conversation_id IS NULL)
         ORDER BY min(seq)
        """
    )
    return [
        Transaction(
            txid=int(r["txid"]),
            conversations=tuple(sorted(r["conversations"], key=lambda c: (c is not None, c or ""))),
            writes=tuple(sorted(r["writes"])),
            statements=tuple(r["statements"]),
        )
        for r in rows
    ]


async def writes_seen(conn: asyncpg.Connection) -> set[tuple[str, str]]:
    """Every (table, operation) the audit recorded."""
    rows = await conn.fetch(f"SELECT DISTINCT table_name, operation FROM {AUDIT_TABLE}")
    return {(r["table_name"], r["operation"]) for r in rows}


def report(transactions: Iterable[Transaction]) -> str:
    return "\n".join(t.describe() for t in transactions)


@dataclass
class TxidWindows:
    """The txids a call's transactions got, for a caller that runs one thing at a time.

    ``txid_current()`` outside a transaction takes a fresh txid, so two
    readings bracket every txid assigned in between; when nothing else writes
    meanwhile (the offline driver is sequential), the txids inside a bracket
    are the call's own.
    """

    pool: asyncpg.Pool
    windows: list[tuple[int, int]]

    @classmethod
    def on(cls, pool: asyncpg.Pool) -> TxidWindows:
        return cls(pool, [])

    def wrap(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def bracketed(*args: Any, **kwargs: Any) -> Any:
            low = int(await self.pool.fetchval("SELECT txid_current()"))
            try:
                return await call(*args, **kwargs)
            finally:
                high = int(await self.pool.fetchval("SELECT txid_current()"))
                self.windows.append((low, high))

        return bracketed

    def __contains__(self, txid: object) -> bool:
        return isinstance(txid, int) and any(low < txid < high for low, high in self.windows)
