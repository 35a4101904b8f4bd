"""The context a platform reads at every turn, over PostgreSQL.

``PostgresContext`` implements ``core.ports.storage.ContextReader``. Both of
its reads run on the caller's behalf (``connection.reading``: row-level
security shows only the scope's rows). The version is the conversation's
newest arrival number and its row count: every change to a history inserts a
row with a new arrival number (a message, a compaction's clip-archive) or
removes rows (an erase, a restore that brings every turn back), so a reader
that finds both unchanged has the history it read before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

from core.adapters.postgres.connection import reading
from core.adapters.postgres.errors import port_errors_on_methods
from core.adapters.postgres.rows import row_to_message
from core.domain.context_fit import Sized
from core.ports.storage import (
    ContextReader,
    ContextSnapshot,
    ContextVersion,
    ReadScope,
    Watermark,
)

# One row whatever the conversation holds; `includes` also looks among the
# archived raw turns, since a message a compaction summarised is in the context
# (in its clip-archive).
_VERSION_SQL = """
SELECT v.last_seq, v.rows, c.last_message_id, c.source_partition, c.source_offset,
       ($2::text IS NULL
        OR EXISTS (SELECT 1 FROM messages WHERE conversation_id = $1 AND id = $2)
        OR EXISTS (SELECT 1 FROM archived_messages WHERE conversation_id = $1 AND id = $2))
           AS includes
  FROM (SELECT coalesce(max(seq), 0) AS last_seq, count(*) AS rows
          FROM messages WHERE conversation_id = $1) AS v
  LEFT JOIN conversations AS c ON c.conversation_id = $1
"""

_HISTORY_SQL = """
SELECT id, conversation_id, role, content, tool_calls, tool_call_id, created_at, kind,
       token_estimate
  FROM messages
 WHERE conversation_id = $1
 ORDER BY (kind <> 'clip_archive'), created_at, id
"""


def _version(row: Any) -> ContextVersion:
    return ContextVersion(
        version=(int(row["last_seq"]), int(row["rows"])),
        watermark=Watermark(
            message_id=row["last_message_id"],
            partition=row["source_partition"],
            offset=row["source_offset"],
        ),
        exists=int(row["rows"]) > 0,
        includes=bool(row["includes"]),
    )


@port_errors_on_methods
class PostgresContext:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def context_version(
        self, conversation_id: str, *, scope: ReadScope, through: str | None = None
    ) -> ContextVersion:
        async with reading(self._pool, scope) as conn:
            row = await conn.fetchrow(_VERSION_SQL, conversation_id, through)
        return _version(row)

    async def context_snapshot(
        self, conversation_id: str, *, scope: ReadScope, through: str | None = None
    ) -> ContextSnapshot:
        """The version and the history from one snapshot: a REPEATABLE READ
        transaction, so no message can land between the two statements."""
        async with reading(self._pool, scope, isolation="repeatable_read") as conn:
            version = await conn.fetchrow(_VERSION_SQL, conversation_id, through)
            rows = await conn.fetch(_HISTORY_SQL, conversation_id)
        history = tuple(Sized(row_to_message(row), int(row["token_estimate"])) for row in rows)
        return ContextSnapshot(_version(version), history)


if TYPE_CHECKING:

    def _implements(context: PostgresContext) -> ContextReader:
        """Never called: makes mypy prove the class implements its port."""
        return context
