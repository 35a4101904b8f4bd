"""asyncpg's and the socket's errors → the storage ports' errors, in one place.

A store raises the ports' errors and nothing of its driver
(``core.ports.storage``): the worker's retry policy decides on those types
alone. Every way PostgreSQL can be briefly away (refused or lost connection,
server shutting down or starting up, too many connections, a timeout, no
read-write host during a failover) becomes ``StoreUnavailable``, with the
driver's error as its ``__cause__``. Data the
database refuses (SQLSTATE class 22: text it cannot hold such as a NUL, a value
out of range, a string too long; class 54: a value over a limit such as an
index row; asyncpg raises the same ``DataError`` for an argument it cannot
encode, such as a lone surrogate or an integer out of range; class 23's
NOT NULL and CHECK violations: a row the schema's rules refuse)
becomes ``StoreRejected``: retrying gives the same answer. A unique
violation is not among them: on the idempotency keys it is a concurrent
writer of the same row, which a retry resolves. Everything
else passes through unchanged: the port errors a store raises on purpose
(``HistoryConflictError``, ``TenantConflictError``), and any other error,
which is a bug or a record the store cannot take, and must stay visible.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import asyncpg
from asyncpg import exceptions as pg_errors
from asyncpg.exceptions._base import DataError as ClientDataError
from asyncpg.exceptions._base import InternalClientError

from core.ports.storage import StoreReadTimedOut, StoreRejected, StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=type)

UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError (refused, reset); FileNotFoundError while the socket is gone
    TimeoutError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08: connection exception
    pg_errors.ConnectionDoesNotExistError,  # the connection died mid-call
    asyncpg.InterfaceError,  # the connection or the pool is closed
    pg_errors.OperatorInterventionError,  # class 57: shutting down, starting up, terminated
    pg_errors.InsufficientResourcesError,  # class 53: too many connections
    pg_errors.TooManyConnectionsError,
    # A failover under way (docs/operations.md, "PostgreSQL: replication, failover"):
    # every host of a multi-host DSN answered, none read-write (target_session_attrs),
    pg_errors.TargetServerAttributeNotMatched,
    # or a pooled connection's server became read-only (a fenced or demoted primary;
    # the pool then drops it: connection.refuse_read_only). The worker never writes
    # in a READ ONLY transaction, so this is the server, not the statement.
    pg_errors.ReadOnlySQLTransactionError,
    # The client's own connection state, never the data: a connection left mid-
    # operation by a dying server ("cannot switch to state 12; another operation (2)
    # is in progress"), a protocol desync, a statement cache a migration outdated.
    # The pool terminates such a connection on release; a retry gets another one.
    # Taken for a bug, it would dead-letter valid records during an outage.
    InternalClientError,
)
"""The driver errors that mean PostgreSQL is (briefly) not there."""

NEVER_UNAVAILABLE: tuple[type[BaseException], ...] = (ValueError,)
"""Excepted from ``UNAVAILABLE``: asyncpg's ``InterfaceError``s that are also
``ValueError``s (``ClientConfigurationError``: a malformed DSN or connection
option; the client-side ``DataError``: a value a query cannot take). Waiting
cannot fix them."""


REJECTED: tuple[type[BaseException], ...] = (
    pg_errors.DataError,  # class 22: invalid text representation, character not in
    # repertoire (a NUL), untranslatable character, string data right truncation,
    # numeric value out of range, invalid datetime format, …
    pg_errors.ProgramLimitExceededError,  # class 54: index row too large, tsvector too long
    pg_errors.NotNullViolationError,  # 23502: a required value missing
    pg_errors.CheckViolationError,  # 23514: a value a CHECK constraint refuses
    ClientDataError,  # asyncpg's client-side DataError (an InterfaceError and a ValueError)
)
"""The driver errors that mean PostgreSQL (or asyncpg) refuses this data for good."""


def timed_out(error: BaseException) -> bool:
    """Whether PostgreSQL cancelled the statement for its ``statement_timeout``
    (SQLSTATE 57014 is also a cancel on request, which is an outage's kind)."""
    return isinstance(error, pg_errors.QueryCanceledError) and "statement timeout" in str(error)


def is_unavailable(error: BaseException) -> bool:
    """Whether ``error`` from the driver means the database is (briefly) away."""
    return isinstance(error, UNAVAILABLE) and not isinstance(error, NEVER_UNAVAILABLE)


def port_errors(func: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """``func`` raising ``StoreUnavailable`` (from the original) for an outage and
    ``StoreRejected`` for data the database refuses."""

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except REJECTED as error:
            detail = str(error) or "no detail"
            raise StoreRejected(
                f"PostgreSQL refused the data ({type(error).__name__}: {detail})"[:1000]
            ) from error
        except UNAVAILABLE as error:
            if not is_unavailable(error):
                raise
            detail = str(error) or "no detail"
            if timed_out(error):
                raise StoreReadTimedOut(f"PostgreSQL cancelled a read: {detail}") from error
            raise StoreUnavailable(
                f"PostgreSQL unavailable ({type(error).__name__}: {detail})"
            ) from error

    return call


def port_errors_on_methods(cls: C) -> C:
    """Class decorator: ``port_errors`` on every public coroutine method, classmethods
    included, so a method added later cannot leak a driver error."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, classmethod) and inspect.iscoroutinefunction(member.__func__):
            setattr(cls, name, classmethod(port_errors(member.__func__)))
        elif inspect.iscoroutinefunction(member):
            setattr(cls, name, port_errors(member))
    return cls
