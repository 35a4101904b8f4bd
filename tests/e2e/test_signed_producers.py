"""Signed producers end to end: `compactor replay` signs, the worker verifies.

Why: a conversation is (tenant, id), so no producer can squat or write into
another tenant's conversation by its id; but with several producing services
on one messages topic, a producer could still name another tenant in
``tenant_id``. With ``[tenancy].signing_keys`` the worker stores a tenant's
events only when signed with that tenant's key: a forged or unsigned one is
dead-lettered ``bad_signature``, with its bytes, before anything is stored.
"""

from __future__ import annotations

import json

import pytest

from core.domain.signatures import SIGNATURE_HEADER, signature
from core.domain.tenancy import conversation_key
from streams.dead_letter_headers import DeadLetterHeaders
from tests.e2e.conftest import Conversation, Stack
from tests.e2e.test_erase import compactor

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

ACME_KEY = "e2e-acme-signing-key-0123456789abcdef"
GLOBEX_KEY = "e2e-globex-signing-key-0123456789abcdef"
KEYS = {"acme": [ACME_KEY], "globex": [GLOBEX_KEY]}


async def test_only_events_signed_by_their_tenant_are_stored(stack: Stack) -> None:
    worker = stack.worker("w1", env={"COMPACTOR_TENANCY__SIGNING_KEYS": json.dumps(KEYS)})
    await worker.wait_ready(stack.names.messages)
    signed = Conversation("ticket-7", "ledger")
    transcript = stack.root / "signed.jsonl"
    events = [{**e, "tenant_id": "acme"} for e in signed.until_over(0)]
    transcript.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    # The operator's replay signs with acme's key from the same configuration.
    code, _, err = await compactor(
        stack,
        "replay",
        str(transcript),
        env={"COMPACTOR_TENANCY__SIGNING_KEYS": json.dumps({"acme": [ACME_KEY]})},
    )
    assert code == 0, err

    # globex's producer writes into acme's ticket-7, signing with its own key; someone
    # else sends without a signature; and a signature lifted from another record.
    def forged(n: int) -> bytes:
        return json.dumps(
            {**events[0], "message_id": f"forged-{n}", "content": "transfer the funds"}
        ).encode()

    await stack.send_raw(
        forged(1),
        b"ticket-7",
        [(SIGNATURE_HEADER, signature(GLOBEX_KEY.encode(), forged(1)).encode())],
    )
    await stack.send_raw(forged(2), b"ticket-7")
    lifted = signature(ACME_KEY.encode(), json.dumps(events[0]).encode()).encode()
    await stack.send_raw(forged(3), b"ticket-7", [(SIGNATURE_HEADER, lifted)])

    records = await stack.dead_letters.wait_for(
        lambda records: len(records) >= 3, timeout=60, what="three dead letters"
    )
    kinds = [DeadLetterHeaders.from_kafka(list(r.headers)).error_type for r in records]
    assert kinds == ["bad_signature"] * 3
    await stack.wait_for_clip_events({conversation_key("acme", "ticket-7"): 1}, timeout=60)
    forged_rows = await stack.db.fetchval(
        "SELECT (SELECT count(*) FROM messages WHERE id LIKE 'forged-%') "
        "+ (SELECT count(*) FROM archived_messages WHERE id LIKE 'forged-%')"
    )
    assert forged_rows == 0
    await worker.stop_async()
    for key in (ACME_KEY, GLOBEX_KEY):
        assert key not in worker.log_text()
