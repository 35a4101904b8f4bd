"""A conversation's identity: its tenant and the id its producer gave it.

Producers choose conversation ids, so two tenants may well use the same one
("support-1"). The identity of a conversation is therefore the pair
(tenant, conversation id), and every store, table entry, lock and compaction
id is keyed by one string that encodes the pair, the **conversation key**:

* ``acme/support-1``: tenant ``acme``, conversation ``support-1``;
* ``support-1``: no tenant, conversation ``support-1`` (unchanged from before
  tenants existed, so single-tenant deployments keep their keys);
* ``/a/b``: no tenant, conversation ``a/b`` (an id holding a ``/`` is
  prefixed, so it can never read as a tenant's key).

Tenant ids never contain ``/`` (``TENANT_ID_PATTERN``), so the three shapes are
disjoint and the encoding is one-to-one: a producer can neither claim another
tenant's conversation in advance nor write into it by choosing an id, and a
read scoped to one tenant can only ever name that tenant's keys.

The Kafka record keys stay the producer's conversation id (the messages
topic's key, which every co-partitioned topic must share); events carry
``tenant_id`` beside ``conversation_id``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TENANT_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,256}$"
"""Letters, digits and ``._:@-``: never ``/`` (the key's separator) nor ``*``
(the database's "every tenant" setting)."""

_TENANT_ID = re.compile(TENANT_ID_PATTERN)
_SEPARATOR = "/"


def is_tenant_id(value: str) -> bool:
    return _TENANT_ID.fullmatch(value) is not None


def conversation_key(tenant_id: str | None, conversation_id: str) -> str:
    """The one string that names (tenant, conversation id)."""
    if not conversation_id:
        raise ValueError("a conversation id is not empty")
    if tenant_id is not None:
        if not is_tenant_id(tenant_id):
            raise ValueError(f"not a tenant id: {tenant_id[:80]!r}")
        return f"{tenant_id}{_SEPARATOR}{conversation_id}"
    if _SEPARATOR in conversation_id:
        return f"{_SEPARATOR}{conversation_id}"
    return conversation_id


@dataclass(frozen=True)
class ConversationRef:
    """(tenant, conversation id): what a conversation key stands for."""

    tenant_id: str | None
    conversation_id: str

    @property
    def key(self) -> str:
        return conversation_key(self.tenant_id, self.conversation_id)

    @classmethod
    def of_key(cls, key: str) -> ConversationRef:
        """The pair a key encodes (the inverse of ``conversation_key``)."""
        if _SEPARATOR not in key:
            return cls(None, key)
        if key.startswith(_SEPARATOR):
            return cls(None, key[1:])
        tenant_id, conversation_id = key.split(_SEPARATOR, 1)
        return cls(tenant_id, conversation_id)


def tenant_of(key: str) -> str | None:
    """The tenant a conversation key names (None: a conversation without one)."""
    return ConversationRef.of_key(key).tenant_id


def conversation_id_of(key: str) -> str:
    """The producer's conversation id in a conversation key."""
    return ConversationRef.of_key(key).conversation_id
