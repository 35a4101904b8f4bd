"""What a message event must show about its tenant before it is stored.

A conversation is (tenant, id) in any case (``core.domain.tenancy``): no id
can be squatted or written into across tenants. What a producer can still do
is name another tenant in ``tenant_id``. Where one service produces for every
tenant that is fine; where several do (one per tenant, say), the messages
topic's ACL cannot tell them apart, so each tenant signs its events with its
own keys (``[tenancy].signing_keys``, ``core.domain.signatures``) and an event
whose signature is missing or made with another tenant's key is dead-lettered
``bad_signature`` before anything is stored. ``require_tenant`` dead-letters
an event without a tenant (``missing_tenant``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from core.domain.signatures import SIGNATURE_HEADER, verified
from core.settings import TenancySettings
from streams.events import MessageEvent
from streams.worker.records import InvalidRecord, Record


@dataclass(frozen=True)
class ProducerPolicy:
    require_tenant: bool = False
    require_signature: bool = False
    keys: Mapping[str, tuple[bytes, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, tenancy: TenancySettings) -> ProducerPolicy:
        return cls(
            require_tenant=tenancy.require_tenant,
            require_signature=tenancy.require_signature,
            keys={
                tenant: tuple(key.get_secret_value().encode() for key in keys)
                for tenant, keys in tenancy.signing_keys.items()
            },
        )

    def check(self, record: Record, event: MessageEvent) -> None:
        """Raises ``InvalidRecord`` (``missing_tenant``, ``bad_signature``) for an event
        this policy refuses."""
        tenant = event.tenant_id
        if tenant is None:
            if self.require_tenant or self.require_signature:
                raise InvalidRecord(
                    "the event names no tenant_id, and [tenancy] requires one", "missing_tenant"
                )
            return
        keys = self.keys.get(tenant)
        if keys is None:
            if self.require_signature:
                raise InvalidRecord(
                    f"tenant {tenant!r} has no signing key, and [tenancy].require_signature is set",
                    "bad_signature",
                )
            return
        if not verified(keys, record.value or b"", record.header(SIGNATURE_HEADER)):
            missing = record.header(SIGNATURE_HEADER) is None
            raise InvalidRecord(
                f"the {SIGNATURE_HEADER} header is "
                + ("missing" if missing else "not a signature of this value")
                + f" by a key of tenant {tenant!r}",
                "bad_signature",
            )
