"""The conversation message as every layer sees it.

Frozen so that a history handed to the compactor cannot be mutated behind its
back: a failed compaction must be able to return the very objects it got.

Every text field is ``Text``: a NUL character or a lone surrogate (neither of
which PostgreSQL's text or jsonb can store) fails validation with the error
type ``invalid_text``, so such a record is refused at the door instead of by
the database. Tool-call arguments are checked the same way, keys and string
values at any depth.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr
from pydantic_core import PydanticCustomError

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")

INVALID_TEXT = "invalid_text"
"""The validation error type (and dead-letter type) of text no store can hold."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (a NUL, a lone surrogate), or None.

    Found by ``str.find`` and the UTF-8 encoder (a str holds a surrogate code
    point only when it is unpaired: JSON's escaped pairs decode to the one astral
    character they stand for, and UTF-8 cannot encode a lone one), both C loops:
    0.04 ms for 1,000,000 ASCII characters, 1.1 ms for non-ASCII ones, where a
    regular expression's scan took 8 ms; every turn is checked on the event loop
    several times as it is decoded, stored and read back for a compaction."""
    nul = value.find("\x00")
    surrogate = -1
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            surrogate = error.start
    found = [at for at in (nul, surrogate) if at >= 0]
    if not found:
        return None
    what = "a NUL character" if min(found) == nul else "a lone surrogate"
    return f"contains {what} at position {min(found)}"


def checked_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise PydanticCustomError(INVALID_TEXT, "text {problem}", {"problem": problem})
    return value


def checked_json_text(value: Any) -> Any:
    """``value`` (JSON data) when no key or string in it, at any depth, is unstorable text."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            checked_text(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str):
                    checked_text(key)
                pending.append(inner)
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return value


Text = Annotated[str, AfterValidator(checked_text)]
"""A string PostgreSQL can store: no NUL, no lone surrogate."""

CLIP_ARCHIVE_ID_PREFIX = "clip-archive-"
"""The id of a compaction's clip-archive row: ``clip-archive-{compaction id}``."""
PROVISIONAL_ID_PREFIX = "provisional-"
"""The id of a provisional context message (``core.domain.context_fit``)."""
RESERVED_ID_PREFIXES = (CLIP_ARCHIVE_ID_PREFIX, PROVISIONAL_ID_PREFIX)
"""Message ids the service makes. A producer's message holding one would collide
with the service's own row (a clip-archive's insert failing on the unique key at
every attempt, blocking the conversation's compaction), so it is refused."""


def reserved_id_problem(message_id: str) -> str | None:
    """Why a producer may not use ``message_id`` (a service-made id's prefix), or None."""
    for prefix in RESERVED_ID_PREFIXES:
        if message_id.startswith(prefix):
            return (
                f"message_id starts with {prefix!r}, which the service reserves "
                "for its own messages"
            )
    return None


class ToolCall(BaseModel):
    """One tool invocation requested by an assistant turn."""

    # Unknown fields are ignored: messages arrive in events, which accept fields a
    # later version adds (docs/events/README.md, "Schema evolution").
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: Text = Field(min_length=1)
    name: Text = Field(min_length=1)
    arguments: Annotated[dict[str, Any], AfterValidator(checked_json_text)] = Field(
        default_factory=dict
    )


class ConversationMessage(BaseModel):
    # Unknown fields are ignored: messages arrive in events, which accept fields a
    # later version adds (docs/events/README.md, "Schema evolution").
    model_config = ConfigDict(frozen=True, extra="ignore")

    id: Text = Field(min_length=1)
    conversation_id: Text = Field(min_length=1)
    role: Role
    content: Text
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: Text | None = None
    created_at: AwareDatetime
    # Kept verbatim by every compaction (docs/memory.md, "Pinned messages"): sent
    # so by the producer, or pinned by an operator since. Left out of a dump
    # while false, so what the service wrote before it is written the same.
    pinned: bool = Field(default=False, exclude_if=lambda pinned: not pinned)

    # Whether the service itself stored this message as a clip-archive: set only
    # by a store reading back one of its clip-archive rows, or by the compactor
    # making one (``as_clip_archive``). Never read from input, never serialised:
    # a producer's message that merely looks like a summary stays a message.
    _clip_archive: bool = PrivateAttr(default=False)

    @property
    def stored_clip_archive(self) -> bool:
        return self._clip_archive

    def as_clip_archive(self, clip_archive: bool = True) -> ConversationMessage:
        """A copy marked as the service's own clip-archive (or, with False, unmarked)."""
        copy = self.model_copy()
        copy._clip_archive = clip_archive
        return copy
