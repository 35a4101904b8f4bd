"""Tenants and erasure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class Erasure:
    """What an erase records besides deleting: ids, offsets and times, never content."""

    request_id: str
    requester: str
    reason: str
    requested_at: datetime  # also the cutoff: messages created at or before it stay erased
    erased_at: datetime
    # messages-topic partition → the highest offset the erase covers (-1: none)
    offsets: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EraseOutcome:
    """Rows removed per table, the conversation's erase epoch (erases so far) and
    whether this request id had been applied before (``repeated``: then
    ``removed`` and ``erased_at`` are the first application's, from the audit)."""

    removed: dict[str, int]
    epoch: int
    erased_at: datetime
    repeated: bool = False


class PrivacyStore(Protocol):
    """Tenants and erasure."""

    async def erase_conversation(self, conversation_id: str, erasure: Erasure) -> EraseOutcome:
        """Remove every row of the conversation from every table, in one transaction
        under the conversation's lock, and in the same transaction record the
        erase (the ``erasures`` mark, its epoch raised once per request id) and
        its audit entry; both survive the erase. Idempotent."""
        ...

    async def move_to_tenant(self, conversation_id: str, tenant_id: str) -> bool:
        """Move the conversation without a tenant ``conversation_id`` (a producer's
        id) into ``tenant_id``: every row, its erase mark and audit, re-keyed in
        one transaction under both keys' locks. ``True`` when moved now, ``False``
        when it was moved before (nothing left without a tenant, the tenant's
        conversation there). Raises ``TenantConflictError`` (and writes nothing)
        when both have rows: two histories are never merged."""
        ...
