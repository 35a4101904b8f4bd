"""The store follows a PostgreSQL failover by itself: no new store, no worker restart.

Why: the worker is given one DSN naming the primary and the standby with
``target_session_attrs=read-write`` (docs/operations.md, "PostgreSQL
failover"). asyncpg then connects to whichever host takes writes, but only
when it opens a connection: the pool must let go of connections to the old
primary, and every error on the way (refused, lost, no read-write host yet, a
read-only server) must read as ``StoreUnavailable`` so the caller waits it out
instead of dead-lettering the record. These tests fail over a real pair
(``tests/support/pg_replication.py``) under a store that keeps running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from core.adapters.postgres.store import INGEST_POOL_SIZE, PostgresStore
from core.ports.storage import StoreUnavailable
from tests.support.builders import message
from tests.support.pg_replication import ReplicatedPostgres, replicated_pair
from tests.support.stores import saved

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
async def pair() -> AsyncIterator[ReplicatedPostgres]:
    async with replicated_pair("async", prefix="it-pg-pair-") as started:
        yield started


async def _store(pair: ReplicatedPostgres, max_size: int = 4) -> PostgresStore:
    dsn = await pair.create_database("failover")
    return await PostgresStore.connect(dsn, min_size=max_size, max_size=max_size)


async def _save_until_stored(store: PostgresStore, index: int, timeout: float = 60.0) -> int:
    """Save message ``index`` as a caller that waits outages out would; the number of
    ``StoreUnavailable`` on the way."""
    return await _until_done(lambda: saved(store, message(index), 10), timeout)


async def _until_done(write: Callable[[], Awaitable[object]], timeout: float = 60.0) -> int:
    """``write`` until it goes through, as a caller that waits outages out would; the
    number of ``StoreUnavailable`` on the way."""
    deadline = time.monotonic() + timeout
    failures = 0
    while True:
        try:
            await write()
            return failures
        except StoreUnavailable:
            failures += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _server_port(store: PostgresStore) -> int:
    return int(await store.pool.fetchval("SELECT inet_server_port()"))


async def test_the_store_follows_a_crashed_primary_to_the_promoted_standby(
    pair: ReplicatedPostgres,
) -> None:
    store = await _store(pair)
    try:
        for index in range(3):
            await saved(store, message(index), 10)
        old_port = await _server_port(store)
        await asyncio.to_thread(pair.crash_primary)
        # The primary is gone and the standby is read-only: nothing to write to yet.
        with pytest.raises(StoreUnavailable):
            await saved(store, message(3), 10)
        await pair.promote()
        await _save_until_stored(store, 4)
        assert await _server_port(store) == pair.primary.port != old_port
        ids = [m.id for m in await store.history.load_history("conv-1")]
        assert ids == [message(i).id for i in (0, 1, 2, 4)]
    finally:
        await store.close()


async def test_the_pool_drops_connections_to_a_primary_fenced_read_only(
    pair: ReplicatedPostgres,
) -> None:
    """A primary fenced with ``default_transaction_read_only`` keeps its connections
    open: each pooled one fails at most once (``StoreUnavailable``) and is dropped,
    then the store writes to the promoted standby: with the accounting agent's pool
    (a message) and the writers' (a pin)."""
    pool_size = 3
    store = await _store(pair, max_size=pool_size)
    try:
        await saved(store, message(0), 10)
        fenced = await asyncpg.connect(pair.primary.dsn("postgres"))
        try:
            await fenced.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            await fenced.execute("SELECT pg_reload_conf()")
        finally:
            await fenced.close()
        # No host takes writes now (a fenced primary, a standby): a new pool cannot start.
        with pytest.raises(StoreUnavailable):
            await PostgresStore.connect(pair.dsn("failover"), run_migrations=False)
        await pair.promote()
        failures = await _save_until_stored(store, 1)
        assert failures <= INGEST_POOL_SIZE
        pin = await _until_done(lambda: store.compactions.set_pinned("conv-1", message(0).id, True))
        assert pin <= pool_size
        assert await _server_port(store) == pair.primary.port
        assert [m.id for m in await store.history.load_history("conv-1")] == [
            message(0).id,
            message(1).id,
        ]
    finally:
        await store.close()
