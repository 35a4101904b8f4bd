"""The errors a store raises on purpose, and nothing of its driver.

The worker's retry policy (``streams.worker.retry``) decides on these types
alone, the way httpx maps every transport's exceptions to its own at the edge:
each adapter maps its driver's errors at its edge
(``core.adapters.postgres.errors``).
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error a store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store could not be reached or is restarting (connection refused or lost,
    server shutting down or starting up, too many connections, a timeout).
    Nothing is known to have been written; the same call may succeed later."""


class StoreReadTimedOut(StoreUnavailable):
    """A read on a caller's behalf ran past the store's statement timeout and was
    cancelled (``[postgres].read_statement_timeout_seconds``): the store is busy or
    the read too large. Nothing was written; a retry later, or a narrower read,
    may succeed."""


class StoreRejected(StoreError):
    """The store refuses this data (text it cannot hold, a value out of range, a
    string too long for its column); retrying gives the same answer. Nothing was
    written. The worker dead-letters the record at once."""


class StoreConflict(StoreError):
    """The call contradicts what is stored; nothing was written. Retrying the same
    call gives the same answer."""


class HistoryConflictError(StoreConflict):
    """The history a plan was computed from changed before it could be applied
    (a message it meant to delete is gone). Nothing was written."""


class TenantConflictError(StoreConflict):
    """A conversation cannot move to that tenant (it has one already, or the tenant
    has a conversation with that id). Nothing was written."""
