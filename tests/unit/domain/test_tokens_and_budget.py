from __future__ import annotations

import pytest

from core.domain.budget import BudgetConfig, compaction_due, over_budget
from core.domain.messages import ToolCall
from core.domain.tokens import (
    CharRatioTokenCounter,
    estimate_history_tokens,
    estimate_message_tokens,
    estimate_tokens,
)
from tests.support.builders import message

pytestmark = pytest.mark.unit


def test_default_estimate_is_ceil_len_over_four() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_tool_call_payload_is_counted() -> None:
    call = ToolCall(id="c", name="write_file", arguments={"body": "y" * 400})
    with_call = message(0, "assistant", "ok", tool_calls=[call])
    assert estimate_message_tokens(with_call) > 100
    assert estimate_message_tokens(message(0, "assistant", "ok")) == 1


def test_pluggable_counter() -> None:
    class WordCounter:
        def count(self, text: str) -> int:
            return len(text.split())

    msgs = [message(0, "user", "one two three"), message(1, "user", "four")]
    assert estimate_history_tokens(msgs, WordCounter()) == 4
    assert CharRatioTokenCounter(2).count("abcde") == 3
    with pytest.raises(ValueError):
        CharRatioTokenCounter(0)


def test_trigger_when_estimate_exceeds_budget__context_compaction_AC1_1() -> None:
    budget = BudgetConfig(context_budget=0.5, model_max_tokens=100)  # 50 tokens
    at_budget = [message(0, "user", "x" * 200)]  # exactly 50
    over = [message(0, "user", "x" * 201)]  # 51
    assert not compaction_due(estimate_history_tokens(at_budget), budget)
    assert compaction_due(estimate_history_tokens(over), budget)
    assert budget.budget_tokens == 50
    assert over_budget(51, budget) and not over_budget(50, budget)
