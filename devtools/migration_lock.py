"""``python -m devtools.migration_lock --turns 400000``: how long the upgrade
from the previous release blocks the writers of ``archived_messages``.

Migration 0011 adds BM25 figures for every archived turn; on a large archive
the question an operator asks is how long compactions (which insert archived
turns) wait while ``compactor migrate`` runs. This tool answers it the way
it is felt: a database as the previous release left it (migrations before
0011), ``--turns`` synthetic turns loaded with COPY, then this release's
migrations applied while a writer inserts one turn every ``PROBE_INTERVAL``
seconds; the longest insert is the lock's wait. ``tests/integration/
test_migration_lock.py`` runs it small; docs/operations.md ("Upgrading")
gives the figures at 400,000 turns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from core.adapters.postgres.embedded import start_temporary
from core.adapters.postgres.migrate import migrate

#: The migration whose lock is measured; the database starts just before it.
FIRST_NEW_MIGRATION = "0011"
PROBE_INTERVAL = 0.05
TURNS_PER_CONVERSATION = 50
_WORDS_PER_TURN = 50  # about 300 characters, as the figures in docs/operations.md
_COLUMNS = (
    "conversation_id",
    "id",
    "batch_id",
    "compaction_id",
    "role",
    "content",
    "created_at",
    "token_estimate",
    "seq",
)
_PROBE = """
INSERT INTO archived_messages (conversation_id, id, batch_id, compaction_id, role, content,
                               created_at, token_estimate, seq)
VALUES ('lock-probe', $1, NULL, 'probe', 'user', 'a probe turn while the migration runs',
        now(), 8, $2)
"""


@dataclass(frozen=True, slots=True)
class LockMeasure:
    """What a writer of ``archived_messages`` saw while the migrations ran."""

    turns: int
    fill_seconds: float
    migrate_seconds: float
    longest_insert_seconds: float
    median_insert_seconds: float
    probes: int
    applied: list[str]


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(5000)]


def _turn_rows(turns: int, seed: int) -> list[tuple[object, ...]]:
    rng = random.Random(seed)
    words = _vocabulary(rng)
    # Word frequencies as in prose (Zipf): a conversation repeats its common words.
    zipf = list(itertools.accumulate(1 / rank for rank in range(1, len(words) + 1)))
    now = datetime.now(UTC)
    rows: list[tuple[object, ...]] = []
    for index in range(turns):
        conversation, seq = divmod(index, TURNS_PER_CONVERSATION)
        content = " ".join(rng.choices(words, cum_weights=zipf, k=_WORDS_PER_TURN))
        rows.append(
            (f"fill-{conversation}", f"m{seq}", f"b{conversation}", f"c{conversation}",
             "user" if seq % 2 == 0 else "assistant", content, now, 80, seq)
        )  # fmt: skip
    return rows


async def fill_archived_turns(dsn: str, turns: int, *, seed: int = 29) -> None:
    """``turns`` archived turns, 50 a conversation, loaded with COPY."""
    conn = await asyncpg.connect(dsn)
    try:
        chunk = 50_000
        for start in range(0, turns, chunk):
            rows = _turn_rows(min(chunk, turns - start), seed + start)
            rows = [(f"{r[0]}-{start}", *r[1:]) for r in rows]
            await conn.copy_records_to_table("archived_messages", records=rows, columns=_COLUMNS)
        await conn.execute("ANALYZE archived_messages")
    finally:
        await conn.close()


async def _probe_until(dsn: str, done: asyncio.Event) -> list[float]:
    """One insert per interval until ``done``; how long each took."""
    conn = await asyncpg.connect(dsn)
    took: list[float] = []
    try:
        while not done.is_set():
            start = time.monotonic()
            await conn.execute(_PROBE, f"p{uuid.uuid4().hex}", len(took))
            took.append(time.monotonic() - start)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), PROBE_INTERVAL)
    finally:
        await conn.close()
    return took


async def measure_migration_lock(dsn: str, turns: int) -> LockMeasure:
    """Migrate ``dsn`` (an empty database) to the previous release, fill it,
    then apply this release's migrations under a probing writer."""
    await migrate(dsn, stop_before=FIRST_NEW_MIGRATION)
    start = time.monotonic()
    await fill_archived_turns(dsn, turns)
    filled = time.monotonic()
    done = asyncio.Event()
    probing = asyncio.create_task(_probe_until(dsn, done))
    try:
        migrate_start = time.monotonic()
        applied = await migrate(dsn)
        migrate_seconds = time.monotonic() - migrate_start
    finally:
        done.set()
        took = await probing
    return LockMeasure(
        turns=turns,
        fill_seconds=round(filled - start, 2),
        migrate_seconds=round(migrate_seconds, 2),
        longest_insert_seconds=round(max(took, default=0.0), 3),
        median_insert_seconds=round(statistics.median(took) if took else 0.0, 3),
        probes=len(took),
        applied=applied,
    )


async def _measure_on_a_temporary_server(turns: int) -> LockMeasure:
    server = start_temporary()
    try:
        admin = await asyncpg.connect(server.dsn)
        try:
            await admin.execute("CREATE DATABASE migration_lock")
        finally:
            await admin.close()
        parts = urlsplit(server.dsn)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("dbname", "database")]
        database = parts._replace(path="/migration_lock", query=urlencode(query))
        return await measure_migration_lock(urlunsplit(database), turns)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    """Print the measure as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m devtools.migration_lock")
    parser.add_argument("--turns", type=int, default=400_000, help="archived turns to load")
    parser.add_argument("--dsn", help="an empty database (default: a temporary embedded server)")
    args = parser.parse_args(argv)
    if args.dsn:
        measure = asyncio.run(measure_migration_lock(args.dsn, args.turns))
    else:
        measure = asyncio.run(_measure_on_a_temporary_server(args.turns))
    print(json.dumps(asdict(measure)))


if __name__ == "__main__":
    main()
