"""The model port: what the compactor asks of any LLM.

``role: "system"`` is a first-class message role here (compaction-v2.AC2.1);
each adapter translates it into what its provider accepts.

Adapters raise only the ``ModelError`` family, so retry policy lives in one
place (the compactor) and never depends on which SDK is underneath.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

ModelRole = Literal["system", "user", "assistant"]


class ModelMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    role: ModelRole
    content: str


class ModelRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    messages: tuple[ModelMessage, ...]
    system: str | None = None
    max_tokens: int = Field(gt=0)
    temperature: float | None = None
    # The fixed instructions, when the last message states them: the same in every
    # request, so a provider with prompt caching may move them into the cached prefix.
    directive: str | None = None


class ModelUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = 0  # billed at the input price (cache reads and writes apart)
    output_tokens: int = 0
    cache_read_tokens: int = 0  # a cached prompt prefix read (prompt caching)
    cache_write_tokens: int = 0  # a prompt prefix written to the cache


class ModelResponse(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    usage: ModelUsage = ModelUsage()
    model: str | None = None
    stop_reason: str | None = None


class ModelProvider(Protocol):
    """Anything that can complete a ``ModelRequest``.

    ``name`` identifies the provider in logs and metrics ("anthropic",
    "openai", "extractive").
    """

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


class ModelError(Exception):
    """Base of every failure an adapter reports.

    ``retryable`` tells the compactor whether trying again can help.
    """

    retryable: bool = False

    def __init__(self, message: str, *, provider: str | None = None) -> None:
        super().__init__(message)
        self.provider = provider


class ModelTimeoutError(ModelError):
    """The call did not finish within the per-call timeout.

    The compactor answers this by halving the chunk, since a smaller request
    is the one thing under its control that makes the call faster.
    """

    retryable = True


class ModelRateLimitError(ModelError):
    retryable = True

    def __init__(
        self, message: str, *, retry_after: float | None = None, provider: str | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        self.retry_after = retry_after


class ModelServerError(ModelError):
    """5xx, overload or a broken connection: transient by nature."""

    retryable = True

    def __init__(
        self, message: str, *, status: int | None = None, provider: str | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        self.status = status


class ModelUnreadableError(ModelServerError):
    """A 200 whose body is no response at all: broken JSON, an HTML page, JSON
    of another shape. The path to the provider is broken (a proxy's error page,
    a cut connection), not the request: like a 502, transient and the provider's,
    never held against the conversation that happened to send it."""


class ModelAuthError(ModelError):
    """Bad key or forbidden model: retrying cannot help."""


class ModelResponseError(ModelError):
    """The provider answered this request, but not with something we can use (no
    text, a 4xx that is not auth or rate limiting): the request's own trouble. A
    body that is no response at all is ``ModelUnreadableError``."""


class ModelEmptyResponse(ModelResponseError):
    """The provider finished its answer with no text. To the summariser that is an
    empty summary, which the gate refuses and the conversation falls back to the
    extractive summariser, rather than asking the LLM again (one session's
    compactions came back empty 47 % of the time: openclaw #120663). ``usage``:
    what the call was billed, as the response said."""

    def __init__(
        self, message: str, *, provider: str | None = None, usage: ModelUsage | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        self.usage = usage or ModelUsage()
