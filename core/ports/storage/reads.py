"""What a read on a caller's behalf takes: whose rows it may see, and where a page starts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from core.domain.messages import ConversationMessage


@dataclass(frozen=True)
class ReadScope:
    """Whose rows a read on a caller's behalf may see: one tenant's, or every
    tenant's (``ReadScope.everything()``, for a token that is not tenant-bound).

    The HTTP views pass one to every read; a store enforces it beneath the
    query's own filters (PostgreSQL: row-level security, migration 0009), so a
    query that forgets its tenant filter still sees only this scope's rows.
    A conversation without a tenant is visible to ``everything()`` only.
    """

    tenant: str | None = None
    all_tenants: bool = False

    def __post_init__(self) -> None:
        if (self.tenant is None) != self.all_tenants:
            raise ValueError("a ReadScope is one tenant or all tenants, exactly one")

    @classmethod
    def of_tenant(cls, tenant: str) -> ReadScope:
        return cls(tenant=tenant)

    @classmethod
    def everything(cls) -> ReadScope:
        return cls(all_tenants=True)

    def sees(self, tenant: str | None) -> bool:
        """Whether a conversation of ``tenant`` (None: none) is in this scope."""
        return self.all_tenants or (tenant is not None and tenant == self.tenant)


@dataclass(frozen=True)
class MessageKey:
    """A message's place in a read's order, for keyset pagination (``after=``).

    History order is the clip-archive first, then ``created_at``, then ``id``;
    a batch's turns are ordered by ``created_at``, then ``id`` (``clip_archive``
    False). A page starts strictly after its key.
    """

    created_at: datetime
    id: str
    clip_archive: bool = False

    @classmethod
    def of(cls, message: ConversationMessage) -> MessageKey:
        """The key of a message a read returned (a page's last, for the next page)."""
        return cls(message.created_at, message.id, message.stored_clip_archive)

    def order(self) -> tuple[bool, datetime, str]:
        """What sorts in read order (a clip-archive first)."""
        return (not self.clip_archive, self.created_at, self.id)
