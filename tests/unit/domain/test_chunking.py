from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.chunking import chunk_messages, halve, in_history_order
from core.domain.tokens import estimate_message_tokens
from tests.support.builders import history, message

pytestmark = pytest.mark.unit

# Text a store can hold: MessageEvent and ConversationMessage refuse NUL and lone surrogates.
STORABLE = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")


def test_chunks_by_chunk_size__context_compaction_AC1_2() -> None:
    chunks = chunk_messages(history(10), chunk_size=3)
    assert [len(c) for c in chunks] == [3, 3, 3, 1]


def test_empty_input_gives_no_chunks__context_compaction_AC1_2() -> None:
    assert chunk_messages([], chunk_size=3) == ()


def test_chunk_size_larger_than_input_gives_one_chunk__context_compaction_AC1_2() -> None:
    msgs = history(4)
    assert chunk_messages(msgs, chunk_size=20) == (tuple(msgs),)


def test_token_budget_splits_chunks() -> None:
    msgs = [message(i, "user", "x" * 40) for i in range(6)]  # 10 tokens each
    chunks = chunk_messages(msgs, chunk_size=20, max_chunk_tokens=25)
    assert [len(c) for c in chunks] == [2, 2, 2]


def test_oversized_message_gets_its_own_chunk() -> None:
    msgs = [message(0, "user", "a" * 8), message(1, "user", "b" * 400), message(2, "user", "c" * 8)]
    chunks = chunk_messages(msgs, chunk_size=20, max_chunk_tokens=10)
    assert [[m.id for m in c] for c in chunks] == [["m00000"], ["m00001"], ["m00002"]]


def test_a_chunk_of_short_turns_grows_until_it_carries_min_chunk_tokens() -> None:
    """Issue 28: 20 turns of ~10 tokens pay the request's fixed parts every 200
    tokens; a chunk grows past ``chunk_size`` to ``min_chunk_tokens``."""
    msgs = [message(i, "user", "x" * 40) for i in range(100)]  # 10 tokens each
    chunks = chunk_messages(msgs, chunk_size=20, min_chunk_tokens=500)
    assert [len(c) for c in chunks] == [50, 50]


def test_long_turns_are_chunked_by_chunk_size_whatever_min_chunk_tokens() -> None:
    msgs = [message(i, "user", "x" * 400) for i in range(9)]  # 100 tokens each
    chunks = chunk_messages(msgs, chunk_size=3, min_chunk_tokens=200)
    assert [len(c) for c in chunks] == [3, 3, 3]


def test_a_short_last_chunk_joins_the_one_before() -> None:
    msgs = [message(i, "user", "x" * 40) for i in range(60)]  # 10 tokens each
    assert [len(c) for c in chunk_messages(msgs, 20, min_chunk_tokens=500)] == [60]
    assert [len(c) for c in chunk_messages(msgs, 20, min_chunk_tokens=200)] == [20, 20, 20]


def test_max_chunk_tokens_wins_over_min_chunk_tokens() -> None:
    msgs = [message(i, "user", "x" * 40) for i in range(10)]  # 10 tokens each
    chunks = chunk_messages(msgs, chunk_size=2, max_chunk_tokens=30, min_chunk_tokens=80)
    assert [len(c) for c in chunks] == [3, 3, 3, 1]


def test_invalid_sizes_rejected() -> None:
    with pytest.raises(ValueError):
        chunk_messages(history(2), chunk_size=0)
    with pytest.raises(ValueError):
        chunk_messages(history(2), chunk_size=2, max_chunk_tokens=0)
    with pytest.raises(ValueError):
        chunk_messages(history(2), chunk_size=2, min_chunk_tokens=-1)


def test_in_history_order_restores_conversation_order() -> None:
    msgs = history(5)
    position = {m.id: i for i, m in enumerate(msgs)}
    assert in_history_order([msgs[3], msgs[0], msgs[4]], position) == (msgs[0], msgs[3], msgs[4])


@pytest.mark.parametrize(
    ("size", "halves"), [(1, [1]), (2, [2]), (3, [2, 1]), (4, [2, 2]), (9, [5, 4])]
)
def test_halve_respects_floor_of_two(size: int, halves: list[int]) -> None:
    assert [len(h) for h in halve(history(size))] == halves


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(STORABLE, max_size=120), max_size=60),
    st.integers(1, 25),
    st.one_of(st.none(), st.integers(1, 80)),
    st.sampled_from([0, 50, 400]),
)
def test_chunking_preserves_every_message_in_order(
    contents: list[str], chunk_size: int, max_tokens: int | None, min_tokens: int
) -> None:
    msgs = [message(i, "user", c) for i, c in enumerate(contents)]
    chunks = chunk_messages(msgs, chunk_size, max_tokens, min_chunk_tokens=min_tokens)
    assert [m for c in chunks for m in c] == msgs
    for chunk in chunks:
        assert len(chunk) >= 1
        if not min_tokens:
            assert len(chunk) <= chunk_size
        if max_tokens is not None and len(chunk) > 1:
            assert sum(estimate_message_tokens(m) for m in chunk) <= max_tokens
