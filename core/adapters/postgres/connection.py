"""How the store's connections are set up, and the lock every history writer takes."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
from pgvector.asyncpg import register_vector

# Class id for the two-int advisory lock space ("ccmp"); the object id is
# hashtext(conversation_id). Kept apart from the migration lock's bigint key.
CONVERSATION_LOCK_CLASS = int.from_bytes(b"ccmp", "big")


def _dump_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def configure_connection(conn: asyncpg.Connection) -> None:
    """Per-connection codecs: jsonb as Python objects, ``vector`` as pgvector's type.

    Pass as ``init=`` to any pool handed to ``PostgresStore``; the ``vector``
    type must exist (run ``migrate`` first).
    """
    await conn.set_type_codec(
        "jsonb", encoder=_dump_json, decoder=json.loads, schema="pg_catalog", format="text"
    )
    await register_vector(conn)


async def keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does.

    asyncpg's default reset runs ``pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL`` after every pooled call, one more round trip each
    (half of all round trips for one-statement calls). The store leaves no
    session state to reset: its advisory locks are transaction-scoped, it
    declares no cursors outside transactions, never LISTENs and never SETs.
    asyncpg still rolls back a transaction left open before calling this.
    Pass as ``reset=`` to any pool handed to ``PostgresStore``.
    """
    del conn
