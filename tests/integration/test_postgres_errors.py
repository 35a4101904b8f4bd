"""``PostgresStore`` raises the storage ports' errors, never its driver's, on a real server.

Why: the worker's retry policy decides on the port errors alone
(``StoreUnavailable``: wait it out; anything else: a few tries, then the dead
letter topic). A refused connection, a server that went away or a backend
killed mid-query that escaped as an ``OSError`` or an asyncpg error would be
dead-lettered instead of waited out; a conflict or a bad record mapped to
``StoreUnavailable`` would be retried forever.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, cast

import asyncpg
import pytest
from asyncpg.exceptions._base import InternalClientError, OutdatedSchemaCacheError

from core.adapters.postgres.archive import PostgresArchive
from core.adapters.postgres.calibration import PostgresTokenRates
from core.adapters.postgres.compaction import PostgresCompactions
from core.adapters.postgres.context import PostgresContext
from core.adapters.postgres.history import PostgresHistory
from core.adapters.postgres.ingest import PostgresIngest
from core.adapters.postgres.memory import PostgresMemory
from core.adapters.postgres.outbox import PostgresOutbox
from core.adapters.postgres.privacy import PostgresPrivacy
from core.adapters.postgres.store import PostgresStore
from core.adapters.postgres.tallies import PostgresTallies
from core.adapters.postgres.usage import PostgresUsage
from core.domain.messages import ConversationMessage, ToolCall
from core.ports.storage import (
    HistoryConflictError,
    IncomingMessage,
    Storage,
    StoreRejected,
    StoreUnavailable,
    TenantConflictError,
)
from streams.worker.failures import FailurePolicy, Wait
from tests.integration.test_postgres_pool import plan_over
from tests.support.builders import history
from tests.support.builders import message as make_message
from tests.support.pg_control import ControlledPostgres, own_server
from tests.support.stores import saved
from tests.support.worker import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Call = Callable[[PostgresStore], Awaitable[object]]

CALLS: dict[str, Call] = {
    "load_history": lambda store: store.history.load_history("conv-1"),
    "save_messages": lambda store: store.ingest.save_messages(
        [IncomingMessage(make_message(50), 10)]
    ),
    "compaction_inputs": lambda store: store.history.compaction_inputs(
        "cmp-9", "conv-1", up_to_seq=None
    ),
}


def _assert_unavailable(error: BaseException, call: str = "") -> None:
    """A ``StoreUnavailable`` whose cause is the driver's (or the socket's) error."""
    assert type(error) is StoreUnavailable, f"{call}: {type(error).__name__}: {error}"
    assert isinstance(error.__cause__, OSError | asyncpg.PostgresError | asyncpg.InterfaceError)


# -- the map covers every role --------------------------------------------------------

STORAGE_ROLES = [
    name for name, member in inspect.getmembers(Storage) if isinstance(member, property)
]

ROLES = (
    PostgresStore, PostgresIngest, PostgresHistory, PostgresCompactions, PostgresOutbox,
    PostgresArchive, PostgresMemory, PostgresTallies, PostgresPrivacy, PostgresUsage,
    PostgresContext, PostgresTokenRates,
)  # fmt: skip


@pytest.mark.parametrize("role", ROLES, ids=[role.__name__ for role in ROLES])
def test_every_public_coroutine_of_every_role_goes_through_the_map(role: type) -> None:
    coroutines = {
        name: member
        for name, member in inspect.getmembers(role)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    }
    assert coroutines  # each role has a call to map
    unwrapped = [name for name, member in coroutines.items() if not hasattr(member, "__wrapped__")]
    assert unwrapped == []


def test_the_store_holds_one_object_of_each_role() -> None:
    """The roles ``PostgresStore`` hands out are the classes checked above."""
    store = PostgresStore(cast(Any, None))  # no pool needed: nothing is called
    held = {type(getattr(store, role)) for role in STORAGE_ROLES}
    assert held == set(ROLES[1:])


# -- (a) nothing listening ------------------------------------------------------------


@pytest.mark.parametrize("run_migrations", [True, False], ids=["migrating", "pool-only"])
async def test_connect_to_a_port_with_nothing_listening_is_unavailable(
    run_migrations: bool,
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(StoreUnavailable) as caught:
        await PostgresStore.connect(dsn, run_migrations=run_migrations)
    _assert_unavailable(caught.value)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


# -- (b) the server goes away -----------------------------------------------------------


@pytest.fixture
async def own_postgres() -> AsyncIterator[ControlledPostgres]:
    """A server only this test uses, so it may stop it."""
    async with own_server("store-errors-pg-") as server:
        yield server


async def test_a_stopped_server_is_unavailable_and_the_store_recovers_after_restart(
    own_postgres: ControlledPostgres,
) -> None:
    dsn = await own_postgres.create_database("errors")
    store = await PostgresStore.connect(dsn, max_size=2)
    try:
        await saved(store, make_message(0), 10)
        await asyncio.to_thread(own_postgres.stop_immediate)
        for name, call in CALLS.items():
            try:
                await call(store)
            except Exception as error:
                _assert_unavailable(error, name)
            else:
                pytest.fail(f"{name} succeeded with the server stopped")
        await asyncio.to_thread(own_postgres.start)
        await own_postgres.wait_accepting()
        # The same call succeeds later: the pool reconnects (a connection it
        # had not yet seen die may cost one more StoreUnavailable).
        for _ in range(3):
            try:
                loaded = await store.history.load_history("conv-1")
                break
            except StoreUnavailable:
                await asyncio.sleep(0.2)
        else:
            pytest.fail("the store did not recover after the server restarted")
        assert [m.id for m in loaded] == [make_message(0).id]
    finally:
        await store.close()


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_backend_terminated_mid_query_is_unavailable(
    name: str, pg_store: PostgresStore, pg_database: str
) -> None:
    """The query waits on a table lock another session holds; ``pg_terminate_backend``
    then kills it (``57P01``, an ``AdminShutdownError`` to asyncpg)."""
    locker = await asyncpg.connect(pg_database)
    try:
        blocker = locker.transaction()
        await blocker.start()
        await locker.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        pending = asyncio.ensure_future(CALLS[name](pg_store))
        victim = await _backend_waiting_on_a_lock(locker, pending)
        assert await locker.fetchval("SELECT pg_terminate_backend($1)", victim)
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(pending, 30)
        _assert_unavailable(caught.value)
        await blocker.rollback()
    finally:
        await locker.close()
    assert await pg_store.history.load_history("nobody") == []  # the pool replaced the connection


async def _backend_waiting_on_a_lock(
    locker: asyncpg.Connection, pending: asyncio.Future[object]
) -> int:
    for _ in range(200):
        assert not pending.done(), "the call finished although the table was locked"
        pid = await locker.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        if pid is not None:
            return int(pid)
        await asyncio.sleep(0.05)
    raise AssertionError("the call never waited on the lock")


# -- (c) everything else passes through as itself -----------------------------------------


async def test_a_history_conflict_comes_through_as_itself(pg_store: PostgresStore) -> None:
    messages = history(4)
    await saved(pg_store, messages[0], 10)  # the plan's second message was never stored
    with pytest.raises(HistoryConflictError) as caught:
        await pg_store.compactions.apply_compaction(plan_over(messages[:2]))
    assert type(caught.value) is HistoryConflictError


async def test_a_tenant_conflict_comes_through_as_itself(pg_store: PostgresStore) -> None:
    with pytest.raises(TenantConflictError) as caught:  # nothing to move
        await pg_store.privacy.move_to_tenant("nobody", "acme")
    assert type(caught.value) is TenantConflictError


async def test_bad_input_is_not_an_outage(pg_store: PostgresStore) -> None:
    """A value the query cannot take fails the same way every time: it comes
    through as ``StoreRejected`` (the driver's error as its cause), or the
    store's own ``ValueError``."""
    with pytest.raises(StoreRejected) as caught:
        await saved(pg_store, make_message(0), 2**40)  # token_estimate is an integer
    assert isinstance(caught.value.__cause__, asyncpg.DataError)
    with pytest.raises(ValueError, match="timezone-aware"):
        await pg_store.history.load_history("conv-1", as_of=datetime(2026, 1, 1))


def unvalidated(content: str, **fields: object) -> ConversationMessage:
    """A message that skipped validation (``model_construct``): what the store does
    when unstorable text gets past the door anyway."""
    valid = make_message(0)
    return ConversationMessage.model_construct(
        **{**valid.model_dump(), "content": content, **fields}
    )


@pytest.mark.parametrize(
    ("content", "tool_calls", "driver_error"),
    [
        ("a\x00b", None, asyncpg.CharacterNotInRepertoireError),  # NUL in text
        ("a\ud800b", None, asyncpg.DataError),  # asyncpg cannot encode it
        (
            "fine",
            (ToolCall.model_construct(id="t", name="run", arguments={"a": "x\x00"}),),
            asyncpg.UntranslatableCharacterError,  # \u0000 in jsonb
        ),
    ],
    ids=["nul-text", "lone-surrogate", "nul-jsonb"],
)
async def test_data_postgresql_refuses_is_store_rejected(
    pg_store: PostgresStore, content: str, tool_calls: object, driver_error: type
) -> None:
    message = unvalidated(content, tool_calls=tool_calls)
    with pytest.raises(StoreRejected) as caught:
        await pg_store.ingest.save_messages([IncomingMessage(message, 10)])
    assert isinstance(caught.value.__cause__, driver_error), caught.value.__cause__
    assert await pg_store.history.load_history(message.conversation_id) == []


async def test_a_row_a_constraint_refuses_is_store_rejected_with_the_constraint_named(
    pg_store: PostgresStore, pg_database: str
) -> None:
    """A CHECK the record's data breaks (one added here, as a deployment might, or
    a later migration): refused for good, with PostgreSQL's reason, not an outage
    and not an unknown error that is retried five times."""
    admin = await asyncpg.connect(pg_database)
    try:
        await admin.execute(
            "ALTER TABLE messages ADD CONSTRAINT no_forbidden_words "
            "CHECK (content NOT LIKE '%forbidden%')"
        )
    finally:
        await admin.close()
    message = make_message(0).model_copy(update={"content": "a forbidden word"})
    with pytest.raises(StoreRejected, match="no_forbidden_words") as caught:
        await pg_store.ingest.save_messages([IncomingMessage(message, 10)])
    assert isinstance(caught.value.__cause__, asyncpg.CheckViolationError)
    assert await pg_store.history.load_history(message.conversation_id) == []


async def test_a_missing_required_value_is_store_rejected(pg_store: PostgresStore) -> None:
    message = unvalidated("fine", role=None)  # messages.role is NOT NULL
    with pytest.raises(StoreRejected) as caught:
        await pg_store.ingest.save_messages([IncomingMessage(message, 10)])
    assert isinstance(caught.value.__cause__, asyncpg.NotNullViolationError)


async def test_a_unique_violation_is_not_store_rejected() -> None:
    """On the idempotency keys a unique violation is a concurrent writer of the
    same row: a retry resolves it, so it is not refused for good."""
    from core.adapters.postgres.errors import port_errors

    @port_errors
    async def racing_insert() -> None:
        raise asyncpg.UniqueViolationError("duplicate key value violates unique constraint")

    with pytest.raises(asyncpg.UniqueViolationError):
        await racing_insert()


async def test_a_connection_left_mid_operation_is_unavailable() -> None:
    """Issue 29: a write that hit a closed socket (``BrokenPipeError``) left a pooled
    connection mid-operation; the next query on it raised asyncpg's
    ``InternalClientError`` "cannot switch to state 12; another operation (2) is in
    progress". That passed through as a bug: ingest would try a record 5 times, then
    dead-letter a valid record as ``processing_error`` during an outage."""
    from core.adapters.postgres.errors import port_errors

    stuck = InternalClientError("cannot switch to state 12; another operation (2) is in progress")

    @port_errors
    async def query_on_a_stuck_connection() -> None:
        raise stuck

    with pytest.raises(StoreUnavailable) as caught:
        await query_on_a_stuck_connection()
    assert caught.value.__cause__ is stuck
    decision = FailurePolicy().decide(caught.value, attempts=99, records=1)
    assert isinstance(decision, Wait) and decision.then is None  # waited out, never given up


@pytest.mark.parametrize(
    "error",
    [InternalClientError("_on_result: waiter is done"), OutdatedSchemaCacheError("changed")],
    ids=["protocol-bug", "schema-cache"],
)
async def test_other_internal_client_errors_stay_bugs(error: Exception) -> None:
    """Only the stuck connection is an outage: asyncpg's other internal errors are a
    bug or a record it cannot take, which must stay visible (retried a few times,
    then dead-lettered), not waited on forever."""
    from core.adapters.postgres.errors import port_errors

    @port_errors
    async def failing() -> None:
        raise error

    with pytest.raises(type(error)):
        await failing()


async def test_a_malformed_dsn_is_not_an_outage() -> None:
    """asyncpg's ``ClientConfigurationError`` is an ``InterfaceError`` (otherwise an
    outage) and a ``ValueError``: waiting would never fix the configuration."""
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?sslmode=bogus"
    with pytest.raises(asyncpg.InterfaceError) as caught:
        await PostgresStore.connect(dsn, run_migrations=False)
    assert isinstance(caught.value, ValueError) and "sslmode" in str(caught.value)
