"""Records as the worker's components see them, and turning their bytes into events.

Components take a ``Record`` rather than a Faust event, so they can be driven
from a unit test, the offline CLI or a benchmark without a broker. Every way
a record can be unusable raises ``InvalidRecord`` with a reason a person can
act on; the dead-letter policy turns it into a dead letter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from streams.events import (
    CONTROL_EVENT,
    AnyControl,
    CompactionCommand,
    MessageEvent,
)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def record_of(event: Any) -> Record:
    """The ``Record`` of a Faust event (``faust.EventT``)."""
    message = event.message
    return Record(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=None if event.key is None else bytes(event.key),
        value=None if event.value is None else bytes(event.value),
    )


class InvalidRecord(Exception):
    """A record the service cannot use; it goes to the dead-letter topic."""

    def __init__(self, reason: str, error_type: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(record)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def decode_key(record: Record) -> str:
    if not record.key:
        raise InvalidRecord("record has no key; it must be the conversation id", "missing_key")
    try:
        return record.key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecord("record key is not UTF-8", "bad_key") from None


def check_key(key: str, conversation_id: str) -> None:
    if key != conversation_id:
        # A wrong key puts the record on another conversation's partition,
        # whose worker does not own this conversation's table entry.
        raise InvalidRecord(
            f"record key {key[:80]!r} is not its conversation_id {conversation_id[:80]!r}",
            "key_mismatch",
        )


def decode_message(record: Record, max_content_chars: int) -> MessageEvent:
    key = decode_key(record)
    try:
        parsed = MessageEvent.model_validate_json(record.value or b"")
    except ValidationError as error:
        kind = "invalid_json" if error.errors()[0]["type"] == "json_invalid" else "invalid_event"
        raise InvalidRecord(describe_validation_error(error), kind) from None
    if len(parsed.content) > max_content_chars:
        raise InvalidRecord(
            f"content has {len(parsed.content)} characters; the limit is {max_content_chars} "
            "([service].max_content_chars)",
            "oversized",
        )
    check_key(key, parsed.conversation_id)
    return parsed


class _Keyed(Protocol):
    @property
    def conversation_id(self) -> str: ...


K = TypeVar("K", bound=_Keyed)


def _decode_keyed(record: Record, parse: Callable[[bytes], K]) -> K:
    """An internal event: valid JSON of its model, keyed by its conversation id."""
    key = decode_key(record)
    try:
        event = parse(record.value or b"")
    except ValidationError as error:
        raise InvalidRecord(describe_validation_error(error), "invalid_event") from None
    check_key(key, event.conversation_id)
    return event


def decode_control(record: Record) -> AnyControl:
    return _decode_keyed(record, CONTROL_EVENT.validate_json)


def decode_command(record: Record) -> CompactionCommand:
    return _decode_keyed(record, CompactionCommand.model_validate_json)
