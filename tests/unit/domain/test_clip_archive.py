from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.clip_archive import (
    ClipArchiveFormatError,
    build_clip_archive,
    clip_archive_message,
    format_timestamp,
    is_clip_archive,
    parse_clip_archive,
)
from core.domain.compaction import SummaryBatch

pytestmark = pytest.mark.unit

T = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def batch(i: int, depth: int = 0) -> SummaryBatch:
    return SummaryBatch(
        content=f"summary {i + 1}",
        depth=depth,
        start_time=T + timedelta(hours=i),
        end_time=T + timedelta(hours=i, minutes=30),
        message_count=10,
    )


def test_shows_first_and_last_batches__context_compaction_AC3_1() -> None:
    text = build_clip_archive(
        [batch(i) for i in range(6)], clip_first=2, clip_last=2, messages_compressed=60, cycles=3
    )
    for shown in ("summary 1", "summary 2", "summary 5", "summary 6"):
        assert shown in text
    for hidden in ("summary 3", "summary 4"):
        assert hidden not in text
    parsed = parse_clip_archive(text)
    assert [b.number for b in parsed.earliest] == [1, 2]
    assert [b.number for b in parsed.recent] == [5, 6]


def test_omission_line_counts_and_hints_memory_read__context_compaction_AC3_2() -> None:
    text = build_clip_archive(
        [batch(i) for i in range(6)], clip_first=2, clip_last=2, messages_compressed=60, cycles=3
    )
    assert "[... 2 earlier summaries omitted, searchable via memory_read ...]" in text
    assert parse_clip_archive(text).omitted == 2


def test_all_batches_shown_without_separator_when_few__context_compaction_AC3_4() -> None:
    text = build_clip_archive(
        [batch(i) for i in range(3)], clip_first=2, clip_last=2, messages_compressed=30, cycles=1
    )
    assert "omitted" not in text
    assert all(f"summary {i}" in text for i in (1, 2, 3))
    assert parse_clip_archive(text).total_batches == 3


def test_exact_seed_format() -> None:
    text = build_clip_archive(
        [batch(0, depth=1)], clip_first=2, clip_last=2, messages_compressed=12, cycles=2
    )
    assert text == (
        "[Context Summary — 12 messages compressed across 2 compaction cycles]\n\n"
        "## Earliest context\n\n"
        "[Batch 1 — depth 1, 2026-03-01T09:30:00.000Z to 2026-03-01T10:00:00.000Z]\n"
        "summary 1"
    )


def test_clip_archive_message_is_a_system_message__context_compaction_AC3_3() -> None:
    text = build_clip_archive(
        [batch(0)], clip_first=1, clip_last=1, messages_compressed=10, cycles=1
    )
    msg = clip_archive_message(conversation_id="c", compaction_id="k", content=text, created_at=T)
    assert msg.role == "system" and is_clip_archive(msg)
    assert msg.id == "clip-archive-k"


def test_timestamps_are_utc_milliseconds() -> None:
    from zoneinfo import ZoneInfo

    local = datetime(2026, 3, 1, 10, 30, 0, 123456, tzinfo=ZoneInfo("Europe/Berlin"))
    assert format_timestamp(local) == "2026-03-01T09:30:00.123Z"


def test_parser_rejects_non_clip_archives() -> None:
    with pytest.raises(ClipArchiveFormatError):
        parse_clip_archive("hello")
    with pytest.raises(ClipArchiveFormatError):
        parse_clip_archive(
            "[Context Summary — 1 messages compressed across 1 compaction cycles]\n\nstray text"
        )


_SAFE_LINE = st.text(
    alphabet=st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters="\n\r"),
    max_size=40,
).filter(lambda s: not s.startswith(("[", "##")))
_CONTENT = (
    st.lists(_SAFE_LINE, min_size=1, max_size=4)
    .map("\n".join)
    .filter(lambda s: s.strip() != "" and not s.endswith("\n"))
)
_MOMENT = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))


@st.composite
def batches(draw: st.DrawFn) -> list[SummaryBatch]:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        start = draw(_MOMENT)
        out.append(
            SummaryBatch(
                content=draw(_CONTENT).rstrip("\n") or "x",
                depth=draw(st.integers(0, 5)),
                start_time=start,
                end_time=start + timedelta(milliseconds=draw(st.integers(0, 10**9))),
                message_count=draw(st.integers(0, 500)),
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(0, 5), st.integers(0, 5), st.integers(0, 10**6), st.integers(0, 1000))
def test_parser_inverts_builder(
    items: list[SummaryBatch], clip_first: int, clip_last: int, compressed: int, cycles: int
) -> None:
    text = build_clip_archive(
        items,
        clip_first=clip_first,
        clip_last=clip_last,
        messages_compressed=compressed,
        cycles=cycles,
    )
    parsed = parse_clip_archive(text)
    assert (parsed.messages_compressed, parsed.cycles) == (compressed, cycles)
    assert parsed.total_batches == len(items)
    for shown in parsed.shown:
        original = items[shown.number - 1]
        assert (shown.content, shown.depth) == (original.content, original.depth)
        assert (shown.start_time, shown.end_time) == (original.start_time, original.end_time)
    if len(items) > clip_first + clip_last:
        assert [b.number for b in parsed.earliest] == list(range(1, clip_first + 1))
        assert len(parsed.recent) == clip_last
    else:
        assert len(parsed.shown) == len(items)
