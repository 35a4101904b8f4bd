"""Records as the worker's components see them, and turning their bytes into events.

Components take a ``Record`` rather than a Faust event, so they can be driven
from a unit test, the offline CLI or a benchmark without a broker. Every way
a record can be unusable raises ``InvalidRecord`` with a reason a person can
act on; the dead-letter policy turns it into a dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from core.domain.messages import INVALID_TEXT, reserved_id_problem, text_problem
from streams.events import (
    CONTROL_EVENT,
    AnyControl,
    CompactionCommand,
    EraseRequest,
    MessageEvent,
)

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    # When it was published, seconds since the epoch: the producer's clock (or
    # the broker's, for a topic with LogAppendTime). Paces compactions.
    timestamp: float | None = None

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None when absent)."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


def headers_of(raw: Any) -> Headers:
    """Kafka headers as pairs, whichever shape the client gave (a list or a mapping)."""
    if not raw:
        return ()
    items = raw.items() if hasattr(raw, "items") else raw
    return tuple((str(name), bytes(value or b"")) for name, value in items)


def record_of(event: Any) -> Record:
    """The ``Record`` of a Faust event (``faust.EventT``)."""
    message = event.message
    return Record(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=None if event.key is None else bytes(event.key),
        value=None if event.value is None else bytes(event.value),
        headers=headers_of(message.headers),
        timestamp=message.timestamp or None,
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
    """The record's ``MessageEvent``. Text no store can hold (a NUL, a lone surrogate,
    in any text field) is ``invalid_text``; tool-call arguments longer serialised
    than ``max_content_chars`` are ``oversized_arguments``; a ``message_id`` the
    service makes itself (``clip-archive-…``, ``provisional-…``) is ``reserved_id``."""
    key = decode_key(record)
    try:
        parsed = MessageEvent.model_validate_json(record.value or b"")
    except ValidationError as error:
        types = {item["type"] for item in error.errors()}
        reason = describe_validation_error(error)
        if INVALID_TEXT in types:
            kind = INVALID_TEXT
        elif _unstorable_text(record.value or b""):
            # A lone surrogate (which the validator's parser calls invalid JSON), or a
            # NUL in a field whose own check came first (role, tenant_id).
            kind = INVALID_TEXT
            reason = f"a string holds a NUL character or a lone surrogate ({reason})"
        else:
            kind = "invalid_json" if "json_invalid" in types else "invalid_event"
        raise InvalidRecord(reason, kind) from None
    if len(parsed.content) > max_content_chars:
        raise InvalidRecord(
            f"content has {len(parsed.content)} characters; the limit is {max_content_chars} "
            "([service].max_content_chars)",
            "oversized",
        )
    arguments = arguments_size(parsed)
    if arguments > max_content_chars:
        raise InvalidRecord(
            f"tool-call arguments have {arguments} characters serialised; the limit is "
            f"{max_content_chars} ([service].max_content_chars)",
            "oversized_arguments",
        )
    check_key(key, parsed.conversation_id)
    reserved = reserved_id_problem(parsed.message_id)
    if reserved is not None:
        # A clip-archive's id in the kept part would fail every apply of the
        # conversation's compaction on the unique key (issue 29).
        raise InvalidRecord(reserved, "reserved_id")
    return parsed


def arguments_size(event: MessageEvent) -> int:
    """The characters of the event's tool-call arguments, serialised as the store keeps them."""
    return sum(
        len(json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False))
        for call in event.tool_calls or ()
    )


def _unstorable_text(value: bytes) -> bool:
    """Whether a record the validator refused is JSON holding, in any key or string,
    a NUL or a lone surrogate (``"\\ud800"``, which the validator's parser refuses
    as invalid JSON; Python's accepts it). Only on that error path."""
    try:
        data = json.loads(value)
    except ValueError:
        return False
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if text_problem(item) is not None:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


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


def decode_erase(record: Record) -> EraseRequest:
    """An erase request from the erase-requests topic (schema version 2)."""
    return _decode_keyed(record, EraseRequest.model_validate_json)


def decode_command(record: Record) -> CompactionCommand:
    return _decode_keyed(record, CompactionCommand.model_validate_json)
