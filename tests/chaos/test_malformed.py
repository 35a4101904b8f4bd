"""Scenario 6: malformed records of every kind the dead-letter table names, mixed
into good traffic, including multi-megabyte values and non-UTF-8 keys.

The messages topic's ``max.message.bytes`` is raised (8 MiB) so the broker
accepts the big ones, as an operator would for a producer that sends them;
the worker's own producer keeps its default request size, so their dead
letters must be truncated (``dlq.truncated``) rather than fail to send and
vanish. Every malformed record must reach the dead-letter topic with a
reason; no good message may be held up, lost or dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest

from tests.chaos.harness import BIG_MESSAGE_BYTES, SCALE, ChaosStack, MakeStack
from tests.chaos.workload import build_conversations, interleave
from tests.support.chaos_llm import ChaosLLMServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(SCALE.timeout)]

MAX_CONTENT = 20_000  # [service].max_content_chars here
MB = 1024 * 1024

Bad = tuple[bytes | None, bytes, tuple[str, ...], str]  # key, value, error types, what


def _event(message_id: str, conversation_id: str, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "schema_version": 1,
        "message_id": message_id,
        "conversation_id": conversation_id,
        "role": "user",
        "content": "hello",
        "created_at": "2026-06-01T08:00:00+00:00",
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


def malformed_records(n: int, owner: str, other: str, rng: random.Random) -> list[Bad]:
    """One of each kind; ``owner``/``other`` are real conversation ids, so bad
    records share partitions (and keys) with good traffic."""
    key = owner.encode()

    def js(**fields: Any) -> bytes:
        event = _event(f"bad-{n}-{rng.randrange(10**9)}", owner)
        event.update(fields)
        return json.dumps({k: v for k, v in event.items() if v is not None}).encode()

    return [
        (
            key,
            b'{"message_id": "bad-json", "conversation_id": ',
            ("invalid_json",),
            "truncated JSON",
        ),
        (key, b"\xff\xfe\x00 not utf-8 \x80\x81", ("invalid_json",), "non-UTF-8 value"),
        (key, b"", ("invalid_json",), "empty value"),
        (key, b"[1, 2, 3]", ("invalid_event",), "JSON array"),
        (key, js(role="wizard"), ("invalid_event",), "unknown role"),
        (key, js(content=None, created_at=None), ("invalid_event",), "missing fields"),
        (key, js(schema_version=2), ("invalid_event",), "schema_version 2"),
        (key, js(created_at="2026-06-01T08:00:00"), ("invalid_event",), "naive timestamp"),
        (key, js(message_id="x" * 300), ("invalid_event",), "id too long"),
        (key, js(tool_calls=[{"id": "", "name": ""}]), ("invalid_event",), "bad tool call"),
        (other.encode(), js(), ("key_mismatch",), "key of another conversation"),
        (b"k" * 5000, js(), ("key_mismatch",), "5000-byte key"),
        (None, js(), ("missing_key",), "null key"),
        (b"", js(), ("missing_key",), "empty key"),
        (b"\xff\xfe" + key, js(), ("bad_key",), "non-UTF-8 key"),
        (key, js(content="y" * (MAX_CONTENT + 1)), ("oversized",), "content over the limit"),
    ]


def big_records(count: int, owner: str, rng: random.Random) -> list[Bad]:
    """Multi-megabyte records (2-6 MB), each a different way of being wrong."""
    kinds: list[Bad] = []
    for i in range(count):
        size = (2 + (i * 4) // max(1, count - 1)) * MB if count > 1 else 3 * MB
        match i % 3:
            case 0:
                value = json.dumps(_event(f"big-{i}", owner, content="z" * size)).encode()
                kinds.append((owner.encode(), value, ("oversized",), f"{size // MB} MB content"))
            case 1:
                value = rng.randbytes(size)
                kinds.append((owner.encode(), value, ("invalid_json",), f"{size // MB} MB garbage"))
            case _:
                value = json.dumps(_event(f"big-{i}", owner, content="w" * size)).encode()
                kinds.append(
                    (b"\xc3\x28" + owner.encode(), value, ("bad_key",), f"{size // MB} MB, bad key")
                )
    return kinds


async def _send_bad(stack: ChaosStack, records: list[Bad], seconds: float) -> None:
    start = time.monotonic()
    for i, (key, value, types, what) in enumerate(records):
        due = start + seconds * i / max(1, len(records))
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # spread over the good traffic
        await stack.send_malformed(key, value, types, what)


async def test_malformed_records_are_dead_lettered_and_good_traffic_flows(
    make_stack: MakeStack, kafka_bootstrap: str, pg_database: str, chaos_llm: ChaosLLMServer
) -> None:
    chaos_llm.latency = (0.05, 0.2)
    stack = await make_stack(
        "malformed", kafka_bootstrap, pg_database, max_message_bytes=BIG_MESSAGE_BYTES
    )
    stack.configure({"service": {"max_content_chars": MAX_CONTENT}})
    stack.worker("w1")
    stack.worker("w2")
    await stack.wait_for_group()
    conversations = build_conversations(
        max(30, SCALE.conversations // 2), prefix=f"{stack.app_id}-c", seed=51
    )
    stack.add_conversations(conversations)
    events = interleave([c.events for c in conversations], seed=52)
    rng = random.Random(53)
    bad: list[Bad] = []
    for n in range(SCALE.malformed_copies):
        owner, other = rng.sample([c.id for c in conversations], 2)
        bad.extend(malformed_records(n, owner, other, rng))
    bad.extend(big_records(SCALE.big_records, rng.choice(conversations).id, rng))
    rng.shuffle(bad)
    seconds = 20.0
    window_start = time.monotonic()
    await asyncio.gather(stack.replay(events, seconds), _send_bad(stack, bad, seconds))
    fault_end = time.monotonic()
    stack.faults["malformed"] = len(bad)
    stack.faults["multi_megabyte"] = SCALE.big_records
    stack.notes["largest_record_bytes"] = max(len(v) for _, v, _, _ in bad)
    await stack.finish(fault_end, fault_window=fault_end - window_start)
