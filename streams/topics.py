"""The service's topics, defined once.

Every topic is keyed by conversation id and has the same partition count, so
one conversation is always handled by one worker. Outbox rows name a topic by
its role ("clip_archives", "control") so the database never holds a prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

TopicRole = Literal[
    "messages",
    "commands",
    "control",
    "clip_archives",
    "dead_letters",
    "erasures",
    "erase_completions",
]

# role → (name without prefix, what it carries); the one place topics are listed.
TOPICS: dict[TopicRole, tuple[str, str]] = {
    "messages": ("messages", "in: message events"),
    "commands": ("compaction-commands", "internal: compaction commands"),
    "control": ("accounting-control", "internal: completions, reconcile requests"),
    "clip_archives": ("clip-archives", "out: clip-archive events"),
    "dead_letters": ("dead-letters", "out: dead letters"),
    "erasures": ("erase-requests", "in: erase requests (operators only)"),
    "erase_completions": ("erase-completions", "out: erase completions (ids and counts)"),
}


@dataclass(frozen=True)
class TopicNames:
    messages: str  # in: MessageEvent (from chat platforms)
    commands: str  # internal: CompactionCommand
    control: str  # internal: CompactionCompleted | ReconcileRequest
    clip_archives: str  # out: ClipArchiveEvent
    dead_letters: str  # out: original bytes + dlq.* headers
    erasures: str  # in: EraseRequest (operators only; the only way to erase)
    erase_completions: str  # out: EraseCompleted

    @classmethod
    def with_prefix(cls, prefix: str) -> TopicNames:
        return cls(**{role: f"{prefix}{suffix}" for role, (suffix, _) in TOPICS.items()})

    def all(self) -> list[str]:
        """Every topic name, in the order of ``TOPICS``."""
        return [getattr(self, f.name) for f in fields(self)]

    def described(self) -> dict[str, str]:
        """Topic name → what it carries."""
        return {getattr(self, role): about for role, (_, about) in TOPICS.items()}

    def logical(self, name: str) -> str:
        """Map an outbox row's logical topic ("clip_archives", "control") to its name."""
        if name not in TOPICS:
            raise KeyError(f"unknown logical topic {name!r}")
        value: str = getattr(self, name)
        return value
