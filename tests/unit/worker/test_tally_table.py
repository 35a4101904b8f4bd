"""The table wrapper: tallies to the table's plain dicts and back."""

from __future__ import annotations

from typing import Any

import pytest

from core.domain.budget import BudgetConfig
from core.domain.tally import ConversationTally, OperatorRequest, on_message
from streams.worker.tally_table import TallyTable, read_tally, table_value

pytestmark = pytest.mark.unit


def test_the_tally_table_converts_both_ways_and_skips_empty_entries() -> None:
    raw: dict[str, Any] = {"gone": None}
    table = TallyTable(raw)
    tally = ConversationTally(conversation_id="c1", token_total=5, message_count=1)
    table.put(tally)
    assert "c1" not in raw  # cached until a flush
    assert table.flush(force=True) == 1
    assert raw["c1"] == table_value(tally)
    assert table.get("c1") == tally
    assert table.get("gone") is None and table.get("never") is None
    assert list(table.items()) == [("c1", tally)]
    table.delete("c1")
    table.delete("c1")  # deleting twice is fine: reconciliation and erasure may race
    assert "c1" not in raw


# The fields of the previous release's (0.2.0's) entries, which its workers read with
# extra="forbid": an entry with any other field fails every message of its
# conversation there (tests/chaos/test_upgrade.py found it).
PREVIOUS_RELEASE_FIELDS = {
    "conversation_id",
    "token_total",
    "message_count",
    "generation",
    "compactions",
    "outstanding",
    "outstanding_since",
    "stalled",
    "epoch",
}


def test_an_ordinary_entry_is_written_in_the_previous_release_shape() -> None:
    tally = ConversationTally(conversation_id="c1")
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        tally, _ = on_message(tally, 400, BudgetConfig(model_max_tokens=2000), now)
    assert tally.outstanding is not None  # over budget: a command went out
    assert set(table_value(tally)) <= PREVIOUS_RELEASE_FIELDS
    assert read_tally(table_value(tally)) == tally


def test_new_fields_are_written_only_when_they_hold_something() -> None:
    idle = BudgetConfig(model_max_tokens=2000, compact_at=0.9, idle_seconds=30.0)
    tally, _ = on_message(ConversationTally(conversation_id="c1"), 10, idle, 5.0)
    request = OperatorRequest(action="restore", request_id="r1", batch_id="b1")
    asked = tally.model_copy(update={"request": request, "queued": (request,)})
    assert set(table_value(asked)) - PREVIOUS_RELEASE_FIELDS == {
        "last_message_at",
        "request",
        "queued",
    }
    assert read_tally(table_value(asked)) == asked


def test_an_entry_of_the_next_release_is_read_without_its_new_fields() -> None:
    written = {"conversation_id": "c1", "token_total": 7, "message_count": 2, "later": [1]}
    raw: dict[str, Any] = {"c1": written}
    table = TallyTable(raw)
    expected = ConversationTally(conversation_id="c1", token_total=7, message_count=2)
    assert read_tally(written) == expected
    assert table.get("c1") == expected
    assert list(table.items()) == [("c1", expected)]
