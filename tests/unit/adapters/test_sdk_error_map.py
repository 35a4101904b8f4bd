"""The SDK-exception → port-error table, row by row, for both SDKs.

Exceptions are built the way each SDK builds them (class per status, the
response attached), without a network: the HTTP round trip is covered by
``tests/integration/test_model_adapters.py``.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from core.adapters.llm import anthropic as anthropic_adapter
from core.adapters.llm import openai_compat as openai_adapter
from core.adapters.llm.errors import ErrorMap
from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)

pytestmark = pytest.mark.unit

REQUEST = httpx2.Request("POST", "http://llm.test/v1/endpoint")

MAPS: dict[str, ErrorMap] = {
    "anthropic": anthropic_adapter.ERRORS,
    "openai": openai_adapter.ERRORS,
}


def status_error(
    cls: type[Any], status: int, *, headers: dict[str, str] | None = None, body: object = None
) -> Exception:
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    error: Exception = cls(f"Error code: {status}", response=response, body=body)
    return error


@dataclass(frozen=True)
class Row:
    provider: str
    exc: Exception
    expected: type[ModelError]
    retryable: bool
    message: str


def http_row(
    provider: str,
    cls: type[Any],
    status: int,
    expected: type[ModelError],
    retryable: bool,
    *,
    body: object = None,
) -> Row:
    return Row(
        provider, status_error(cls, status, body=body), expected, retryable, f"HTTP {status}: "
    )


STATUS_ROWS = [
    http_row("anthropic", anthropic.BadRequestError, 400, ModelResponseError, False),
    http_row("anthropic", anthropic.AuthenticationError, 401, ModelAuthError, False),
    # PaymentRequiredError came in anthropic 2.10; before it a 402 was a bare
    # APIStatusError (pyproject's minimum is older, scripts/test-sdk-minimums).
    http_row(
        "anthropic",
        getattr(anthropic, "PaymentRequiredError", anthropic.APIStatusError),
        402,
        ModelResponseError,
        False,
    ),
    http_row("anthropic", anthropic.PermissionDeniedError, 403, ModelAuthError, False),
    http_row("anthropic", anthropic.NotFoundError, 404, ModelResponseError, False),
    http_row("anthropic", anthropic.RequestTimeoutError, 408, ModelTimeoutError, True),
    http_row("anthropic", anthropic.ContentTooLargeError, 413, ModelResponseError, False),
    http_row("anthropic", anthropic.UnprocessableEntityError, 422, ModelResponseError, False),
    http_row("anthropic", anthropic.RateLimitError, 429, ModelRateLimitError, True),
    http_row("anthropic", anthropic.InternalServerError, 500, ModelServerError, True),
    http_row("anthropic", anthropic.InternalServerError, 502, ModelServerError, True),
    http_row("anthropic", anthropic.ServiceUnavailableError, 503, ModelServerError, True),
    http_row("anthropic", anthropic.GatewayTimeoutError, 504, ModelServerError, True),
    http_row("anthropic", anthropic.OverloadedError, 529, ModelServerError, True),
    # An error event inside a 200 stream arrives as a bare APIStatusError.
    http_row("anthropic", anthropic.APIStatusError, 200, ModelResponseError, False),
    http_row("openai", openai.BadRequestError, 400, ModelResponseError, False),
    http_row("openai", openai.AuthenticationError, 401, ModelAuthError, False),
    http_row("openai", openai.PermissionDeniedError, 403, ModelAuthError, False),
    http_row("openai", openai.NotFoundError, 404, ModelResponseError, False),
    # OpenAI's SDK has no 408 class: the status alone decides.
    http_row("openai", openai.APIStatusError, 408, ModelTimeoutError, True),
    http_row("openai", openai.APIStatusError, 413, ModelResponseError, False),
    http_row("openai", openai.UnprocessableEntityError, 422, ModelResponseError, False),
    http_row("openai", openai.RateLimitError, 429, ModelRateLimitError, True),
    http_row(
        "openai",
        openai.RateLimitError,
        429,
        ModelAuthError,
        False,
        body={"code": "insufficient_quota", "message": "You exceeded your current quota"},
    ),
    http_row(
        "openai",
        openai.RateLimitError,
        429,
        ModelRateLimitError,
        True,
        body={"code": "rate_limit_exceeded", "message": "slow down"},
    ),
    http_row("openai", openai.InternalServerError, 500, ModelServerError, True),
    http_row("openai", openai.InternalServerError, 503, ModelServerError, True),
    # Not something either SDK builds, but the table still has a row for it.
    http_row("openai", openai.APIStatusError, 599, ModelServerError, True),
]

OTHER_ROWS = [
    Row(
        "anthropic",
        anthropic.APITimeoutError(request=REQUEST),
        ModelTimeoutError,
        True,
        "request timed out",
    ),
    Row(
        "openai",
        openai.APITimeoutError(request=REQUEST),
        ModelTimeoutError,
        True,
        "request timed out",
    ),
    Row(
        "anthropic",
        anthropic.APIConnectionError(request=REQUEST),
        ModelServerError,
        True,
        "connection failed: Connection error.",
    ),
    Row(
        "openai",
        openai.APIConnectionError(message="refused", request=REQUEST),
        ModelServerError,
        True,
        "connection failed: refused",
    ),
    Row(
        "anthropic",
        anthropic.CredentialsError("no API key found"),
        ModelAuthError,
        False,
        "no API key found",
    ),
    # Anything no row claims: non-retryable, and named so it can be diagnosed.
    Row(
        "anthropic",
        anthropic.AnthropicError("odd"),
        ModelResponseError,
        False,
        "AnthropicError: odd",
    ),
    Row(
        "openai",
        openai.APIResponseValidationError(httpx2.Response(200, request=REQUEST), body=None),
        ModelResponseError,
        False,
        "APIResponseValidationError: ",
    ),
    Row("openai", openai.OpenAIError("odd"), ModelResponseError, False, "OpenAIError: odd"),
]


def _row_id(row: Row) -> str:
    status = getattr(row.exc, "status_code", None)
    return f"{row.provider}-{type(row.exc).__name__}" + (f"-{status}" if status else "")


@pytest.mark.parametrize("row", STATUS_ROWS + OTHER_ROWS, ids=_row_id)
def test_each_sdk_exception_maps_to_its_port_error(row: Row) -> None:
    error = MAPS[row.provider].map(row.exc)

    assert type(error) is row.expected
    assert error.retryable is row.retryable
    assert error.provider == row.provider
    assert str(error).startswith(row.message)


@pytest.mark.parametrize("row", STATUS_ROWS, ids=_row_id)
def test_server_errors_carry_the_status_and_rate_limits_a_retry_after(row: Row) -> None:
    error = MAPS[row.provider].map(row.exc)

    if isinstance(error, ModelServerError):
        assert error.status == getattr(row.exc, "status_code", None)
    if isinstance(error, ModelRateLimitError):
        assert error.retry_after is None  # the rows send no retry-after header


@pytest.mark.parametrize("provider", sorted(MAPS))
def test_connection_failures_carry_no_status(provider: str) -> None:
    sdk = anthropic if provider == "anthropic" else openai
    error = MAPS[provider].map(sdk.APIConnectionError(request=REQUEST))

    assert isinstance(error, ModelServerError)
    assert error.status is None


def test_anthropic_detail_is_the_body_message_not_the_raw_body() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    exc = status_error(anthropic.OverloadedError, 529, body=body)

    assert str(anthropic_adapter.ERRORS.map(exc)) == "HTTP 529: Overloaded"


def test_openai_detail_is_the_sdk_message() -> None:
    exc = status_error(openai.BadRequestError, 400, body={"message": "bad"})

    assert str(openai_adapter.ERRORS.map(exc)) == "HTTP 400: Error code: 400"


@dataclass(frozen=True)
class HttpDate:
    """A ``retry-after`` HTTP-date this many seconds from when the test runs
    (not when it is collected, which can be minutes earlier)."""

    offset: float

    def render(self) -> str:
        return email.utils.formatdate(time.time() + self.offset, usegmt=True)


RETRY_AFTER_ROWS = [
    ({"retry-after": "7"}, 7.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after": "0"}, 0.0),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
    ({"retry-after": "-3"}, 0.0),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "inf"}, None),
    ({}, None),
    ({"retry-after": HttpDate(-3600)}, 0.0),
    ({"retry-after": HttpDate(120)}, pytest.approx(120, abs=2)),
]


@pytest.mark.parametrize("provider", sorted(MAPS))
@pytest.mark.parametrize(
    ("headers", "expected"),
    RETRY_AFTER_ROWS,
    ids=[
        "seconds",
        "fractional-seconds",
        "zero",
        "ms-wins",
        "negative-clamped",
        "garbage",
        "infinite",
        "absent",
        "http-date-past",
        "http-date-future",
    ],
)
def test_rate_limit_retry_after(
    provider: str, headers: dict[str, str | HttpDate], expected: object
) -> None:
    rendered = {k: v.render() if isinstance(v, HttpDate) else v for k, v in headers.items()}
    cls = anthropic.RateLimitError if provider == "anthropic" else openai.RateLimitError
    error = MAPS[provider].map(status_error(cls, 429, headers=rendered))

    assert isinstance(error, ModelRateLimitError)
    assert error.retry_after == expected
