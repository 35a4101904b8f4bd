"""Properties of the offline summariser: within max_summary_tokens, no stacked
prefixes, no near-duplicates, facts before boilerplate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.extractive import extract_summary
from core.domain.prompts import build_resummarization_request, build_summarization_request
from core.domain.tokens import DEFAULT_COUNTER
from tests.support.builders import message

pytestmark = pytest.mark.unit

_WORDS = st.sampled_from(
    "photo beach Margarethe Lisbon budget 4250 euros May 14 offsite moved Porto the a is "
    "sister lives approved Dana decided caption sunset dog called Biscuit !? , . -".split()
)
_TEXT = st.lists(_WORDS, min_size=1, max_size=40).map(" ".join)
_ROLES = st.sampled_from(["user", "assistant", "tool"])


def _request(texts: list[tuple[str, str]], max_tokens: int):  # type: ignore[no-untyped-def]
    return build_summarization_request(
        system_prompt=None,
        previous_summary=None,
        messages=[message(i, role, text) for i, (role, text) in enumerate(texts)],
        model_name="x",
        max_tokens=max_tokens,
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_ROLES, _TEXT), min_size=1, max_size=25),
    st.integers(min_value=1, max_value=400),
)
def test_the_summary_never_exceeds_max_summary_tokens(
    texts: list[tuple[str, str]], max_tokens: int
) -> None:
    text, tokens = extract_summary(_request(texts, max_tokens))
    assert text
    assert tokens == DEFAULT_COUNTER.count(text)
    assert tokens <= max_tokens


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_ROLES, _TEXT), min_size=2, max_size=25), st.integers(1, 6))
def test_resummarising_never_stacks_prefixes(texts: list[tuple[str, str]], depth: int) -> None:
    summary, _ = extract_summary(_request(texts, 300))
    for _ in range(depth):
        request = build_resummarization_request(
            system_prompt=None, batch_contents=[summary, summary], model_name="x", max_tokens=300
        )
        summary, _ = extract_summary(request)
    for line in summary.splitlines():
        speaker, _, rest = line.partition(": ")
        assert not rest.startswith(("Earlier: ", "User: ", "Assistant: ", "Tool: ")), line
        assert speaker in {
            "User",
            "Assistant",
            "Tool",
            "System",
            "Earlier",
            "No substantive content to summarize.",
        }


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_ROLES, _TEXT), min_size=1, max_size=25))
def test_no_two_lines_are_near_duplicates(texts: list[tuple[str, str]]) -> None:
    from core.domain.extractive import _STOP_WORDS, _WORD

    summary, _ = extract_summary(_request(texts, 1000))
    bags = [
        frozenset(w for w in _WORD.findall(line.partition(": ")[2].lower()) if w not in _STOP_WORDS)
        for line in summary.splitlines()
    ]
    for i, a in enumerate(bags):
        for b in bags[i + 1 :]:
            if a and b:
                assert len(a & b) / len(a | b) < 0.5


def test_facts_beat_repeated_caption_lines() -> None:
    captions = [("user", f"[photo] a photo of the beach at sunset, photo {i}") for i in range(12)]
    facts = [
        ("user", "My sister Margarethe moved to Lisbon in March."),
        ("assistant", "Noted: the offsite budget is 4,250 euros, approved by Dana."),
    ]
    texts = captions[:6] + facts[:1] + captions[6:] + facts[1:]
    summary, _ = extract_summary(_request(texts, 60))
    assert "Margarethe moved to Lisbon" in summary
    assert "4,250 euros" in summary
    # At most one caption line (the rest are near-duplicates of it).
    assert sum("[photo]" in line for line in summary.splitlines()) <= 1


def test_one_resummarisation_keeps_the_speakers() -> None:
    batch = "User: My sister Margarethe lives in Lisbon.\nAssistant: The budget is 4,250 euros."
    request = build_resummarization_request(
        system_prompt=None,
        batch_contents=[batch, "Earlier: Earlier: User: Dana approved it."],
        model_name="x",
        max_tokens=200,
    )
    summary, _ = extract_summary(request)
    assert "User: My sister Margarethe lives in Lisbon." in summary.splitlines()
    assert "Earlier:" not in summary
