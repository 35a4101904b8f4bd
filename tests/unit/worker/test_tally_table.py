"""The table wrapper: tallies to the table's plain dicts and back."""

from __future__ import annotations

from typing import Any

import pytest

from core.domain.accounting import ConversationTally
from streams.worker.tally_table import TallyTable

pytestmark = pytest.mark.unit


def test_the_tally_table_converts_both_ways_and_skips_empty_entries() -> None:
    raw: dict[str, Any] = {"gone": None}
    table = TallyTable(raw)
    tally = ConversationTally(conversation_id="c1", token_total=5, message_count=1)
    table.put(tally)
    assert "c1" not in raw  # cached until a flush
    assert table.flush(force=True) == 1
    assert raw["c1"] == tally.model_dump()
    assert table.get("c1") == tally
    assert table.get("gone") is None and table.get("never") is None
    assert list(table.items()) == [("c1", tally)]
    table.delete("c1")
    table.delete("c1")  # deleting twice is fine: reconciliation and erasure may race
    assert "c1" not in raw
