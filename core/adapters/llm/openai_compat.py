"""OpenAI Chat Completions adapter for the model port.

Targets the wire protocol rather than OpenAI itself: vLLM, llama.cpp's
server and Ollama all speak it, so ``base_url`` picks the backend and
``api_key`` may be any placeholder for local servers. Chat Completions accepts
``role: "system"`` anywhere in the array, so system messages pass through in
place (compaction-v2.AC2.3) instead of being merged as the Anthropic adapter
must.
"""

from __future__ import annotations

from collections.abc import Mapping

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from core.adapters.llm.errors import ErrorMap, ErrorRule, SdkErrors
from core.ports.model import (
    ModelAuthError,
    ModelEmptyResponse,
    ModelRequest,
    ModelResponse,
    ModelResponseError,
    ModelUnreadableError,
    ModelUsage,
)

PROVIDER = "openai"


def _out_of_quota(exc: Exception) -> bool:
    return isinstance(exc, openai.APIError) and exc.code == "insufficient_quota"


#: Every ``openai`` exception's port error. A 429 whose code is
#: ``insufficient_quota`` is a billing stop, not a rate limit: retrying cannot
#: help, so it is reported as an auth failure rather than inviting the
#: compactor to back off forever; its row comes first so it wins over the
#: shared 429 row.
ERRORS = ErrorMap.for_sdk(
    PROVIDER,
    SdkErrors(
        timeout=openai.APITimeoutError,
        connection=openai.APIConnectionError,
        status=openai.APIStatusError,
        rate_limit=openai.RateLimitError,
        auth=(openai.AuthenticationError, openai.PermissionDeniedError),
        server=openai.InternalServerError,
    ),
    extra=[ErrorRule(openai.RateLimitError, ModelAuthError, when=_out_of_quota)],
)


def build_messages(request: ModelRequest) -> list[ChatCompletionMessageParam]:
    """``request.system`` as a leading system message, then every message in its
    original order and role (compaction-v2.AC2.3, AC2.4, AC2.5)."""
    messages: list[ChatCompletionMessageParam] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        if message.role == "system":
            messages.append({"role": "system", "content": message.content})
        elif message.role == "user":
            messages.append({"role": "user", "content": message.content})
        else:
            messages.append({"role": "assistant", "content": message.content})
    return messages


class OpenAICompatProvider:
    """A ``ModelProvider`` backed by ``openai.AsyncOpenAI`` Chat Completions.

    Sends ``max_tokens`` rather than ``max_completion_tokens``: the newer name
    is OpenAI-only, while compatible servers widely understand the older one.
    ``max_retries`` defaults to 0 because the compactor owns retry policy.
    """

    name = PROVIDER

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 0,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
            default_headers=default_headers,
        )

    async def aclose(self) -> None:
        """Release the pooled HTTP connections."""
        await self._client.close()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        try:
            result = await self._client.chat.completions.create(
                model=request.model,
                # The messages are plain JSON already; passed as ``messages`` the SDK
                # walks every one through its TypedDict transform, which cost as much
                # CPU as the rest of a compaction (docs/performance.md, section 3).
                messages=[],
                extra_body={"messages": build_messages(request)},
                max_tokens=request.max_tokens,
                temperature=request.temperature if request.temperature is not None else openai.omit,
            )
        except openai.OpenAIError as exc:
            raise ERRORS.map(exc) from exc
        except ValueError as exc:
            # A 200 whose body is not JSON surfaces as a bare JSONDecodeError.
            raise ModelUnreadableError(
                f"unreadable response body: {exc}", provider=PROVIDER
            ) from exc
        return parse_completion(result)


def parse_completion(result: object) -> ModelResponse:
    """Map a Chat Completions result onto ``ModelResponse``.

    The SDK builds responses without validation (and returns a bare string for
    non-JSON bodies), and compatible servers vary in what they omit, so
    nothing about ``result`` is trusted; a missing ``usage`` becomes zeros.
    """
    if not isinstance(result, ChatCompletion):
        raise ModelUnreadableError(
            f"expected a ChatCompletion, got {type(result).__name__}", provider=PROVIDER
        )
    choices = getattr(result, "choices", None)
    if not isinstance(choices, list):  # not a completion: a proxy's page, a cut body
        raise ModelUnreadableError("response has no choices", provider=PROVIDER)
    if not choices:  # a completion with nothing in it: this request's answer
        raise ModelResponseError("response has no choices", provider=PROVIDER)
    choice = choices[0]
    finish_reason = getattr(choice, "finish_reason", None)
    content = getattr(getattr(choice, "message", None), "content", None)
    usage = getattr(result, "usage", None)
    billed = ModelUsage(
        input_tokens=_uncached_prompt_tokens(usage),
        output_tokens=_as_int(getattr(usage, "completion_tokens", 0)),
        cache_read_tokens=_cached_prompt_tokens(usage),
    )
    if not isinstance(content, str) or not content:
        raise ModelEmptyResponse(
            f"response has no text (finish_reason={finish_reason})", provider=PROVIDER, usage=billed
        )
    model = getattr(result, "model", None)
    return ModelResponse(
        text=content,
        usage=billed,
        model=model if isinstance(model, str) else None,
        stop_reason=finish_reason if isinstance(finish_reason, str) else None,
    )


def _cached_prompt_tokens(usage: object) -> int:
    """OpenAI caches long prompts by itself and reports the share it read from the
    cache in ``prompt_tokens_details.cached_tokens`` (compatible servers often omit it)."""
    details = getattr(usage, "prompt_tokens_details", None)
    return _as_int(getattr(details, "cached_tokens", 0))


def _uncached_prompt_tokens(usage: object) -> int:
    """``prompt_tokens`` counts the cached ones too: the rest is billed at the input price."""
    prompt = _as_int(getattr(usage, "prompt_tokens", 0))
    return max(0, prompt - _cached_prompt_tokens(usage))


def _as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
