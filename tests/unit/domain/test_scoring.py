from __future__ import annotations

import pytest

from core.domain.messages import ToolCall
from core.domain.scoring import DEFAULT_SCORING, ImportanceScoringConfig, score_message
from tests.support.builders import message

pytestmark = pytest.mark.unit


def test_role_weight_orders_system_user_assistant__compaction_v2_AC3_1() -> None:
    scores = {
        role: score_message(message(0, role, "same text"), 3, 5)
        for role in ("system", "user", "assistant")
    }
    assert scores["system"] > scores["user"] > scores["assistant"]


def test_tool_role_weighs_like_user() -> None:
    assert score_message(message(0, "tool", "x"), 0, 1) == score_message(
        message(0, "user", "x"), 0, 1
    )


def test_newer_messages_score_higher__compaction_v2_AC3_2() -> None:
    same = message(0, "user", "identical")
    scores = [score_message(same, i, 10) for i in range(10)]
    assert scores == sorted(scores)
    assert len(set(scores)) == 10
    # newest gets the full role weight, oldest decays by 0.95^(n-1)
    assert scores[-1] == pytest.approx(5.0 + 0.09)
    assert scores[0] == pytest.approx(5.0 * 0.95**9 + 0.09)


@pytest.mark.parametrize(
    ("plain", "signalled", "bonus"),
    [
        ("we deploy on friday", "do we deploy on friday?", 2.0 + 0.05),
        ("the build is slow", "the build has an error now", 1.5 + 0.09),
    ],
)
def test_content_signals_raise_score__compaction_v2_AC3_3(
    plain: str, signalled: str, bonus: float
) -> None:
    base = score_message(message(0, "user", plain), 0, 1)
    boosted = score_message(message(0, "user", signalled), 0, 1)
    assert boosted - base == pytest.approx(bonus, abs=0.01)


def test_tool_calls_add_bonus__compaction_v2_AC3_3() -> None:
    call = ToolCall(id="c1", name="search", arguments={"q": "x"})
    with_call = message(0, "assistant", "looking", tool_calls=[call])
    without = message(0, "assistant", "looking")
    assert score_message(with_call, 0, 1) - score_message(without, 0, 1) == pytest.approx(4.0)


def test_each_distinct_keyword_counts_once() -> None:
    one = score_message(message(0, "user", "error error error"), 0, 1)
    two = score_message(message(0, "user", "error fix fix fix"), 0, 1)
    none = score_message(message(0, "user", "xxxxx xxxxx xxxxx"), 0, 1)
    assert one - none == pytest.approx(1.5, abs=0.01)
    assert two - none == pytest.approx(3.0, abs=0.01)


def test_keywords_match_case_insensitively() -> None:
    assert score_message(message(0, "user", "DECISION"), 0, 1) > score_message(
        message(0, "user", "xxxxxxxx"), 0, 1
    )


def test_length_bonus_is_one_per_hundred_chars_capped_at_three() -> None:
    def bonus(n: int) -> float:
        return score_message(message(0, "assistant", "x" * n), 0, 1) - 3.0

    assert bonus(0) == 0
    assert bonus(100) == pytest.approx(1.0)
    assert bonus(250) == pytest.approx(2.5)
    assert bonus(5000) == pytest.approx(3.0)


def test_custom_config_overrides_defaults__compaction_v2_AC3_5() -> None:
    config = ImportanceScoringConfig(
        role_weight_assistant=50.0,
        question_bonus=0.0,
        important_keywords=("banana",),
        keyword_bonus=7.0,
        content_length_weight=0.0,
    )
    msg = message(0, "assistant", "banana? error")
    assert score_message(msg, 0, 1, config) == pytest.approx(57.0)
    assert score_message(msg, 0, 1, DEFAULT_SCORING) == pytest.approx(3 + 2 + 1.5 + 0.13)


def test_edge_cases_empty_content_and_single_message() -> None:
    assert score_message(message(0, "assistant", ""), 0, 1) == 3.0
    with pytest.raises(ValueError):
        score_message(message(0), 1, 1)
    with pytest.raises(ValueError):
        score_message(message(0), 0, 0)


def test_identical_messages_at_same_position_score_identically() -> None:
    a, b = message(0, "user", "same"), message(1, "user", "same")
    assert score_message(a, 2, 4) == score_message(b, 2, 4)
