from __future__ import annotations

import pytest

from core.adapters.llm.extractive import ExtractiveProvider, extract_summary
from core.domain.prompts import build_summarization_request
from core.domain.tokens import estimate_tokens
from tests.support.builders import message

pytestmark = pytest.mark.unit

CONVERSATION = [
    message(0, "user", "Hi there! Hope you are well."),
    message(1, "assistant", "Hello! Happy to help."),
    message(2, "user", "The deploy failed with error E42 in the payments service. Can you fix it?"),
    message(
        3,
        "assistant",
        "The error E42 comes from the payments service config. I changed the timeout to 30s.",
    ),
    message(4, "tool", "deploy payments: success after timeout change to 30s"),
    message(
        5, "user", "Great. Decision: we keep the 30s timeout for payments until the Q3 review."
    ),
    message(6, "assistant", "Agreed, the 30s timeout stays for payments until the Q3 review."),
    message(7, "user", "Thanks!"),
]


def request(max_tokens: int, previous: str | None = None):  # type: ignore[no-untyped-def]
    return build_summarization_request(
        system_prompt=None,
        previous_summary=previous,
        messages=CONVERSATION,
        model_name="x",
        max_tokens=max_tokens,
    )


def test_keeps_informative_sentences_and_drops_small_talk() -> None:
    text, tokens = extract_summary(request(60))
    assert "E42" in text
    assert "30s" in text
    assert "Hope you are well" not in text
    assert "Thanks" not in text
    assert tokens == estimate_tokens(text) <= 60


def test_respects_budget_and_original_order() -> None:
    for budget in (5, 20, 40, 400):
        text, tokens = extract_summary(request(budget))
        assert tokens <= budget
    text, _ = extract_summary(request(400))
    lines = text.splitlines()
    assert lines == sorted(
        lines,
        key=lambda line: next(
            i
            for i, m in enumerate(CONVERSATION)
            if line.split(": ", 1)[1][:15] in m.content.replace("[Tool result]: ", "")
        ),
    )


def test_directive_is_never_summarised_and_prior_summary_is_context_only() -> None:
    previous = "Earlier the team chose Postgres 18 for storage. The deploy failed with error E42 in the payments service."
    text, _ = extract_summary(request(400, previous=previous))
    assert "PRESERVE" not in text
    assert "Postgres 18" not in text  # already archived in an earlier batch
    assert "The deploy failed with error E42" not in text  # not repeated
    assert "30s" in text


def test_resummarization_batches_are_content() -> None:
    from core.domain.prompts import build_resummarization_request

    built = build_resummarization_request(
        system_prompt=None,
        batch_contents=[
            "The team chose Postgres 18 for storage after a long debate.",
            "Deploy error E42 was fixed by raising the payments timeout.",
        ],
        model_name="x",
        max_tokens=200,
    )
    text, _ = extract_summary(built)
    assert "Postgres 18" in text and "E42" in text


def test_output_is_a_fraction_of_a_large_input() -> None:
    long_chat = [
        message(
            i,
            "user" if i % 2 else "assistant",
            f"Step {i}: we measured latency {i * 7} ms on node {i % 5} and decided to keep config v{i}.",
        )
        for i in range(200)
    ]
    built = build_summarization_request(
        system_prompt=None,
        previous_summary=None,
        messages=long_chat,
        model_name="x",
        max_tokens=100_000,
    )
    source = sum(estimate_tokens(m.content) for m in built.messages[:-1])
    _, tokens = extract_summary(built)
    assert tokens <= 0.3 * source


def test_near_duplicates_are_dropped() -> None:
    text, _ = extract_summary(request(400))
    assert text.count("until the Q3 review") == 1


async def test_provider_reports_usage_and_never_returns_empty() -> None:
    provider = ExtractiveProvider()
    response = await provider.complete(request(100))
    assert response.text and response.usage.output_tokens == estimate_tokens(response.text)
    assert response.usage.input_tokens > response.usage.output_tokens
    empty = build_summarization_request(
        system_prompt=None, previous_summary=None, messages=[], model_name="x", max_tokens=10
    )
    assert (await provider.complete(empty)).text
