"""Oversized records: dead letters truncated to what the broker takes, with the original size."""

from __future__ import annotations

import pytest

from core.ports.publisher import RecordTooLarge
from streams.dead_letter_headers import DeadLetterHeaders
from streams.worker.dead_letters import FALLBACK_REQUEST_BYTES, REQUEST_OVERHEAD_BYTES
from streams.worker.records import Record
from tests.unit.worker.harness import NAMES, harness

pytestmark = pytest.mark.unit


async def test_a_record_larger_than_a_request_is_dead_lettered_truncated_with_its_size() -> None:
    h = harness(max_content_chars=10)
    h.components.dead_letters._max_value = 50_000
    big = b'{"x": "' + b"y" * 2_000_000 + b'"}'
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.truncated and headers.original_size == len(big)
    assert letter.value == big[:50_000]
    assert headers.error_type == "invalid_event"


async def test_a_dead_letter_the_broker_refuses_as_too_large_is_sent_shorter() -> None:
    h = harness()
    h.publisher.fail_next = RecordTooLarge("MessageSizeTooLargeError")
    big = b"\xff" * 100_000
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    headers = DeadLetterHeaders.from_kafka(list(letter.headers))
    assert headers.truncated and headers.original_size == 100_000
    assert letter.value == big[:8192]


async def test_small_dead_letters_are_copied_whole() -> None:
    h = harness()
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", b"{not json"))
    headers = DeadLetterHeaders.from_kafka(list(h.publisher.sent[0].headers))
    assert not headers.truncated and headers.original_size == 9


async def test_a_dead_letter_within_the_request_limit_is_whole() -> None:
    """The worker's limit follows the source topics (8 MiB here): a 2 MB record
    is dead-lettered whole, not cut to 1 MB."""
    h = harness(max_content_chars=10)
    h.components.dead_letters._max_value = 8 * 1024 * 1024
    big = b'{"x": "' + b"y" * 2_000_000 + b'"}'
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    assert letter.value == big
    assert not DeadLetterHeaders.from_kafka(list(letter.headers)).truncated


async def test_a_dead_letter_refused_whole_is_cut_to_what_a_topic_of_default_size_takes() -> None:
    h = harness(max_content_chars=10)
    h.components.dead_letters._max_value = 8 * 1024 * 1024
    big = b'{"x": "' + b"y" * 2_000_000 + b'"}'
    h.publisher.fail_next = RecordTooLarge("the dead-letter topic accepts 1 MiB")
    await h.components.accounting.handle(h.record(NAMES.messages, "c1", big))
    (letter,) = h.publisher.on("dead_letters")
    assert letter.value == big[: FALLBACK_REQUEST_BYTES - REQUEST_OVERHEAD_BYTES]
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).truncated


async def test_a_dead_letter_keeps_the_records_own_headers_for_a_redrive() -> None:
    h = harness()
    record = Record(
        NAMES.messages,
        0,
        7,
        b"c1",
        b"{not json",
        (("compactor-signature", b"v1=abc"), ("dlq.reason", b"forged"), ("trace", b"t-1")),
    )
    await h.components.accounting.handle(record)
    (letter,) = h.publisher.on("dead_letters")
    names = [name for name, _ in letter.headers]
    assert names[:2] == ["compactor-signature", "trace"]  # its own first, no forged dlq.*
    assert dict(letter.headers)["compactor-signature"] == b"v1=abc"
    assert DeadLetterHeaders.from_kafka(list(letter.headers)).source_offset == 7
