"""The measured tokens per character (core.domain.calibration): a decaying average
that starts at characters / 4, converges on what the provider counts and is not
thrown by a count no tokenizer made."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.calibration import (
    HALF_LIFE_CHARS,
    CalibratedCounter,
    TokenRate,
    billed_prompt_tokens,
    request_chars,
)
from core.domain.tokens import estimate_tokens
from core.ports.model import ModelMessage, ModelRequest, ModelUsage

pytestmark = pytest.mark.unit


@given(st.text(max_size=300))
def test_before_any_measurement_the_counter_is_characters_over_four(text: str) -> None:
    assert CalibratedCounter().count(text) == estimate_tokens(text) == math.ceil(len(text) / 4)


def test_the_rate_converges_on_the_providers_count() -> None:
    rate = TokenRate.prior()
    first = rate.observed(8_000, 1_600)  # 0.2 a character
    assert 0.2 < first.per_char < 0.21  # the prior weighs as 2,000 characters
    for _ in range(20):
        rate = rate.observed(8_000, 1_600)
    assert rate.per_char == pytest.approx(0.2, abs=1e-3)
    assert rate.measured == 20


def test_old_measurements_fade_as_new_text_is_measured() -> None:
    """Half the weight of what came before, per ``HALF_LIFE_CHARS`` measured."""
    old = TokenRate(tokens=1_000.0, chars=4_000.0)
    new = old.observed(HALF_LIFE_CHARS, HALF_LIFE_CHARS // 2)
    assert new.chars == pytest.approx(2_000 + HALF_LIFE_CHARS)
    assert new.tokens == pytest.approx(500 + HALF_LIFE_CHARS // 2)


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(5_000, 0), (0, 10), (10_000, 100), (1_000, 2_000)],
    ids=["no usage", "no text", "a sliver (uncached part only)", "more tokens than a tokenizer"],
)
def test_a_count_no_tokenizer_made_leaves_the_rate(chars: int, tokens: int) -> None:
    rate = TokenRate.prior().observed(8_000, 1_600)
    assert rate.observed(chars, tokens) is rate


def test_a_request_is_measured_whole_its_cached_tokens_included() -> None:
    request = ModelRequest(
        model="m",
        system="abcd",
        messages=(
            ModelMessage(role="user", content="12345"),
            ModelMessage(role="user", content="x"),
        ),
        max_tokens=5,
    )
    assert request_chars(request) == 10
    usage = ModelUsage(
        input_tokens=7, output_tokens=50, cache_read_tokens=100, cache_write_tokens=3
    )
    assert billed_prompt_tokens(usage) == 110


def test_the_counter_counts_at_the_rate_it_holds() -> None:
    counter = CalibratedCounter(TokenRate(tokens=3.0, chars=10.0))
    assert [counter.count("x" * n) for n in (0, 1, 10, 11)] == [0, 1, 3, 4]
