"""The clip-archive: the system message that stands in for compressed history.

It shows the first ``clip_first`` and last ``clip_last`` summary batches and
points at ``memory_read`` for the ones in between (context-compaction.AC3).
The format is the seeds' to the letter; ``parse_clip_archive`` inverts it so
downstream consumers and the next compaction can read one back.

A batch whose content itself contains a line that looks like a batch header
or section heading cannot be told apart from the structure; summaries do not
contain such lines in practice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict

from core.domain.compaction import SummaryBatch
from core.domain.messages import CLIP_ARCHIVE_ID_PREFIX, ConversationMessage

CLIP_ARCHIVE_PREFIX = "[Context Summary"
HEADER_TEMPLATE = (
    "[Context Summary — {messages} messages compressed across {cycles} compaction cycles]"
)
EARLIEST_HEADING = "## Earliest context"
RECENT_HEADING = "## Recent context"
OMISSION_TEMPLATE = "[... {count} earlier summaries omitted, searchable via memory_read ...]"
SHORTENED_NOTE = "[... summary shortened to fit the context budget, in full via memory_read ...]"

_HEADER_RE = re.compile(
    r"^\[Context Summary — (\d+) messages compressed across (\d+) compaction cycles\]$"
)
_BATCH_RE = re.compile(r"^\[Batch (\d+) — depth (\d+), (\S+) to (\S+)\]$")
_OMISSION_RE = re.compile(
    r"^\[\.\.\. (\d+) earlier summaries omitted, searchable via memory_read \.\.\.\]$"
)


class ClipArchiveFormatError(ValueError):
    pass


def is_clip_archive(message: ConversationMessage) -> bool:
    """Whether the service stored (or made) this message as a clip-archive: a fact
    the store sets from its own rows (``ConversationMessage.stored_clip_archive``),
    never the text. A producer's system message that starts with
    ``[Context Summary`` is a message like any other: compressed, never taken for
    the previous summary, so text it carries never gains a summary's standing."""
    return message.role == "system" and message.stored_clip_archive


def format_timestamp(moment: datetime) -> str:
    """UTC, millisecond precision, ``Z`` suffix: what JavaScript's toISOString gives."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def batch_label(conversation_id: str, end_time: datetime) -> str:
    """``compaction-batch-{conversationId}-{timestamp}`` (context-compaction.AC4.2)."""
    return f"compaction-batch-{conversation_id}-{format_timestamp(end_time)}"


MAX_DAYS_LISTED = 8
_COVERS_RE = re.compile(r"^\(covers \d+ days?: .*\)$")


def covered_days(moments: Iterable[datetime]) -> tuple[date, ...]:
    """The distinct UTC calendar days of ``moments``, ascending."""
    return tuple(sorted({m.astimezone(UTC).date() for m in moments}))


def covers_line(batch: SummaryBatch) -> str | None:
    """``(covers 3 days: 2026-01-04, 2026-03-10, 2026-08-21)`` when the batch's
    messages come from some of the days of its time range only: importance-ordered
    chunks can span months while covering a few days."""
    days = batch.days
    if not days:
        return None
    span = (batch.end_time.astimezone(UTC).date() - batch.start_time.astimezone(UTC).date()).days
    if len(days) == span + 1:
        return None  # every day of the range: the range says it
    listed = ", ".join(d.isoformat() for d in days[:MAX_DAYS_LISTED])
    more = f" and {len(days) - MAX_DAYS_LISTED} more" if len(days) > MAX_DAYS_LISTED else ""
    return f"(covers {len(days)} day{'s' if len(days) > 1 else ''}: {listed}{more})"


def _format_batch(number: int, batch: SummaryBatch) -> str:
    start, end = format_timestamp(batch.start_time), format_timestamp(batch.end_time)
    header = f"[Batch {number} — depth {batch.depth}, {start} to {end}]"
    covers = covers_line(batch)
    if covers is not None:
        header += "\n" + covers
    return f"{header}\n{batch.content}"


def build_clip_archive(
    batches: Sequence[SummaryBatch],
    *,
    clip_first: int,
    clip_last: int,
    messages_compressed: int,
    cycles: int,
) -> str:
    total = len(batches)
    numbered = list(enumerate(batches, start=1))
    if total <= clip_first + clip_last:
        earliest, omitted, recent = numbered[:clip_first], 0, numbered[clip_first:]
    else:
        earliest = numbered[:clip_first]
        recent = numbered[total - clip_last :] if clip_last else []
        omitted = total - clip_first - clip_last

    sections = [HEADER_TEMPLATE.format(messages=messages_compressed, cycles=cycles)]
    if earliest:
        sections.append(EARLIEST_HEADING)
        sections.extend(_format_batch(n, b) for n, b in earliest)
    if omitted:
        sections.append(OMISSION_TEMPLATE.format(count=omitted))
    if recent:
        sections.append(RECENT_HEADING)
        sections.extend(_format_batch(n, b) for n, b in recent)
    return "\n\n".join(sections)


def shortened(content: str, keep_chars: int) -> str:
    """The first ``keep_chars`` of a batch's text and a note that the rest is in
    archival memory: what the clip-archive shows of a summary the model wrote
    longer than the room the context budget leaves for it."""
    kept = content[: max(0, keep_chars)].rstrip()
    return f"{kept}\n{SHORTENED_NOTE}" if kept else SHORTENED_NOTE


class ShownBatch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int
    depth: int
    start_time: AwareDatetime
    end_time: AwareDatetime
    content: str
    covers: str | None = None  # the "(covers N days: …)" line, when the batch has one


class ParsedClipArchive(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    messages_compressed: int
    cycles: int
    earliest: tuple[ShownBatch, ...]
    omitted: int
    recent: tuple[ShownBatch, ...]

    @property
    def shown(self) -> tuple[ShownBatch, ...]:
        return self.earliest + self.recent

    @property
    def total_batches(self) -> int:
        return len(self.earliest) + self.omitted + len(self.recent)


def parse_clip_archive(text: str) -> ParsedClipArchive:
    lines = text.split("\n")
    header = _HEADER_RE.match(lines[0]) if lines else None
    if header is None:
        raise ClipArchiveFormatError("not a clip-archive: the first line is not its header")
    reader = _SectionReader()
    for line in lines[1:]:
        reader.read(line)
    reader.close_batch()
    return ParsedClipArchive(
        messages_compressed=int(header.group(1)),
        cycles=int(header.group(2)),
        earliest=tuple(reader.earliest),
        omitted=reader.omitted,
        recent=tuple(reader.recent),
    )


@dataclass
class _SectionReader:
    """The lines after the header, one at a time: sections, batches and the omission."""

    earliest: list[ShownBatch] = field(default_factory=list)
    recent: list[ShownBatch] = field(default_factory=list)
    omitted: int = 0
    section: list[ShownBatch] | None = None
    open_batch: tuple[re.Match[str], list[str]] | None = None

    def read(self, line: str) -> None:
        if line == EARLIEST_HEADING:
            self.close_batch()
            self.section = self.earliest
        elif line == RECENT_HEADING:
            self.close_batch()
            self.section = self.recent
        elif (omission := _OMISSION_RE.match(line)) is not None:
            self.close_batch()
            self.omitted = int(omission.group(1))
        elif (batch := _BATCH_RE.match(line)) is not None:
            self.close_batch()
            self.open_batch = (batch, [])
        elif self.open_batch is not None:
            self.open_batch[1].append(line)
        elif line.strip():
            raise ClipArchiveFormatError(f"unexpected line outside a batch: {line[:80]!r}")

    def close_batch(self) -> None:
        if self.open_batch is None:
            return
        match, body = self.open_batch
        if self.section is None:
            raise ClipArchiveFormatError(f"batch {match.group(1)} outside any section")
        while body and body[-1] == "":
            body.pop()  # the blank line that separates blocks
        covers = body.pop(0) if body and _COVERS_RE.match(body[0]) else None
        self.section.append(
            ShownBatch(
                number=int(match.group(1)),
                depth=int(match.group(2)),
                start_time=datetime.fromisoformat(match.group(3)),
                end_time=datetime.fromisoformat(match.group(4)),
                content="\n".join(body),
                covers=covers,
            )
        )
        self.open_batch = None


def clip_archive_message(
    *, conversation_id: str, compaction_id: str, content: str, created_at: datetime
) -> ConversationMessage:
    """The clip-archive as a system message (context-compaction.AC3.3).

    Its id derives from the compaction id so a retried compaction inserts the
    same row, not a second one.
    """
    return ConversationMessage(
        id=f"{CLIP_ARCHIVE_ID_PREFIX}{compaction_id}",
        conversation_id=conversation_id,
        role="system",
        content=content,
        created_at=created_at,
    ).as_clip_archive()
