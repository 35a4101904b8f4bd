"""What summarisation requests bill per compressed token with the default settings
(issue 28: at most 1.3 on ~30-token chat turns as on long ones).

The requests of one compaction are built the way the summariser builds them
(the default chunking, the default prompt, fold-in) and counted the way the LLM
test server bills them: the stand-in tokenizer over the system prompt and every
message, plus the template's tokens a message. The model's answer is the test
server's deterministic one (the first six words of each message), so the
running summary grows with what a chunk carries, as a real summary does.
"""

from __future__ import annotations

import pytest

from core.domain.chunking import chunk_messages
from core.domain.compaction import CompactionConfig
from core.domain.messages import ConversationMessage
from core.domain.prompts import build_summarization_request
from core.ports.model import ModelRequest
from tests.support.builders import message
from tests.support.llm_server import MESSAGE_OVERHEAD_TOKENS, stand_in_tokens

pytestmark = pytest.mark.unit

WORDS = (
    "we moved the standup to ten because the client call runs late and the invoice "
    "for March is still open so Priya covers the reviews while the deploy goes out"
).split()


def turns_of(count: int, tokens: int) -> list[ConversationMessage]:
    """Alternating user and assistant turns of about ``tokens`` tokens (the test
    server's count), each a different run of words."""
    out = []
    for n in range(count):
        text, at = f"turn {n}:", n
        counted = stand_in_tokens(text)
        while counted < tokens:  # words apart: their counts add up
            word = WORDS[at % len(WORDS)]
            text, counted, at = f"{text} {word}", counted + stand_in_tokens(word), at + 7
        out.append(message(n, "user" if n % 2 == 0 else "assistant", text))
    return out


def billed(request: ModelRequest) -> int:
    texts = [request.system or "", *(m.content for m in request.messages)]
    return stand_in_tokens(*texts) + MESSAGE_OVERHEAD_TOKENS * len(texts)


def answer(request: ModelRequest) -> str:
    """The LLM test server's ``summary_responder``: six words of each message."""
    return "Summary: " + " | ".join(" ".join(m.content.split()[:6]) for m in request.messages)


def billed_per_compressed_token(turns: list[ConversationMessage]) -> float:
    config = CompactionConfig()
    chunks = chunk_messages(
        turns, config.chunk_size, config.max_chunk_tokens,
        min_chunk_tokens=config.min_chunk_tokens,
    )  # fmt: skip
    total, running = 0, None
    for chunk in chunks:
        request = build_summarization_request(
            system_prompt=config.prompt, previous_summary=running, messages=chunk,
            model_name="m", max_tokens=config.max_summary_tokens,
        )  # fmt: skip
        total += billed(request)
        running = answer(request)
    return total / stand_in_tokens(*(t.content for t in turns))


@pytest.mark.parametrize(("count", "tokens"), [(60, 30), (200, 30), (400, 30), (40, 300)])
def test_a_compaction_bills_at_most_1_3_input_tokens_per_compressed_token(
    count: int, tokens: int
) -> None:
    """Before issue 28's chunking by tokens: 20-turn chunks of ~30-token turns paid
    the directive, the system prompt and the running summary every 600 tokens
    (1.6 here, as ``bench/request_cost.py`` measured)."""
    assert billed_per_compressed_token(turns_of(count, tokens)) <= 1.3
