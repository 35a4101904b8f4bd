"""The pieces of ``replay`` and ``tail`` that need no broker: reading a transcript,
the progress report, the one-line summary, and failing before Kafka is touched."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core.domain.messages import ConversationMessage
from streams import cli
from streams.cli.replay import Progress, read_events
from streams.cli.tail import summarise
from streams.events import BatchInfo, ClipArchiveEvent, MessageEvent

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def event_line(n: int, conversation: str = "c1", **changes: object) -> str:
    data = {
        "message_id": f"m{n}",
        "conversation_id": conversation,
        "role": "user",
        "content": f"hello {n}",
        "created_at": (T0 + timedelta(minutes=n)).isoformat(),
    } | changes
    return json.dumps(data)


def test_read_events_collects_every_bad_line_with_its_number_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        "\n".join(
            [
                event_line(1),
                event_line(2, role="robot"),
                "",
                event_line(3, created_at="2026-11-20T09:00:00"),  # naive time
                event_line(4, extra="x"),  # a field v1 does not know: ignored (docs/events)
                "nope",
            ]
        )
    )
    transcript = read_events(path)
    assert [e.message_id for e in transcript.events] == ["m1", "m4"]
    assert [(b.number, b.field) for b in transcript.bad] == [
        (2, "role"),
        (4, "created_at"),
        (6, "(line)"),
    ]
    assert str(transcript.bad[0]).startswith(f"{path}:2: role: ")


def test_replay_of_a_bad_file_fails_before_any_kafka_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPACTOR_CONFIG", raising=False)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # would fail if used
    path = tmp_path / "bad.jsonl"
    path.write_text(event_line(1) + "\n" + event_line(2, conversation_id="") + "\n")
    assert cli.main(["replay", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2: conversation_id: String should have at least 1 character" in err
    assert "nothing published" in err
    assert "Kafka" not in err


def test_replay_of_a_missing_file_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPACTOR_CONFIG", raising=False)
    assert cli.main(["replay", "missing.jsonl"]) == 1
    assert "missing.jsonl: no such file" in capsys.readouterr().err


def test_progress_on_a_terminal_redraws_one_bar() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    clock = iter([0.0, 0.0, 1.0, 2.0, 4.0])
    stream = Tty()
    progress = Progress(4, stream, clock=lambda: next(clock))
    for _ in range(3):
        progress.advance()
    progress.finish()
    text = stream.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "\rpublished [" + "#" * 7 + "-" * 23 + "] 1/4 (25%)  " in text
    assert text.rstrip().endswith("[" + "#" * 22 + "-" * 8 + "] 3/4 (75%, 0.8 msg/s)")


def test_progress_elsewhere_prints_plain_lines_now_and_then() -> None:
    clock = iter([0.0, 0.1, 1.0, 5.0, 6.0, 10.0])
    stream = io.StringIO()
    progress = Progress(10, stream, clock=lambda: next(clock))
    for _ in range(4):
        progress.advance()
    progress.finish()
    assert stream.getvalue().splitlines() == [
        "published 3/10 (30%, 0.6 msg/s)",
        "published 4/10 (40%, 0.4 msg/s)",
    ]
    assert "\r" not in stream.getvalue()


def test_summary_names_conversation_compaction_and_savings() -> None:
    event = ClipArchiveEvent(
        compaction_id="cmp-1",
        conversation_id="support-42",
        generation=2,
        clip_archive=ConversationMessage(
            id="clip-1", conversation_id="support-42", role="system", content="x", created_at=T0
        ),
        kept_message_ids=("m9",),
        compressed_message_ids=("m1", "m2"),
        batches=tuple(
            BatchInfo(
                id=f"b{depth}",
                label=f"compaction-batch-support-42-{depth}",
                depth=depth,
                start_time=T0,
                end_time=T0,
                message_count=1,
            )
            for depth in (0, 1)
        ),
        tokens_before=900,
        tokens_after=120,
        created_at=T0,
    )
    assert summarise(event) == (
        "2026-11-20 09:00:00 support-42 compaction cmp-1 (gen 2): 2 messages compressed, "
        "tokens 900 → 120, 2 batches (depths 0-1), 1 kept"
    )


def test_message_event_round_trips_as_replay_sends_it() -> None:
    event = MessageEvent.model_validate_json(event_line(1))
    assert MessageEvent.model_validate_json(event.model_dump_json()) == event
