"""Versioned SQL migrations, shipped as package data.

Every service instance runs ``migrate`` at start-up, so two processes may run
it at once: a session advisory lock makes the second wait and then find
nothing left to do. Each migration runs in its own transaction together with
its ``schema_migrations`` row, so a failed migration leaves no trace and is
retried on the next start. What a migration leaves to be done in batches
(0011's figures of the turns already archived) is done after it, by
``finish_backfills``, and resumed by the next run if interrupted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from core.adapters.postgres.migrate_backfill import finish_backfills

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    AnyConnection: TypeAlias = asyncpg.Connection | PoolConnectionProxy

log = logging.getLogger(__name__)

# One 64-bit key for the whole schema ("ctxcompm"). Per-conversation locks use
# the two-int advisory lock space, so they can never collide with it.
MIGRATION_LOCK_KEY = int.from_bytes(b"ctxcompm", "big")

_FILE_RE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text        PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """The packaged migrations are malformed (a naming or numbering mistake)."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: str
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    """The packaged migrations in version order.

    Read through importlib.resources so they are found in a wheel or a zip
    just as in a source checkout.
    """
    folder = resources.files("core.adapters.postgres").joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_RE.match(entry.name)
        if match is None:
            raise MigrationError(
                f"migration file {entry.name!r} is not named NNNN_lowercase_name.sql"
            )
        found.append(Migration(match["version"], match["name"], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {versions}")
    return found


async def migrate(
    target: str | asyncpg.Pool | AnyConnection, *, stop_before: str | None = None
) -> list[str]:
    """Apply pending migrations; return the versions applied by this call.

    ``target`` is a DSN, a pool or an open connection. A DSN gets a private
    connection, which matters when the caller's pool registers codecs for
    types (``vector``) that only exist once the first migration has run.
    ``stop_before`` (a version) leaves it and the later ones pending: a
    database as an older release left it, for upgrade tests and tools.
    """
    if isinstance(target, str):
        conn = await asyncpg.connect(target)
        try:
            return await _migrate_connection(conn, stop_before)
        finally:
            await conn.close()
    if isinstance(target, asyncpg.Pool):
        async with target.acquire() as pooled:
            return await _migrate_connection(pooled, stop_before)
    return await _migrate_connection(target, stop_before)


async def applied_versions(conn: AnyConnection) -> list[str]:
    """Versions recorded in ``schema_migrations``; empty before the first migrate."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return []
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    return [str(row["version"]) for row in rows]


async def _migrate_connection(conn: AnyConnection, stop_before: str | None) -> list[str]:
    migrations = [m for m in load_migrations() if stop_before is None or m.version < stop_before]
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(_CREATE_LEDGER)
        done = set(await applied_versions(conn))
        known = {m.version for m in migrations}
        if unknown := sorted(done - known):
            # A newer release migrated this database; carry on, its schema is a superset.
            log.warning("database has migrations this release does not know: %s", unknown)
        applied: list[str] = []
        for migration in migrations:
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("applied migration %s_%s", migration.version, migration.name)
            applied.append(migration.version)
        await finish_backfills(conn)
        return applied
    finally:
        # A dead connection has already dropped its session lock.
        if not conn.is_closed():
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
