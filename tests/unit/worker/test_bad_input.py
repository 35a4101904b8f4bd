"""Records no store can hold are refused at the door, at once.

Why: a NUL in a message used to pass validation; PostgreSQL refused it, and
the worker retried it as an unknown error (five times for the group, five
alone): about 12 s of a stalled partition per such record. Now text with a
NUL or a lone surrogate anywhere in a message event is ``invalid_text``,
oversized tool-call arguments are ``oversized_arguments``, and data the store
refuses anyway (``StoreRejected``) is dead-lettered without a single retry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from core.domain.messages import INVALID_TEXT, ConversationMessage, ToolCall, text_problem
from core.ports.storage import FreeSaved, IncomingMessage, StoreRejected
from streams.dead_letter_headers import DeadLetterHeaders
from streams.events import MessageEvent
from streams.worker.records import InvalidRecord, Record, decode_message
from tests.support.builders import T0
from tests.support.stores import round_trips
from tests.unit.worker.harness import NAMES, Harness, harness

pytestmark = pytest.mark.unit

STORABLE = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))
BAD_CHARS = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"])


@st.composite
def unstorable(draw: st.DrawFn) -> str:
    """Any text with at least one NUL or lone surrogate somewhere in it."""
    head, tail = draw(STORABLE), draw(st.text())
    return head + draw(BAD_CHARS) + tail


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "message_id": "m1",
        "conversation_id": "c1",
        "role": "assistant",
        "content": "hello",
        "created_at": T0.isoformat(),
    }
    base.update(fields)
    return base


def record(value: bytes | str, key: bytes = b"c1") -> Record:
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return Record(NAMES.messages, 0, 0, key, raw)


def decode_error(value: bytes | str, key: bytes = b"c1", limit: int = 10_000) -> InvalidRecord:
    with pytest.raises(InvalidRecord) as caught:
        decode_message(record(value, key), limit)
    return caught.value


@given(unstorable())
@settings(max_examples=200)
def test_any_text_with_a_nul_or_a_lone_surrogate_is_refused(text: str) -> None:
    assert text_problem(text) is not None
    with pytest.raises(ValidationError) as caught:
        MessageEvent.model_validate(event(content=text))
    assert caught.value.errors()[0]["type"] == INVALID_TEXT


@given(STORABLE)
@settings(max_examples=200)
def test_any_other_text_is_accepted(text: str) -> None:
    assert text_problem(text) is None
    assert MessageEvent.model_validate(event(content=text)).content == text


@given(unstorable(), st.sampled_from(["key", "value", "nested", "list"]))
@settings(max_examples=100)
def test_tool_call_arguments_are_checked_at_any_depth(text: str, where: str) -> None:
    arguments: dict[str, Any] = {
        "key": {text: 1},
        "value": {"a": text},
        "nested": {"a": {"b": [{"c": text}]}},
        "list": {"a": [1, [2, [text]]]},
    }[where]
    with pytest.raises(ValidationError) as caught:
        ToolCall(id="t1", name="run", arguments=arguments)
    assert caught.value.errors()[0]["type"] == INVALID_TEXT


@pytest.mark.parametrize(
    "fields",
    [
        {"content": "a\x00b"},
        {"message_id": "m\x00"},
        {"conversation_id": "c\x00"},  # the key names it too: the text check comes first
        {"role": "user\x00"},
        {"tool_call_id": "t\x00", "role": "tool"},
        {"tenant_id": "acme\x00"},
        {"tool_calls": [{"id": "t\x00", "name": "run", "arguments": {}}]},
        {"tool_calls": [{"id": "t", "name": "r\x00un", "arguments": {}}]},
        {"tool_calls": [{"id": "t", "name": "run", "arguments": {"a": [{"b\x00": 1}]}}]},
        {"tool_calls": [{"id": "t", "name": "run", "arguments": {"a": {"b": "x\x00"}}}]},
    ],
    ids=lambda fields: next(iter(fields)) + ":" + json.dumps(fields)[-30:],
)
def test_a_nul_in_any_field_of_the_wire_event_is_invalid_text(fields: dict[str, Any]) -> None:
    key = b"c\x00" if "conversation_id" in fields else b"c1"
    assert decode_error(json.dumps(event(**fields)), key).error_type == INVALID_TEXT


def test_a_lone_surrogate_escape_on_the_wire_is_invalid_text_not_invalid_json() -> None:
    value = json.dumps(event(content="x")).replace('"x"', '"x\\ud800y"')
    error = decode_error(value)
    assert error.error_type == INVALID_TEXT and "lone surrogate" in error.reason
    paired = json.dumps(event(content="x")).replace('"x"', '"\\ud83d\\ude00"')  # an emoji
    assert decode_message(record(paired), 100).content == "\N{GRINNING FACE}"
    assert decode_error(b'{"message_id": ').error_type == "invalid_json"


def test_tool_call_arguments_are_bounded_by_max_content_chars() -> None:
    call = {"id": "t", "name": "run", "arguments": {"blob": "x" * 100}}
    value = json.dumps(event(content="", tool_calls=[call]))
    error = decode_error(value, limit=100)
    assert error.error_type == "oversized_arguments"
    assert "max_content_chars" in error.reason and "100" in error.reason
    assert decode_message(record(value), 200).tool_calls is not None


def test_the_stored_message_model_refuses_unstorable_text_too() -> None:
    with pytest.raises(ValidationError):
        ConversationMessage(id="m", conversation_id="c", role="user", content="\x00", created_at=T0)


def dead_letter_types(h: Harness) -> list[str]:
    return [
        DeadLetterHeaders.from_kafka(list(p.headers)).error_type
        for p in h.publisher.on("dead_letters")
    ]


def message_record(h: Harness, index: int, content: str) -> Record:
    value = json.dumps(event(message_id=f"m{index}", content=content), ensure_ascii=False)
    return h.record(NAMES.messages, "c1", value.encode("utf-8", "surrogatepass"))


async def test_a_nul_record_is_dead_lettered_at_once_and_its_group_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = harness()
    group = [message_record(h, 0, "before"), message_record(h, 1, "a\x00b")]
    group.append(message_record(h, 2, "after"))
    trips = round_trips(h.store, monkeypatch)
    await h.components.accounting.handle_batch(group)
    assert dead_letter_types(h) == [INVALID_TEXT]
    assert h.store.message_ids("c1") == ["m0", "m2"]
    # At once: caught before the store, so the group goes in one round trip, unsplit.
    assert h.slept == [] and trips.count("ingest.save_free") == 1


async def test_data_the_store_rejects_is_dead_lettered_without_a_single_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``StoreRejected``: the group is split once to find the culprit, the culprit is
    dead-lettered, the others are stored, and nothing waits."""
    h = harness()
    save = h.store.ingest.save_free
    tries: list[int] = []  # the size of every group the store was asked to take

    async def refusing(batch: Sequence[IncomingMessage]) -> FreeSaved:
        tries.append(len(batch))
        if any("poison" in incoming.message.content for incoming in batch):
            raise StoreRejected("PostgreSQL refused the data (CharacterNotInRepertoireError)")
        return await save(batch)

    monkeypatch.setattr(h.store.ingest, "save_free", refusing)
    group = [message_record(h, 0, "fine"), message_record(h, 1, "poison")]
    group.append(message_record(h, 2, "fine too"))
    await h.components.accounting.handle_batch(group)
    assert dead_letter_types(h) == ["store_rejected"]
    (letter,) = h.publisher.on("dead_letters")
    assert (
        "CharacterNotInRepertoireError" in DeadLetterHeaders.from_kafka(list(letter.headers)).reason
    )
    assert h.store.message_ids("c1") == ["m0", "m2"]
    assert h.slept == []  # no backoff: retrying gives the same answer
    assert tries == [3, 1, 1, 1]  # the group, then each alone once

    alone = message_record(h, 3, "poison again")
    await h.components.accounting.handle_batch([alone])
    assert dead_letter_types(h) == ["store_rejected"] * 2 and h.slept == []


async def test_an_outage_is_still_waited_out() -> None:
    h = harness()
    h.store.fail_times("save_free", 2)
    await h.components.accounting.handle_batch([message_record(h, 0, "fine")])
    assert h.store.message_ids("c1") == ["m0"] and len(h.slept) == 2
    assert dead_letter_types(h) == []


async def test_a_record_with_fields_this_version_does_not_know_is_stored_not_dead_lettered() -> (
    None
):
    """Forward compatible: a producer that adds a field keeps its messages flowing."""
    h = harness()
    newer = event(sentiment="calm", tool_calls=[{"id": "t", "name": "n", "extra": 1}])
    await h.components.accounting.handle_batch(
        [h.record(NAMES.messages, "c1", json.dumps(newer).encode())]
    )
    assert h.store.message_ids("c1") == ["m1"]
    assert dead_letter_types(h) == []
