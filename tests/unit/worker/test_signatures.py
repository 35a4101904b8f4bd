"""Producer signatures ([tenancy]): a tenant's events signed with its keys.

Why: a conversation is (tenant, id), so an id cannot be squatted across
tenants, but a producer can still name another tenant in ``tenant_id``. With
signing keys, an event whose signature is missing or made with another
tenant's key is dead-lettered before anything is stored.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.domain.signatures import SIGNATURE_HEADER, signature, verified
from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import MessageEvent
from streams.worker.records import Record
from tests.support.builders import T0
from tests.unit.worker.harness import NAMES, Harness, harness

pytestmark = pytest.mark.unit

ACME_OLD = "acme-signing-key-0123456789abcdef-old"
ACME_NEW = "acme-signing-key-0123456789abcdef-new"
GLOBEX = "globex-signing-key-0123456789abcdef-1"
KEYS = {"acme": [ACME_OLD, ACME_NEW], "globex": [GLOBEX]}


def event(index: int, tenant: str | None) -> bytes:
    return (
        MessageEvent(
            message_id=f"m{index}",
            conversation_id="c1",
            role="user",
            content=f"hello {index}",
            created_at=T0 + timedelta(seconds=index),
            tenant_id=tenant,
        )
        .model_dump_json()
        .encode()
    )


async def send(h: Harness, value: bytes, header: bytes | None) -> None:
    headers = () if header is None else ((SIGNATURE_HEADER, header),)
    await h.components.accounting.handle(
        Record(NAMES.messages, 0, next(h.offsets), b"c1", value, headers)
    )


def letters(h: Harness) -> list[tuple[str, str]]:
    found = []
    for published in h.publisher.on("dead_letters"):
        headers = DeadLetterHeaders.from_kafka(list(published.headers))
        found.append((headers.error_type, headers.reason))
    return found


def signed(key: str, value: bytes) -> bytes:
    return signature(key.encode(), value).encode()


async def test_only_events_signed_with_their_tenants_key_are_stored() -> None:
    h = harness(tenancy={"signing_keys": KEYS})
    good_old, good_new = event(0, "acme"), event(1, "acme")
    await send(h, good_old, signed(ACME_OLD, good_old))  # either key of a rotation
    await send(h, good_new, signed(ACME_NEW, good_new))
    forged = event(2, "acme")
    await send(h, forged, signed(GLOBEX, forged))  # globex's producer names acme
    await send(h, event(3, "acme"), None)  # unsigned
    moved = event(4, "acme")
    await send(h, moved, signed(ACME_NEW, event(5, "acme")))  # another value's signature
    await send(h, event(6, "acme"), b"v1=\xff")  # not even text
    await send(h, event(7, None), None)  # no tenant, not required: stored
    await send(h, event(8, "initech"), None)  # a tenant without keys, not required: stored
    assert [kind for kind, _ in letters(h)] == ["bad_signature"] * 4
    assert all(ACME_OLD not in reason and ACME_NEW not in reason for _, reason in letters(h))
    assert h.store.message_ids("acme/c1") == ["m0", "m1"]
    assert (h.store.message_ids("c1"), h.store.message_ids("initech/c1")) == (["m7"], ["m8"])


async def test_require_signature_and_require_tenant() -> None:
    h = harness(tenancy={"signing_keys": KEYS, "require_signature": True})
    await send(h, event(0, None), None)
    await send(h, event(1, "initech"), None)  # a tenant without keys
    value = event(2, "globex")
    await send(h, value, signed(GLOBEX, value))
    assert [kind for kind, _ in letters(h)] == ["missing_tenant", "bad_signature"]
    assert h.store.message_ids("globex/c1") == ["m2"]
    h = harness(tenancy={"require_tenant": True})
    await send(h, event(0, None), None)
    await send(h, event(1, "initech"), None)
    assert [kind for kind, _ in letters(h)] == ["missing_tenant"]
    assert h.store.message_ids("initech/c1") == ["m1"]


def test_verified_tries_every_key_and_refuses_junk() -> None:
    value = b'{"x": 1}'
    keys = [b"k" * 32, b"j" * 32]
    assert verified(keys, value, signature(b"j" * 32, value).encode())
    assert not verified(keys, value, signature(b"i" * 32, value).encode())
    assert not verified(keys, value + b" ", signature(b"j" * 32, value).encode())
    for junk in (None, b"", b"v1=", b"\xff\xfe", signature(b"j" * 32, value).upper().encode()):
        assert not verified(keys, value, junk)
