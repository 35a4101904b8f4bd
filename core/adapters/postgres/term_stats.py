"""BM25 statistics of the archived raw turns (migration ``0011_memory_statistics``).

``archived_turn_stats`` (turns and words per conversation) and
``archived_term_stats`` (per conversation and lexeme: the turns holding it)
are what ``memory_read`` needs to rank raw turns by BM25 without reading
every turn of the scope. They change in the transaction that changes
``archived_messages``: a compaction adds (``ADD_CTES``, inside its archive
statement, under the conversation's advisory lock), retention takes away
(``REMOVE_CTES``, under the same lock), an erase deletes them with the rest of
the conversation. ``rebuild`` recomputes them from the turns (a bulk load,
a test comparing the two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.adapters.postgres.migrate import AnyConnection

# Data-modifying CTEs over a CTE named ``kept`` (the archived rows just
# inserted, with ``content_tsv`` and ``word_count``) and the conversation in
# ``$2``: appended to the archive statement, so keeping them costs no round trip.
ADD_CTES = """
turn_stats AS (
    INSERT INTO archived_turn_stats AS s (conversation_id, turns, words)
    SELECT $2, count(*), coalesce(sum(k.word_count), 0) FROM kept AS k HAVING count(*) > 0
    ON CONFLICT (conversation_id) DO UPDATE
       SET turns = s.turns + excluded.turns, words = s.words + excluded.words
), term_stats AS (
    INSERT INTO archived_term_stats AS s (conversation_id, lexeme, turns)
    SELECT $2, u.lexeme, count(*) FROM kept AS k, unnest(k.content_tsv) AS u
     GROUP BY u.lexeme
     ORDER BY u.lexeme
    ON CONFLICT (conversation_id, lexeme) DO UPDATE SET turns = s.turns + excluded.turns
)
"""

# The same over a CTE named ``removed`` (archived rows just deleted) and the
# conversation in ``$1``: appended to retention's delete. Figures at zero
# are dropped by ``DROP_EMPTY`` in the same transaction.
REMOVE_CTES = """
turn_stats AS (
    UPDATE archived_turn_stats AS s
       SET turns = s.turns - r.turns, words = s.words - r.words
      FROM (SELECT count(*) AS turns, coalesce(sum(word_count), 0) AS words FROM removed) AS r
     WHERE s.conversation_id = $1 AND r.turns > 0
), term_stats AS (
    UPDATE archived_term_stats AS s
       SET turns = s.turns - r.turns
      FROM (SELECT u.lexeme, count(*) AS turns FROM removed AS k, unnest(k.content_tsv) AS u
             GROUP BY u.lexeme) AS r
     WHERE s.conversation_id = $1 AND s.lexeme = r.lexeme
)
"""

DROP_EMPTY = """
WITH terms AS (
    DELETE FROM archived_term_stats WHERE conversation_id = $1 AND turns <= 0
)
DELETE FROM archived_turn_stats WHERE conversation_id = $1 AND turns <= 0
"""


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
