"""The model and embedding adapters, through the real SDKs over real HTTP.

Nothing here patches ``anthropic`` or ``openai``: each test drives an adapter
against ``tests.support.llm_server`` and asserts on the JSON the SDK actually
sent, or on the ``ModelError`` the adapter made of what came back.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import pydantic
import pytest
import pytest_asyncio
from anthropic.types import Message

from core.adapters.embedding.openai_compat import OpenAICompatEmbedder
from core.adapters.llm.anthropic import (
    EMPTY_CONVERSATION_PLACEHOLDER,
    LEADING_USER_PLACEHOLDER,
    AnthropicProvider,
    parse_message,
)
from core.adapters.llm.errors import parse_retry_after
from core.adapters.llm.openai_compat import OpenAICompatProvider
from core.ports.embedding import Embedder, EmbeddingError
from core.ports.model import (
    ModelAuthError,
    ModelEmptyResponse,
    ModelError,
    ModelMessage,
    ModelProvider,
    ModelRateLimitError,
    ModelRequest,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
    ModelUnreadableError,
)
from tests.support.llm_server import (
    ANTHROPIC_PATH,
    EMBEDDINGS_PATH,
    OPENAI_CHAT_PATH,
    Delay,
    HTTPError,
    LLMTestServer,
    Malformed,
    Overloaded,
    RateLimited,
    Reply,
    ServerError,
    action_to_json,
    hashed_embedding,
)

pytestmark = [pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key"
MODEL = "test-model"
FAST_TIMEOUT = 0.5


def _anthropic(base_url: str, timeout: float = 5.0, api_key: str = API_KEY) -> AnthropicProvider:
    # The request's shape without prompt caching (test_prompt_caching.py has it with).
    return AnthropicProvider(
        api_key, base_url=base_url, timeout_seconds=timeout, prompt_caching=False
    )


def _openai(base_url: str, timeout: float = 5.0, api_key: str = API_KEY) -> OpenAICompatProvider:
    return OpenAICompatProvider(api_key, base_url=f"{base_url}/v1", timeout_seconds=timeout)


ProviderFactory = Callable[..., AnthropicProvider | OpenAICompatProvider]

#: provider name -> (factory taking base_url, timeout, api_key; path its calls arrive on)
PROVIDERS: dict[str, tuple[ProviderFactory, str]] = {
    "anthropic": (_anthropic, ANTHROPIC_PATH),
    "openai": (_openai, OPENAI_CHAT_PATH),
}


def msg(role: str, content: str) -> ModelMessage:
    return ModelMessage.model_validate({"role": role, "content": content})


def request_of(*messages: ModelMessage, **overrides: Any) -> ModelRequest:
    fields: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 256}
    fields.update(overrides)
    return ModelRequest(**fields)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[LLMTestServer]:
    async with LLMTestServer(api_key=API_KEY) as s:
        yield s


@pytest_asyncio.fixture
async def anthropic_provider(server: LLMTestServer) -> AsyncIterator[AnthropicProvider]:
    provider = _anthropic(server.base_url)
    yield provider
    await provider.aclose()


@pytest_asyncio.fixture
async def openai_provider(server: LLMTestServer) -> AsyncIterator[OpenAICompatProvider]:
    provider = _openai(server.base_url)
    yield provider
    await provider.aclose()


@pytest_asyncio.fixture(params=sorted(PROVIDERS))
async def any_provider(
    request: pytest.FixtureRequest, server: LLMTestServer
) -> AsyncIterator[tuple[Any, str]]:
    """Each provider in turn, with the path its requests arrive on."""
    factory, path = PROVIDERS[request.param]
    provider = factory(server.base_url, FAST_TIMEOUT)
    yield provider, path
    await provider.aclose()


def only_body(server: LLMTestServer, path: str) -> dict[str, Any]:
    """The single request's JSON body; asserting there was exactly one also
    proves the SDK did not retry behind the compactor's back."""
    sent = server.requests_to(path)
    assert len(sent) == 1, f"expected one request to {path}, got {len(sent)}"
    body = sent[0].body
    assert isinstance(body, dict)
    return body


# --------------------------------------------------------------------------
# AC2.1: the port itself
# --------------------------------------------------------------------------


