"""How the store's connections are set up, and the lock every history writer takes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import asyncpg
from pgvector.asyncpg import register_vector

from core.domain.tenancy import is_tenant_id
from core.ports.storage import ReadScope

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Queryable: TypeAlias = asyncpg.Pool | PoolConnectionProxy
    """What a read runs on: the pool (the worker's reads) or a scoped transaction's
    connection (``reading``)."""

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
    declares no cursors outside transactions, never LISTENs, and its only SETs
    are ``SET LOCAL`` (``reading``), which end with their transaction.
    asyncpg still rolls back a transaction left open before calling this.
    Pass as ``reset=`` to any pool handed to ``PostgresStore``.
    """
    del conn


class ReadOnlyServerError(ConnectionError):
    """A pooled connection's server no longer takes writes (a primary fenced with
    ``default_transaction_read_only`` or demoted by a failover): this connection
    is useless to the worker, the pool must find the new primary."""


async def refuse_read_only(conn: asyncpg.Connection) -> None:
    """The pool's ``setup`` on every acquire: drop a connection whose server says it
    is read-only now, so the next one is opened afresh and the DSN's
    ``target_session_attrs=read-write`` picks the primary among its hosts.

    PostgreSQL reports ``default_transaction_read_only`` and ``in_hot_standby`` to
    the client whenever they change (at the connection's next statement), so this
    costs no round trip. Raising here makes asyncpg close the connection, and the
    error (a ``ConnectionError``) reads as ``StoreUnavailable``: the caller retries.
    A primary that is stopped or restarted as a standby closes its connections
    itself; this covers the one that stays up, read-only (``docs/operations.md``,
    "PostgreSQL: replication, failover"). Pass as ``setup=`` to any pool handed to
    ``PostgresStore``.
    """
    settings = conn.get_settings()
    for name in ("default_transaction_read_only", "in_hot_standby"):
        if getattr(settings, name, "off") == "on":
            raise ReadOnlyServerError(f"the server reports {name}=on: not the primary now")


IsolationLevel = Literal["read_committed", "repeatable_read"]

# Migration 0009: the role the HTTP views read as, the setting its policies
# read, and the value of that setting that shows every tenant (no tenant id
# can be "*": tenant ids are letters, digits and ._:@-).
READER_ROLE = "compactor_reader"
WRITER_ROLE = "compactor_writer"
TENANT_SETTING = "compactor.tenant"
ALL_TENANTS = "*"

_BEGIN_READ: dict[IsolationLevel, str] = {
    "read_committed": "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY",
    "repeatable_read": "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
}


def tenant_setting(scope: ReadScope) -> str:
    """The value of ``compactor.tenant`` for ``scope``: ``*`` or a tenant id, so only
    ``TENANT_ID_PATTERN``'s characters (ValueError otherwise)."""
    if scope.all_tenants:
        return ALL_TENANTS
    tenant = scope.tenant or ""
    if not is_tenant_id(tenant):  # ReadScope takes any string; "*" is not a tenant
        raise ValueError(f"not a tenant id: {tenant[:80]!r}")
    return tenant


def enter_scope(scope: ReadScope, isolation: IsolationLevel) -> str:
    """The transaction's start and its scope, one simple query: one round trip
    where a parameter would cost a second (a read at every turn pays it). The
    tenant is a literal here, safely: ``tenant_setting`` admits only letters,
    digits, ``._:@-`` and ``*``, none of which can end or escape a string."""
    return (
        f"{_BEGIN_READ[isolation]}; SELECT set_config('role', '{READER_ROLE}', true), "
        f"set_config('{TENANT_SETTING}', '{tenant_setting(scope)}', true)"
    )


@asynccontextmanager
async def reading(
    pool: asyncpg.Pool, scope: ReadScope, *, isolation: IsolationLevel = "read_committed"
) -> AsyncIterator[Queryable]:
    """A READ ONLY transaction as ``compactor_reader`` with ``compactor.tenant`` set
    for ``scope`` (both ``SET LOCAL``: they end with the transaction, so the pooled
    connection goes back as it came). Row-level security then shows only the
    scope's rows, whatever the queries inside filter on, even for a superuser.
    ``repeatable_read``: every statement inside sees one snapshot. The queries
    inside open no transaction of their own (asyncpg does not know of this one)."""
    start = enter_scope(scope, isolation)
    async with pool.acquire() as conn:
        try:
            await conn.execute(start)
            yield conn
        except BaseException:
            await _roll_back(conn)
            raise
        await conn.execute("COMMIT")


async def _roll_back(conn: Any) -> None:
    """Best effort: a connection too broken to roll back is closed by the pool."""
    if conn.is_closed() or not conn.is_in_transaction():
        return
    with contextlib.suppress(Exception):
        await conn.execute("ROLLBACK")


def read_as(pool: asyncpg.Pool, scope: ReadScope | None) -> AbstractAsyncContextManager[Queryable]:
    """Where a read runs: with a ``scope`` (a read on a caller's behalf) in a
    scoped transaction (``reading``), without one on the pool, as the tables'
    owner, whom the ``compactor_writer`` policy lets see everything."""
    return nullcontext(pool) if scope is None else reading(pool, scope)
