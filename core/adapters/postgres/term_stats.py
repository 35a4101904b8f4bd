"""BM25 statistics of the archived raw turns (migration ``0011_memory_statistics``).

``archived_turn_stats`` (turns and words per conversation) and
``archived_term_stats`` (per conversation and lexeme: the turns holding it)
are what ``memory_read`` needs to rank raw turns by BM25 without reading
every turn of the scope. Triggers on ``archived_messages`` (migration 0011)
change them in the statement that archives or removes turns, whoever runs it
(a worker of the previous release during a rolling upgrade included).
``rebuild`` recomputes them from the turns (a bulk load, a test comparing the
two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection


async def rebuild(conn: AnyConnection) -> None:
    """Recompute every conversation's figures from ``archived_messages``."""
    async with conn.transaction():
        await conn.execute("DELETE FROM archived_term_stats")
        await conn.execute("DELETE FROM archived_turn_stats")
        await conn.execute(
            "INSERT INTO archived_turn_stats (conversation_id, turns, words) "
            "SELECT conversation_id, count(*), sum(word_count) FROM archived_messages "
            "GROUP BY conversation_id"
        )
        await conn.execute(
            "INSERT INTO archived_term_stats (conversation_id, lexeme, turns) "
            "SELECT a.conversation_id, u.lexeme, count(*) "
            "FROM archived_messages AS a, unnest(a.content_tsv) AS u "
            "GROUP BY a.conversation_id, u.lexeme"
        )
