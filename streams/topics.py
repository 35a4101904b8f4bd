"""Topic names. Every topic is keyed by conversation id and has the same
partition count, so one conversation is always handled by one worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TopicNames:
    messages: str  # in: MessageEvent (from chat platforms)
    commands: str  # internal: CompactionCommand
    control: str  # internal: CompactionCompleted | ReconcileRequest
    clip_archives: str  # out: ClipArchiveEvent
    dead_letters: str  # out: original bytes + dlq.* headers

    @classmethod
    def with_prefix(cls, prefix: str) -> TopicNames:
        return cls(
            messages=f"{prefix}messages",
            commands=f"{prefix}compaction-commands",
            control=f"{prefix}accounting-control",
            clip_archives=f"{prefix}clip-archives",
            dead_letters=f"{prefix}dead-letters",
        )

    def logical(self, name: str) -> str:
        """Map an outbox row's logical topic ("clip_archives", "control") to its name."""
        value = getattr(self, name, None)
        if not isinstance(value, str):
            raise KeyError(f"unknown logical topic {name!r}")
        return value
