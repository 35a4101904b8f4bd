"""A record the source topic accepts is dead-lettered whole, not cut to 1 MB.

Why: a 2 MB record on a messages topic that accepts 8 MiB was dead-lettered
truncated to the producer's 1 MB request limit, so it could not be re-driven
whole, although the broker would have taken it. Now the worker's request
limit follows the largest record its source topics accept, and the
dead-letter topic is created to accept it; a dead letter is cut only when
the broker still refuses it (a dead-letter topic made smaller by hand).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.dead_letter_headers import DeadLetterHeaders
from streams.kafka.admin import DEAD_LETTER_HEADROOM_BYTES, describe_topic_configs
from streams.worker.dead_letters import FALLBACK_REQUEST_BYTES, REQUEST_OVERHEAD_BYTES
from tests.e2e.conftest import Stack, eventually
from tests.support.llm_server import LLMTestServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TOPIC_ACCEPTS = 8 * 1024 * 1024  # the messages topic's max.message.bytes
MAX_CONTENT = 500


@pytest.fixture
async def big_stack(
    kafka_bootstrap: str, pg_database: str, llm: LLMTestServer, tmp_path: Path
) -> AsyncIterator[Stack]:
    """A stack whose messages topic accepts 8 MiB (created before the others)."""
    stack = Stack(bootstrap=kafka_bootstrap, dsn=pg_database, llm=llm, root=tmp_path)
    await stack.open(messages_configs={"max.message.bytes": str(TOPIC_ACCEPTS)})
    try:
        yield stack
    finally:
        await stack.close()


def two_megabytes() -> bytes:
    event = {
        "schema_version": 1,
        "message_id": "big-1",
        "conversation_id": "conv-big",
        "role": "user",
        "content": "x" * 2_000_000,  # over max_content_chars: dead-lettered as oversized
        "created_at": "2026-05-01T09:00:00+00:00",
    }
    return json.dumps(event).encode()


async def _dead_letter_of(stack: Stack, value: bytes) -> tuple[DeadLetterHeaders, bytes | None]:
    """Start a worker, send ``value``; its dead letter's headers and value."""
    worker = stack.worker("w1", config={"service": {"max_content_chars": MAX_CONTENT}})
    await worker.wait_ready(stack.names.messages)
    sent = await stack.send_raw(value, b"conv-big")
    (record,) = await stack.dead_letters.wait_for(
        lambda records: len(records) >= 1, timeout=60, what="the dead letter"
    )
    headers = DeadLetterHeaders.from_kafka(list(record.headers))
    assert (headers.source_partition, headers.source_offset) == (sent.partition, sent.offset)
    assert headers.error_type == "oversized"
    assert headers.original_size == len(value)
    return headers, record.value


async def test_a_2_mb_record_on_a_topic_that_accepts_8_mib_is_dead_lettered_whole(
    big_stack: Stack,
) -> None:
    names = big_stack.names
    configs = await describe_topic_configs(big_stack.bootstrap, [names.dead_letters])
    assert configs[names.dead_letters]["max.message.bytes"] == str(
        TOPIC_ACCEPTS + DEAD_LETTER_HEADROOM_BYTES
    ), "the dead-letter topic is created to take whole what the messages topic accepts"
    value = two_megabytes()
    headers, dead_letter = await _dead_letter_of(big_stack, value)
    assert not headers.truncated
    assert dead_letter == value


async def test_a_dead_letter_the_topic_still_refuses_is_cut_to_what_it_takes(
    big_stack: Stack,
) -> None:
    """The dead-letter topic set back to Kafka's default limit (by hand, after
    creation): the broker refuses the whole record, the worker says so at start
    and sends its first ~1 MB with ``dlq.truncated``."""
    names = big_stack.names
    admin = AIOKafkaAdminClient(bootstrap_servers=big_stack.bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    names.dead_letters,
                    configs={"max.message.bytes": "1048588"},
                )
            ]
        )
    finally:
        await admin.close()

    async def applied() -> None:
        configs = await describe_topic_configs(big_stack.bootstrap, [names.dead_letters])
        assert configs[names.dead_letters]["max.message.bytes"] == "1048588"

    await eventually(applied, timeout=30, what="the smaller limit applied")
    value = two_megabytes()
    headers, dead_letter = await _dead_letter_of(big_stack, value)
    assert headers.truncated
    assert dead_letter == value[: FALLBACK_REQUEST_BYTES - REQUEST_OVERHEAD_BYTES]
    log = big_stack.workers[0].log_text()
    assert "accepts records up to 1048588 bytes" in log
    assert "the broker refused the dead letter" in log
