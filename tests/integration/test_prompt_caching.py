"""Prompt caching (issue 18, part 7) through the real ``anthropic`` SDK against the
local wire server, which caches marked system prefixes as the Messages API does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from core.adapters.llm.anthropic import DIRECTIVE_REMINDER, AnthropicProvider
from core.domain.prompts import DEFAULT_DIRECTIVE, build_summarization_request
from core.ports.model import ModelRequest
from tests.support.builders import message
from tests.support.llm_server import ANTHROPIC_PATH, LLMTestServer

pytestmark = pytest.mark.integration

LONG_PROMPT = "Keep every figure exact. " * 300  # 1,200 words: over the cacheable minimum


@pytest.fixture
async def server() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer() as running:
        yield running


def _request(prompt: str | None, n: int = 0) -> ModelRequest:
    return build_summarization_request(
        system_prompt=prompt,
        previous_summary="earlier: the order ORD-1 was late",
        messages=[message(n, "user", f"turn {n} about ORD-{n}"), message(n + 1, "assistant", "ok")],
        model_name="claude-haiku-4-5",
        max_tokens=200,
    )


async def test_the_stable_prefix_is_one_cached_system_block_and_the_directive_leaves_the_end(
    server: LLMTestServer,
) -> None:
    provider = AnthropicProvider("key", base_url=server.base_url)
    try:
        await provider.complete(_request("You summarise."))
    finally:
        await provider.aclose()
    (sent,) = server.requests_to(ANTHROPIC_PATH)
    first, *rest = sent.body["system"]
    assert first == {
        "type": "text",
        "text": "You summarise.\n\n" + DEFAULT_DIRECTIVE,
        "cache_control": {"type": "ephemeral"},
    }
    assert all("cache_control" not in block for block in rest)
    assert rest[0]["text"].startswith("Previous summary of conversation:")
    assert sent.body["messages"][-1] == {"role": "user", "content": DIRECTIVE_REMINDER}
    assert not any(DEFAULT_DIRECTIVE in str(m["content"]) for m in sent.body["messages"])


async def test_a_warm_prefix_is_read_from_the_cache_and_usage_says_so(
    server: LLMTestServer,
) -> None:
    provider = AnthropicProvider("key", base_url=server.base_url)
    try:
        first = await provider.complete(_request(LONG_PROMPT, 0))
        second = await provider.complete(_request(LONG_PROMPT, 2))
    finally:
        await provider.aclose()
    assert first.usage.cache_write_tokens > 1000 and first.usage.cache_read_tokens == 0
    assert second.usage.cache_read_tokens == first.usage.cache_write_tokens
    assert second.usage.cache_write_tokens == 0
    assert second.usage.input_tokens < first.usage.cache_write_tokens / 10


async def test_a_prefix_under_the_minimum_is_not_cached_and_off_means_one_plain_system(
    server: LLMTestServer,
) -> None:
    cached = AnthropicProvider("key", base_url=server.base_url)
    plain = AnthropicProvider("key", base_url=server.base_url, prompt_caching=False)
    try:
        short = await cached.complete(_request(None))
        await plain.complete(_request(LONG_PROMPT))
    finally:
        await cached.aclose()
        await plain.aclose()
    assert (short.usage.cache_read_tokens, short.usage.cache_write_tokens) == (0, 0)
    body = server.requests_to(ANTHROPIC_PATH)[-1].body
    assert isinstance(body["system"], str)
    assert body["messages"][-1]["content"] == DEFAULT_DIRECTIVE
