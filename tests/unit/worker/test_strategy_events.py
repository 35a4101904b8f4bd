"""The clip-archive event of a compaction the strategies made: which strategies
ran and what each freed, the kept messages as the model now sees them, the
clip-archive that stays; an event without strategies is written as before."""

from __future__ import annotations

import json

import pytest

from core.domain.strategies import ReplacedMessage, StrategyFreed
from streams.events import CompactionCommand
from streams.worker.compaction_events import clip_archive_event
from tests.support.builders import T0
from tests.support.plans import CONV, clip, make_plan, msg

pytestmark = pytest.mark.unit


def command() -> CompactionCommand:
    return CompactionCommand(compaction_id="cmp-2", conversation_id=CONV, generation=1,
                             issued_at=T0)  # fmt: skip


def test_the_event_names_the_strategies_and_the_replaced_messages() -> None:
    earlier = clip("cmp-1").as_clip_archive()
    history = [earlier, msg(1, "a large tool result", role="tool", tool_call_id="c1"), msg(2)]
    freed = StrategyFreed(strategy="clear_tool_results", messages=1, tokens_freed=900)
    replaced = ReplacedMessage(id=history[1].id, content="[tool result cleared: …]", tokens=9,
                               strategy="clear_tool_results")  # fmt: skip
    plan = make_plan("cmp-2", [], []).model_copy(
        update={"clip_archive": None, "replaced": (replaced,), "strategies": (freed,)}
    )
    event = clip_archive_event(command(), history, plan, T0)
    assert event.clip_archive is not None and event.clip_archive.id == earlier.id
    assert event.kept_message_ids == tuple(m.id for m in history)
    assert event.strategies == (freed,)
    (shown,) = event.replaced_messages
    assert (shown.id, shown.content) == (history[1].id, "[tool result cleared: …]")
    written = json.loads(event.to_json())
    assert written["strategies"][0]["tokens_freed"] == 900


def test_an_event_without_strategies_leaves_their_fields_out() -> None:
    history = [msg(1), msg(2)]
    event = clip_archive_event(command(), history, make_plan("cmp-2", [], [history[0].id]), T0)
    written = json.loads(event.to_json())
    assert "strategies" not in written and "replaced_messages" not in written
