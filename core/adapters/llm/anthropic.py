"""Anthropic Messages API adapter for the model port.

The port lets any message carry ``role: "system"`` (compaction-v2.AC2.1); the
Messages API only takes a top-level ``system`` prompt and wants the
conversation to open with a user turn and alternate. This module is where that
gap is closed, and where every SDK failure becomes a ``ModelError`` so the
compactor's retry policy never sees an ``anthropic`` exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import anthropic
from anthropic.types import (
    AssistantMessageParam,
    Message,
    MessageParam,
    TextBlockParam,
    UserMessageParam,
)

from core.adapters.llm.errors import ErrorMap, ErrorRule, SdkErrors
from core.ports.model import (
    ModelAuthError,
    ModelEmptyResponse,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelUnreadableError,
    ModelUsage,
)

PROVIDER = "anthropic"

#: Every ``anthropic`` exception's port error. Beyond the shared rows, only
#: missing credentials (raised before any request is sent) need a row.
ERRORS = ErrorMap.for_sdk(
    PROVIDER,
    SdkErrors(
        timeout=anthropic.APITimeoutError,
        connection=anthropic.APIConnectionError,
        status=anthropic.APIStatusError,
        rate_limit=anthropic.RateLimitError,
        auth=(anthropic.AuthenticationError, anthropic.PermissionDeniedError),
        server=anthropic.InternalServerError,
        request_timeout=anthropic.RequestTimeoutError,
    ),
    extra=[ErrorRule(anthropic.CredentialsError, ModelAuthError)],
)

#: Opens the conversation when, after lifting system messages, it would start
#: with an assistant turn: the API rejects that, and a neutral marker keeps
#: the excerpt intact instead of dropping the assistant's words.
LEADING_USER_PLACEHOLDER = "[Conversation excerpt follows]"

#: Sent as the only turn when the request has nothing but system text: the
#: API needs at least one user message, and the instructions live in
#: ``system``, so the turn just hands over to them.
EMPTY_CONVERSATION_PLACEHOLDER = "[No conversation messages; follow the system instructions.]"

#: The last turn of a request whose directive moved into the cached system
#: prefix: the conversation must end with a user turn (an assistant turn last
#: would be taken as the start of the answer).
DIRECTIVE_REMINDER = "Write the summary now, as the system prompt says."

_Turn = tuple[Literal["user", "assistant"], list[str]]


def cached_prefix_request(request: ModelRequest) -> tuple[list[TextBlockParam], ModelRequest]:
    """Prompt caching: (the system blocks, the request left to send as messages).

    The stable prefix (the configured system prompt and the fixed directive,
    the same in every summarisation request) is one system block marked
    ``cache_control``, so the provider bills it at the cache-read price once
    it is warm; the request's own system messages (the running summary,
    summary batches) follow it uncached, and the directive's place at the end
    is taken by ``DIRECTIVE_REMINDER``. A request without a directive gets its
    system text cached alone. The API caches no prefix shorter than its
    minimum (1,024 tokens for most models): with the default prompt (about 300
    tokens) nothing is cached; a long configured prompt is.
    """
    messages = request.messages
    directive = request.directive
    moved = directive is not None and bool(messages) and messages[-1].content == directive
    stable = [request.system] if request.system else []
    if moved and directive is not None:
        stable.append(directive)
        messages = (*messages[:-1], ModelMessage(role="user", content=DIRECTIVE_REMINDER))
    blocks: list[TextBlockParam] = []
    if stable:
        blocks.append(
            TextBlockParam(
                type="text", text="\n\n".join(stable), cache_control={"type": "ephemeral"}
            )
        )
    blocks.extend(
        TextBlockParam(type="text", text=m.content)
        for m in messages
        if m.role == "system" and m.content
    )
    rest = request.model_copy(update={"system": None, "messages": messages, "directive": None})
    return blocks, rest


def build_system_prompt(request: ModelRequest) -> str | None:
    """``request.system`` first, then system-role messages in array order, joined
    by a blank line (compaction-v2.AC2.2, AC2.5). ``None`` when there is no
    system text at all, so the parameter can be omitted rather than sent empty.
    """
    parts = [request.system] if request.system else []
    parts.extend(m.content for m in request.messages if m.role == "system" and m.content)
    return "\n\n".join(parts) if parts else None


def build_messages(request: ModelRequest) -> list[MessageParam]:
    """The non-system messages, shaped the way the Messages API accepts them.

    Consecutive same-role messages are merged (contents joined by a blank
    line) because lifting system messages out can leave two user or two
    assistant turns side by side. Empty contents are skipped: the API rejects
    empty text blocks and they carry nothing to summarise. A leading assistant
    turn gets ``LEADING_USER_PLACEHOLDER`` in front of it; an otherwise empty
    conversation becomes the single ``EMPTY_CONVERSATION_PLACEHOLDER`` user
    turn. We send a placeholder rather than raise because a request whose
    whole content is system text is still a meaningful request for the
    compactor, and refusing it locally would surface as a confusing,
    non-retryable failure.
    """
    turns: list[_Turn] = []
    for message in request.messages:
        if message.role == "system" or not message.content.strip():
            continue
        if turns and turns[-1][0] == message.role:
            turns[-1][1].append(message.content)
        else:
            turns.append((message.role, [message.content]))

    if not turns:
        turns.append(("user", [EMPTY_CONVERSATION_PLACEHOLDER]))
    elif turns[0][0] == "assistant":
        turns.insert(0, ("user", [LEADING_USER_PLACEHOLDER]))

    return [_turn_param(role, "\n\n".join(contents)) for role, contents in turns]


def _turn_param(role: Literal["user", "assistant"], content: str) -> MessageParam:
    if role == "user":
        return UserMessageParam(role="user", content=content)
    return AssistantMessageParam(role="assistant", content=content)


class AnthropicProvider:
    """A ``ModelProvider`` backed by ``anthropic.AsyncAnthropic``.

    ``max_retries`` defaults to 0 because the compactor owns retry policy (and
    answers timeouts by shrinking the chunk, which SDK retries cannot do);
    ``timeout_seconds`` is the SDK's per-call timeout.
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
        prompt_caching: bool = True,
    ) -> None:
        self._prompt_caching = prompt_caching
        self._client = anthropic.AsyncAnthropic(
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
        system: str | list[TextBlockParam] | None
        if self._prompt_caching:
            system, request = cached_prefix_request(request)
            system = system or None
        else:
            system = build_system_prompt(request)
        # anthropic 2.x dropped the ``temperature`` keyword from
        # ``messages.create``; the body field is added directly instead.
        extra_body = (
            {"temperature": request.temperature} if request.temperature is not None else None
        )
        try:
            result = await self._client.messages.create(
                model=request.model,
                max_tokens=request.max_tokens,
                messages=build_messages(request),
                system=system if system is not None else anthropic.omit,
                extra_body=extra_body,
            )
        except anthropic.AnthropicError as exc:
            raise ERRORS.map(exc) from exc
        except ValueError as exc:
            # A 200 whose body is not JSON surfaces as a bare JSONDecodeError.
            raise ModelUnreadableError(
                f"unreadable response body: {exc}", provider=PROVIDER
            ) from exc
        return parse_message(result)


def parse_message(result: object) -> ModelResponse:
    """Map a Messages API result onto ``ModelResponse``.

    The SDK builds responses without validation and hands back a bare string
    when the body is not JSON-typed, so nothing about ``result`` is trusted.
    """
    if not isinstance(result, Message):
        raise ModelUnreadableError(
            f"expected a Message, got {type(result).__name__}", provider=PROVIDER
        )
    blocks = getattr(result, "content", None)
    if not isinstance(blocks, list):
        raise ModelUnreadableError("response has no content blocks", provider=PROVIDER)
    texts = [
        text
        for block in blocks
        if getattr(block, "type", None) == "text"
        and isinstance(text := getattr(block, "text", None), str)
    ]
    text = "".join(texts)
    usage = getattr(result, "usage", None)
    billed = ModelUsage(
        input_tokens=_as_int(getattr(usage, "input_tokens", 0)),
        output_tokens=_as_int(getattr(usage, "output_tokens", 0)),
        cache_read_tokens=_as_int(getattr(usage, "cache_read_input_tokens", 0)),
        cache_write_tokens=_as_int(getattr(usage, "cache_creation_input_tokens", 0)),
    )
    stop_reason = getattr(result, "stop_reason", None)
    if not text:
        raise ModelEmptyResponse(
            f"response has no text (stop_reason={stop_reason})", provider=PROVIDER, usage=billed
        )
    model = getattr(result, "model", None)
    return ModelResponse(
        text=text,
        usage=billed,
        model=model if isinstance(model, str) else None,
        stop_reason=stop_reason if isinstance(stop_reason, str) else None,
    )


def _as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
