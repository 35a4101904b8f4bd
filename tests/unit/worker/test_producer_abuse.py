"""What a producer sends cannot turn the service against its own conversation (issue 29).

Why: a message whose ``message_id`` is the id of the conversation's next
clip-archive (``clip-archive-{compaction id}``, a uuid5 anyone can compute) made
every apply of that compaction fail on the unique key, re-sent without end; a
``provisional-…`` id could collide with a provisional context message. The
service's own ids are now refused at the door (``reserved_id``). And a
producer's ``token_count`` was trusted as sent: ``0`` turned the conversation's
compaction off; it is now kept within a band of the service's own estimate.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from core.domain.messages import CLIP_ARCHIVE_ID_PREFIX, PROVISIONAL_ID_PREFIX
from core.domain.tally import compaction_id_for
from core.domain.tokens import reported_tokens
from streams.dead_letter_headers import DeadLetterHeaders
from streams.worker.processor import Compacted
from streams.worker.records import InvalidRecord, Record, decode_message
from tests.support.builders import T0
from tests.unit.worker.harness import BUDGET_TOKENS, NAMES, harness, over_budget, words

pytestmark = pytest.mark.unit


def event(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "message_id": "m1",
        "conversation_id": "c1",
        "role": "user",
        "content": "hello",
        "created_at": T0.isoformat(),
    }
    return json.dumps({**base, **fields}).encode()


@pytest.mark.parametrize(
    "message_id",
    [f"{CLIP_ARCHIVE_ID_PREFIX}{compaction_id_for('c1', 0)}", f"{PROVISIONAL_ID_PREFIX}abc"],
)
def test_a_service_made_message_id_is_refused_with_a_reason(message_id: str) -> None:
    record = Record(NAMES.messages, 0, 0, b"c1", event(message_id=message_id))
    with pytest.raises(InvalidRecord) as caught:
        decode_message(record, 10_000)
    assert caught.value.error_type == "reserved_id"
    assert "reserves" in caught.value.reason


def test_ids_that_only_look_alike_are_accepted() -> None:
    for message_id in ("my-clip-archive-1", "Provisional-1", "clip-archive"):
        record = Record(NAMES.messages, 0, 0, b"c1", event(message_id=message_id))
        assert decode_message(record, 10_000).message_id == message_id


async def test_a_message_holding_the_next_clip_archive_id_cannot_block_the_compaction() -> None:
    h = harness()
    squatter = f"{CLIP_ARCHIVE_ID_PREFIX}{compaction_id_for('c1', 0)}"
    await h.components.accounting.handle(
        h.record(
            NAMES.messages, "c1", event(message_id=squatter, created_at="2030-01-01T00:00:00Z")
        )
    )
    (letter,) = h.publisher.on("dead_letters")
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).error_type == "reserved_id"
    command = await over_budget(h)
    assert isinstance(await h.components.processor.compact(command), Compacted)


def test_a_reported_token_count_is_kept_within_a_band_of_the_estimate() -> None:
    assert reported_tokens(0, 100) == 25  # a quarter of the estimate at least
    assert reported_tokens(30, 100) == 30  # a provider's count inside the band is kept
    assert reported_tokens(5_000, 100) == 5_000
    assert reported_tokens(10**18, 100) == 100 * 64 + 256  # the absurd is cut
    assert reported_tokens(0, 0) == 0 and reported_tokens(7, 1) == 7


async def test_a_producer_reporting_zero_tokens_still_has_its_conversation_compacted() -> None:
    h = harness()
    for index in range(8):
        value = event(
            message_id=f"m{index}",
            content=words(80, f"topic{index}-"),
            created_at=(T0 + timedelta(seconds=index)).isoformat(),
            token_count=0,
        )
        await h.components.accounting.handle(h.record(NAMES.messages, "c1", value))
    assert h.tally().token_total > BUDGET_TOKENS
    (command,) = h.commands()
    assert isinstance(await h.components.processor.compact(command), Compacted)
