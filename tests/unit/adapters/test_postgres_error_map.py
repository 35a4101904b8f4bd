"""The driver-error map alone: which asyncpg errors the worker waits out.

Why: the failure policy dead-letters a record after a few tries of any error
that is not an outage. An error that says the *connection* is broken, not the
record, must therefore be an outage, or a database disturbance dead-letters
valid messages (and their offsets are committed past them: lost).
"""

from __future__ import annotations

import pytest
from asyncpg.exceptions import _base as asyncpg_base

from core.adapters.postgres.errors import port_errors
from core.ports.storage import StoreRejected, StoreUnavailable

pytestmark = pytest.mark.unit


async def _raising(error: BaseException) -> None:
    raise error


CONNECTION_STATE = [
    # Seen in a chaos run while the server's connections were cut mid-operation.
    asyncpg_base.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    ),
    asyncpg_base.ProtocolError("unexpected message type"),
    asyncpg_base.OutdatedSchemaCacheError(
        "cached statement plan is invalid", schema="s", data_type="t"
    ),
]


@pytest.mark.parametrize("error", CONNECTION_STATE, ids=lambda e: type(e).__name__)
async def test_a_broken_connection_state_is_an_outage_not_a_bad_record(
    error: BaseException,
) -> None:
    with pytest.raises(StoreUnavailable) as raised:
        await port_errors(_raising)(error)
    assert raised.value.__cause__ is error


async def test_client_side_data_errors_stay_rejections() -> None:
    with pytest.raises(StoreRejected):
        await port_errors(_raising)(asyncpg_base.DataError("invalid input for query argument $1"))