def _ports_are_satisfied(
    a: AnthropicProvider, o: OpenAICompatProvider, e: OpenAICompatEmbedder
) -> tuple[ModelProvider, ModelProvider, Embedder]:
    """Never called: mypy checks the adapters against the port protocols here."""
    return a, o, e


def test_model_message_accepts_system_role__compaction_v2_AC2_1() -> None:
    message = ModelMessage(role="system", content="Be terse.")
    assert message.role == "system"
    with pytest.raises(pydantic.ValidationError):
        ModelMessage.model_validate({"role": "tool", "content": "x"})


# --------------------------------------------------------------------------
# Anthropic translation (AC2.2, AC2.4, AC2.5)
# --------------------------------------------------------------------------


async def test_anthropic_lifts_system_messages__compaction_v2_AC2_2(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(
        request_of(
            msg("system", "Rule A."),
            msg("user", "first question"),
            msg("system", "Rule B."),
            msg("assistant", "first answer"),
            msg("user", "second question"),
            system="You summarise conversations.",
        )
    )

    body = only_body(server, ANTHROPIC_PATH)
    assert body["system"] == "You summarise conversations.\n\nRule A.\n\nRule B."
    assert body["messages"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]


async def test_anthropic_request_system_alone__compaction_v2_AC2_4(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(request_of(msg("user", "hello"), system="Only this."))

    body = only_body(server, ANTHROPIC_PATH)
    assert body["system"] == "Only this."
    assert body["messages"] == [{"role": "user", "content": "hello"}]


async def test_anthropic_concatenates_multiple_system_messages__compaction_v2_AC2_5(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(
        request_of(
            msg("system", "One."), msg("system", "Two."), msg("user", "go"), msg("system", "Three.")
        )
    )

    body = only_body(server, ANTHROPIC_PATH)
    assert body["system"] == "One.\n\nTwo.\n\nThree."
    assert body["messages"] == [{"role": "user", "content": "go"}]


async def test_anthropic_omits_system_when_there_is_none__compaction_v2_AC2_4(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(request_of(msg("user", "hello")))

    assert "system" not in only_body(server, ANTHROPIC_PATH)


async def test_anthropic_merges_consecutive_same_role_messages__compaction_v2_AC2_2(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(
        request_of(
            msg("user", "part one"),
            msg("system", "lifted"),
            msg("user", "part two"),
            msg("assistant", "reply one"),
            msg("assistant", "reply two"),
            msg("user", "follow-up"),
        )
    )

    body = only_body(server, ANTHROPIC_PATH)
    assert body["messages"] == [
        {"role": "user", "content": "part one\n\npart two"},
        {"role": "assistant", "content": "reply one\n\nreply two"},
        {"role": "user", "content": "follow-up"},
    ]
    assert body["system"] == "lifted"


async def test_anthropic_prepends_user_turn_before_leading_assistant(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(
        request_of(msg("system", "sys"), msg("assistant", "earlier answer"), msg("user", "now"))
    )

    assert only_body(server, ANTHROPIC_PATH)["messages"] == [
        {"role": "user", "content": LEADING_USER_PLACEHOLDER},
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "now"},
    ]


async def test_anthropic_sends_placeholder_turn_when_only_system_text(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(
        request_of(msg("system", "Summarise nothing."), system="Base.")
    )

    body = only_body(server, ANTHROPIC_PATH)
    assert body["system"] == "Base.\n\nSummarise nothing."
    assert body["messages"] == [{"role": "user", "content": EMPTY_CONVERSATION_PLACEHOLDER}]


async def test_anthropic_skips_empty_messages(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    """The API rejects empty text blocks; an empty turn must not split or
    poison the merge."""
    await anthropic_provider.complete(
        request_of(msg("user", "a"), msg("assistant", "  "), msg("user", "b"), msg("system", ""))
    )

    body = only_body(server, ANTHROPIC_PATH)
    assert body["messages"] == [{"role": "user", "content": "a\n\nb"}]
    assert "system" not in body


async def test_anthropic_sends_temperature_and_max_tokens(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    await anthropic_provider.complete(request_of(msg("user", "hi"), temperature=0.0, max_tokens=77))
    await anthropic_provider.complete(request_of(msg("user", "hi")))

    with_temperature, without = (r.body for r in server.requests_to(ANTHROPIC_PATH))
    assert with_temperature["temperature"] == 0
    assert with_temperature["max_tokens"] == 77
    assert with_temperature["model"] == MODEL
    assert "temperature" not in without
    assert without["max_tokens"] == 256


async def test_anthropic_maps_text_usage_model_and_stop_reason(
    server: LLMTestServer, anthropic_provider: AnthropicProvider
) -> None:
    server.enqueue(
        Reply(text="the summary", input_tokens=120, output_tokens=7, stop_reason="max_tokens")
    )

    response = await anthropic_provider.complete(request_of(msg("user", "hi")))

    assert response.text == "the summary"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 7)
    assert response.model == MODEL
    assert response.stop_reason == "max_tokens"


async def test_anthropic_default_reply_is_derived_from_the_request(
    anthropic_provider: AnthropicProvider,
) -> None:
    response = await anthropic_provider.complete(
        request_of(msg("user", "alpha beta"), msg("assistant", "gamma"))
    )
    assert response.text == "Summary: alpha beta | gamma"
    assert response.stop_reason == "end_turn"


def test_anthropic_concatenates_text_blocks_and_skips_others() -> None:
    message = Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [
                {"type": "text", "text": "Hello, "},
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "world."},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
    )
    assert parse_message(message).text == "Hello, world."


# --------------------------------------------------------------------------
# OpenAI-compatible translation (AC2.3, AC2.4, AC2.5)
# --------------------------------------------------------------------------


async def test_openai_passes_system_messages_through_in_order__compaction_v2_AC2_3(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    await openai_provider.complete(
        request_of(
            msg("user", "first question"),
            msg("system", "Mid-conversation rule."),
            msg("assistant", "first answer"),
            msg("user", "second question"),
            system="You summarise conversations.",
        )
    )

    assert only_body(server, OPENAI_CHAT_PATH)["messages"] == [
        {"role": "system", "content": "You summarise conversations."},
        {"role": "user", "content": "first question"},
        {"role": "system", "content": "Mid-conversation rule."},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]


async def test_openai_request_system_alone__compaction_v2_AC2_4(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    await openai_provider.complete(request_of(msg("user", "hello"), system="Only this."))

    assert only_body(server, OPENAI_CHAT_PATH)["messages"] == [
        {"role": "system", "content": "Only this."},
        {"role": "user", "content": "hello"},
    ]


async def test_openai_keeps_multiple_system_messages_sequential__compaction_v2_AC2_5(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    await openai_provider.complete(
        request_of(msg("system", "One."), msg("system", "Two."), msg("user", "go"), system="Zero.")
    )

    assert only_body(server, OPENAI_CHAT_PATH)["messages"] == [
        {"role": "system", "content": "Zero."},
        {"role": "system", "content": "One."},
        {"role": "system", "content": "Two."},
        {"role": "user", "content": "go"},
    ]


async def test_openai_sends_temperature_and_max_tokens(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    await openai_provider.complete(request_of(msg("user", "hi"), temperature=0.0, max_tokens=77))
    await openai_provider.complete(request_of(msg("user", "hi")))

    with_temperature, without = (r.body for r in server.requests_to(OPENAI_CHAT_PATH))
    assert with_temperature["temperature"] == 0
    assert with_temperature["max_tokens"] == 77
    assert with_temperature["model"] == MODEL
    assert "temperature" not in without
    assert "max_completion_tokens" not in without


async def test_openai_maps_text_usage_model_and_finish_reason(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    server.enqueue(
        Reply(text="the summary", input_tokens=120, output_tokens=7, stop_reason="length")
    )

    response = await openai_provider.complete(request_of(msg("user", "hi")))

    assert response.text == "the summary"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 7)
    assert response.model == MODEL
    assert response.stop_reason == "length"


async def test_openai_sends_bearer_key_and_custom_headers(server: LLMTestServer) -> None:
    provider = OpenAICompatProvider(
        API_KEY, base_url=server.openai_base_url, default_headers={"x-tenant": "t1"}
    )
    try:
        await provider.complete(request_of(msg("user", "hi")))
    finally:
        await provider.aclose()

    (sent,) = server.requests_to(OPENAI_CHAT_PATH)
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["x-tenant"] == "t1"


# --------------------------------------------------------------------------
# Error mapping, both providers
# --------------------------------------------------------------------------


async def _expect_error(
    provider: Any,
    server: LLMTestServer,
    path: str,
    expected: type[ModelError],
    *,
    chained: bool = True,
) -> ModelError:
    """Call once and return the port error; ``chained`` demands the SDK's
    exception as ``__cause__`` (false when the adapter itself rejected a reply
    the SDK accepted)."""
    with pytest.raises(expected) as caught:
        await provider.complete(request_of(msg("user", "hi")))
    error = caught.value
    if chained:
        sdk_errors = anthropic.AnthropicError | openai.OpenAIError | ValueError
        assert isinstance(error.__cause__, sdk_errors)
    assert error.provider == provider.name
    assert len(server.requests_to(path)) <= 1, "the SDK must not retry on its own"
    return error


async def test_rate_limit_carries_retry_after(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    provider, path = any_provider
    server.enqueue(RateLimited(retry_after=1.5))

    error = await _expect_error(provider, server, path, ModelRateLimitError)

    assert isinstance(error, ModelRateLimitError)
    assert error.retry_after == 1.5
    assert error.retryable


async def test_rate_limit_without_header_has_no_retry_after(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    provider, path = any_provider
    server.enqueue(RateLimited(retry_after=None))

    error = await _expect_error(provider, server, path, ModelRateLimitError)

    assert isinstance(error, ModelRateLimitError)
    assert error.retry_after is None


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_carry_status(
    server: LLMTestServer, any_provider: tuple[Any, str], status: int
) -> None:
    provider, path = any_provider
    server.enqueue(ServerError(status=status))

    error = await _expect_error(provider, server, path, ModelServerError)

    assert isinstance(error, ModelServerError)
    assert error.status == status
    assert error.retryable


async def test_overloaded_is_a_server_error(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    provider, path = any_provider
    server.enqueue(Overloaded())

    error = await _expect_error(provider, server, path, ModelServerError)

    assert isinstance(error, ModelServerError)
    assert error.status == 529


async def test_slow_reply_times_out(server: LLMTestServer, any_provider: tuple[Any, str]) -> None:
    provider, path = any_provider
    server.enqueue(Delay(FAST_TIMEOUT * 4))

    error = await _expect_error(provider, server, path, ModelTimeoutError)

    assert error.retryable


@pytest.mark.parametrize(
    ("malformed", "chained"),
    [
        # Not JSON at all: fails inside the SDK, which the adapter chains.
        (Malformed(), True),
        # JSON of the wrong shape, or a proxy's HTML page: the SDK accepts it
        # unvalidated and the adapter's own checks reject it.
        (Malformed(body="{}"), False),
        (Malformed(body="<html>Bad gateway</html>", content_type="text/html"), False),
    ],
    ids=["truncated-json", "empty-object", "html-page"],
)
async def test_a_body_that_is_no_response_is_the_providers(
    server: LLMTestServer, any_provider: tuple[Any, str], malformed: Malformed, chained: bool
) -> None:
    """Issue 29: the path to the provider is broken (a proxy's error page in a
    200, a cut body), not the request: a retryable server error, counted by the
    provider guard and never against the conversation."""
    provider, path = any_provider
    server.enqueue(malformed)

    error = await _expect_error(provider, server, path, ModelUnreadableError, chained=chained)

    assert error.retryable
    assert isinstance(error, ModelServerError) and not isinstance(error, ModelResponseError)


async def test_a_response_with_nothing_in_it_is_the_requests(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    """A completion or message of the right shape with no choice or block in it
    answered this request: its own trouble, not retried."""
    provider, path = any_provider
    server.enqueue(Malformed(body='{"choices": [], "content": []}'))

    error = await _expect_error(provider, server, path, ModelResponseError, chained=False)

    assert not error.retryable


async def test_reply_without_text_is_an_empty_response_with_its_usage(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    """Its own kind, with what it was billed: the summariser hands the gate an
    empty summary (refused, and the extractive summariser takes over)."""
    provider, _ = any_provider
    server.enqueue(Reply(text="", input_tokens=321))

    with pytest.raises(ModelEmptyResponse, match="no text") as raised:
        await provider.complete(request_of(msg("user", "hi")))
    assert isinstance(raised.value, ModelResponseError)
    assert raised.value.usage.input_tokens == 321


async def test_wrong_key_is_an_auth_error(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    provider, path = any_provider
    wrong = PROVIDERS[provider.name][0](server.base_url, FAST_TIMEOUT, "wrong-key")
    try:
        error = await _expect_error(wrong, server, path, ModelAuthError)
    finally:
        await wrong.aclose()

    assert not error.retryable


async def test_forbidden_is_an_auth_error(
    server: LLMTestServer, any_provider: tuple[Any, str]
) -> None:
    provider, path = any_provider
    server.enqueue(HTTPError(403, "model not allowed"))

    await _expect_error(provider, server, path, ModelAuthError)


@pytest.mark.parametrize("status", [400, 404, 413, 422])
async def test_other_client_errors_are_response_errors(
    server: LLMTestServer, any_provider: tuple[Any, str], status: int
) -> None:
    provider, path = any_provider
    server.enqueue(HTTPError(status, "nope"))

    error = await _expect_error(provider, server, path, ModelResponseError)

    assert f"HTTP {status}" in str(error)


async def test_openai_insufficient_quota_is_not_retryable(
    server: LLMTestServer, openai_provider: OpenAICompatProvider
) -> None:
    server.enqueue(HTTPError(429, "You exceeded your current quota", code="insufficient_quota"))

    error = await _expect_error(openai_provider, server, OPENAI_CHAT_PATH, ModelAuthError)

    assert not error.retryable


@pytest.mark.parametrize("name", sorted(PROVIDERS))
async def test_connection_refused_is_a_server_error(name: str) -> None:
    factory, _ = PROVIDERS[name]
    provider = factory(f"http://127.0.0.1:{_closed_port()}", FAST_TIMEOUT)
    try:
        with pytest.raises(ModelServerError) as caught:
            await provider.complete(request_of(msg("user", "hi")))
    finally:
        await provider.aclose()

    assert caught.value.status is None
    assert isinstance(
        caught.value.__cause__, anthropic.APIConnectionError | openai.APIConnectionError
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "Sat, 21 Nov 2026 00:00:30 GMT"}, 30.0),
        ({"retry-after": "-3"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    now = datetime(2026, 11, 21, tzinfo=UTC).timestamp()
    assert parse_retry_after(headers, now=now) == expected


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------


@pytest_asyncio.fixture
async def make_embedder(
    server: LLMTestServer,
) -> AsyncIterator[Callable[..., OpenAICompatEmbedder]]:
    made: list[OpenAICompatEmbedder] = []

    def make(**kwargs: Any) -> OpenAICompatEmbedder:
        kwargs.setdefault("base_url", server.openai_base_url)
        kwargs.setdefault("max_retries", 0)
        embedder = OpenAICompatEmbedder("test-embed", API_KEY, **kwargs)
        made.append(embedder)
        return embedder

    yield make
    for embedder in made:
        await embedder.aclose()


def assert_vectors(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got == pytest.approx(want)


async def test_embedder_preserves_order_and_is_deterministic(
    server: LLMTestServer, make_embedder: Callable[..., OpenAICompatEmbedder]
) -> None:
    texts = ["the cat sat", "stock prices fell", "a cat sat down", ""]

    vectors = await make_embedder().embed(texts)

    assert_vectors(vectors, [hashed_embedding(t, 64) for t in texts])
    assert all(math.isclose(math.hypot(*v), 1.0) for v in vectors)
    body = only_body(server, EMBEDDINGS_PATH)
    assert body["input"] == texts
    assert body["encoding_format"] == "float"
    assert body["model"] == "test-embed"


async def test_embedder_vectors_reflect_shared_words(
    make_embedder: Callable[..., OpenAICompatEmbedder],
) -> None:
    cat, cat_again, stocks = await make_embedder().embed(
        ["the cat sat on the mat", "a cat sat on a mat", "quarterly earnings beat forecasts"]
    )

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(cat, cat_again) > cosine(cat, stocks)


async def test_embedder_batches_large_inputs(
    server: LLMTestServer, make_embedder: Callable[..., OpenAICompatEmbedder]
) -> None:
    texts = [f"text number {i}" for i in range(5)]

    vectors = await make_embedder(batch_size=2).embed(texts)

    sent = [r.body["input"] for r in server.requests_to(EMBEDDINGS_PATH)]
    assert sent == [texts[0:2], texts[2:4], texts[4:5]]
    assert_vectors(vectors, [hashed_embedding(t, 64) for t in texts])


async def test_embedder_sends_nothing_for_no_texts(
    server: LLMTestServer, make_embedder: Callable[..., OpenAICompatEmbedder]
) -> None:
    assert await make_embedder().embed([]) == []
    assert server.requests == []


@pytest.mark.parametrize(
    ("action", "match"),
    [
        (ServerError(500), "HTTP 500"),
        (RateLimited(retry_after=0), "HTTP 429"),
        (Malformed(), "failed"),
        (Delay(FAST_TIMEOUT * 4), "timed out"),
    ],
)
async def test_embedder_errors_become_embedding_errors(
    server: LLMTestServer,
    make_embedder: Callable[..., OpenAICompatEmbedder],
    action: Any,
    match: str,
) -> None:
    server.enqueue(action, path=EMBEDDINGS_PATH)

    with pytest.raises(EmbeddingError, match=match) as caught:
        await make_embedder(timeout_seconds=FAST_TIMEOUT).embed(["a", "b"])

    assert caught.value.__cause__ is not None


async def test_embedder_unreachable_server_is_an_embedding_error(
    make_embedder: Callable[..., OpenAICompatEmbedder],
) -> None:
    embedder = make_embedder(base_url=f"http://127.0.0.1:{_closed_port()}/v1")
    with pytest.raises(EmbeddingError, match="could not reach"):
        await embedder.embed(["a"])


# --------------------------------------------------------------------------
# The test server itself
# --------------------------------------------------------------------------


async def test_server_latency_applies_to_every_reply() -> None:
    async with LLMTestServer(latency_seconds=0.2) as slow:
        provider = _anthropic(slow.base_url)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.gather(
                *(provider.complete(request_of(msg("user", "x"))) for _ in range(3))
            )
            elapsed = loop.time() - started
        finally:
            await provider.aclose()
    # Concurrent calls overlap: latency is per reply, not a global lock.
    assert 0.2 <= elapsed < 0.6


async def test_server_rejects_system_role_inside_anthropic_messages(server: LLMTestServer) -> None:
    """Guards the guard: the server must refuse what a lifting bug would send."""
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=server.base_url, max_retries=0)
    try:
        with pytest.raises(anthropic.BadRequestError):
            await client.messages.create(
                model=MODEL,
                max_tokens=10,
                messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
            )
    finally:
        await client.close()


async def test_standalone_server_process() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.llm_server",
        "--port",
        "0",
        "--latency-ms",
        "10",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=15)
        base_url = line.decode().strip()
        assert base_url.startswith("http://127.0.0.1:")

        # Script it over the control endpoint, as an out-of-process test would.
        await _post_json(f"{base_url}/_test/enqueue", action_to_json(RateLimited(retry_after=2)))
        provider = _openai(base_url)
        try:
            with pytest.raises(ModelRateLimitError) as caught:
                await provider.complete(request_of(msg("user", "hi")))
            response = await provider.complete(request_of(msg("user", "hello there")))
        finally:
            await provider.aclose()

        assert caught.value.retry_after == 2
        assert response.text == "Summary: hello there"
        recorded = await _get_json(f"{base_url}/_test/requests")
        assert [r["path"] for r in recorded] == [OPENAI_CHAT_PATH, OPENAI_CHAT_PATH]
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0


async def _post_json(url: str, payload: Any) -> Any:
    return await _http("POST", url, payload)


async def _get_json(url: str) -> Any:
    return await _http("GET", url, None)


async def _http(method: str, url: str, payload: Any) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.request(method, url, json=payload) as r:
        r.raise_for_status()
        return json.loads(await r.text())
