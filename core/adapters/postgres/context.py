"""The context a platform reads at every turn, over PostgreSQL.

``PostgresContext`` implements ``core.ports.storage.ContextReader`` with one
call of ``compactor_context`` (migration 0020): the caller's scope, the
version and, when the caller does not hold that version, the history, as one
statement in one round trip, as ``compactor_reader`` of the caller's tenant
(row-level security shows only the scope's rows). The version is the
conversation's newest arrival number and its row count: every change to a
history inserts a row with a new arrival number (a message, a compaction's
clip-archive) or removes rows (an erase, a restore that brings every turn
back), so a reader that finds both unchanged has the history it read before.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.connection import tenant_setting
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.rows import row_to_message
from core.domain.context_fit import Sized
from core.ports.storage import (
    ContextLook,
    ContextReader,
    ContextSnapshot,
    ContextVersion,
    ReadScope,
    Watermark,
)

# Alone on a pooled connection, so its own transaction: the role and tenant it
# sets end with it. `includes` also looks among the archived raw turns, since a
# message a compaction summarised is in the context (in its clip-archive).
_LOOK_SQL = "SELECT * FROM compactor_context($1, $2, $3, $4, $5)"


def _version(row: Any) -> ContextVersion:
    return ContextVersion(
        version=(int(row["last_seq"]), int(row["n_rows"])),
        watermark=Watermark(
            message_id=row["last_message_id"],
            partition=row["source_partition"],
            offset=row["source_offset"],
        ),
        exists=int(row["n_rows"]) > 0,
        includes=bool(row["includes"]),
    )


def _sized(element: Any) -> Sized:
    """A ``compactor_context_message``: its tool calls come as JSON text."""
    row = dict(element)
    if row["tool_calls"] is not None:
        row["tool_calls"] = json.loads(row["tool_calls"])
    return Sized(row_to_message(row), int(row["token_estimate"]))


@port_errors_on_methods
class PostgresContext:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def context_look(
        self,
        conversation_id: str,
        *,
        scope: ReadScope,
        through: str | None = None,
        known: tuple[int, int] | None = None,
    ) -> ContextLook:
        seq, rows = known if known is not None else (None, None)
        row = await self._pool.fetchrow(
            _LOOK_SQL, tenant_setting(scope), conversation_id, through, seq, rows
        )
        version = _version(row)
        if row["history"] is None:
            return version
        return ContextSnapshot(version, tuple(_sized(m) for m in row["history"]))


if TYPE_CHECKING:

    def _implements(context: PostgresContext) -> ContextReader:
        """Never called: makes mypy prove the class implements its port."""
        return context
