"""How an SDK's HTTP failures become the port's errors, for every adapter at once.

The Anthropic and OpenAI SDKs are generated from the same template, so their
exceptions have the same shape (``APITimeoutError`` under
``APIConnectionError``, ``APIStatusError`` with ``status_code`` and
``response``, one subclass per well-known status). One ordered table, walked
first-match-wins as httpx walks its own exception map, therefore serves both;
an adapter passes its SDK's classes and the few rules only its provider needs.

Both SDKs are told not to retry (the compactor owns retry policy), so the
server's own back-off hint has to be lifted out of the 429 response here and
carried on ``ModelRateLimitError.retry_after``.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.ports.model import (
    ModelAuthError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelTimeoutError,
)


class _HasHeaders(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...


class SdkStatusError(Protocol):
    """What the mapper reads from either SDK's ``APIStatusError``."""

    @property
    def message(self) -> str: ...

    @property
    def status_code(self) -> int: ...

    @property
    def response(self) -> _HasHeaders: ...


class SdkConnectionError(Protocol):
    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class SdkErrors:
    """One SDK's exception classes, named by the part each plays in the shared table."""

    timeout: type[Exception]
    """``APITimeoutError``."""
    connection: type[SdkConnectionError]
    """``APIConnectionError`` (``timeout``'s base class)."""
    status: type[SdkStatusError]
    """``APIStatusError``, base of every HTTP-status exception."""
    rate_limit: type[SdkStatusError]
    """``RateLimitError`` (429)."""
    auth: tuple[type[SdkStatusError], ...]
    """``AuthenticationError`` (401) and ``PermissionDeniedError`` (403)."""
    server: type[SdkStatusError]
    """``InternalServerError``: every 5xx, and Anthropic's 529 ``OverloadedError``."""
    request_timeout: type[SdkStatusError] | None = None
    """``RequestTimeoutError`` (408), where the SDK has one (Anthropic's does,
    OpenAI's does not: there the status code decides)."""


@dataclass(frozen=True)
class ErrorRule:
    """One row: instances of ``sdk`` for which ``when`` holds become ``port``."""

    sdk: type[object] | tuple[type[object], ...]
    port: type[ModelError]
    when: Callable[[Exception], bool] | None = None

    def matches(self, exc: Exception) -> bool:
        return isinstance(exc, self.sdk) and (self.when is None or self.when(exc))


def shared_rules(sdk: SdkErrors) -> tuple[ErrorRule, ...]:
    """The rows both SDKs share. Subclasses come before their bases because the
    first match wins: a timeout is also a connection error, and a 429 or 529
    is also a status error."""

    def status(predicate: Callable[[int], bool]) -> Callable[[Exception], bool]:
        return lambda exc: isinstance(exc, sdk.status) and predicate(exc.status_code)

    return (
        ErrorRule(sdk.timeout, ModelTimeoutError),
        ErrorRule(sdk.connection, ModelServerError),
        ErrorRule(sdk.rate_limit, ModelRateLimitError),
        ErrorRule(sdk.auth, ModelAuthError),
        ErrorRule(sdk.request_timeout, ModelTimeoutError)
        if sdk.request_timeout is not None
        else ErrorRule(sdk.status, ModelTimeoutError, when=status(lambda code: code == 408)),
        ErrorRule(sdk.server, ModelServerError),
        ErrorRule(sdk.status, ModelServerError, when=status(lambda code: code >= 500)),
        ErrorRule(sdk.status, ModelResponseError),
    )


@dataclass(frozen=True)
class ErrorMap:
    """A provider's whole table: its own rows first, so they can narrow a shared
    row (a 429 that is really a billing stop), then ``shared_rules``."""

    provider: str
    sdk: SdkErrors
    rules: tuple[ErrorRule, ...]

    @classmethod
    def for_sdk(cls, provider: str, sdk: SdkErrors, *, extra: Sequence[ErrorRule] = ()) -> ErrorMap:
        return cls(provider, sdk, (*extra, *shared_rules(sdk)))

    def map(self, exc: Exception) -> ModelError:
        """The port error for ``exc``; anything no row claims is a non-retryable
        ``ModelResponseError`` naming the SDK's class, so a new SDK exception
        can never slip past the compactor as a foreign type."""
        for rule in self.rules:
            if rule.matches(exc):
                return self._build(rule.port, exc)
        return ModelResponseError(f"{type(exc).__name__}: {exc}", provider=self.provider)

    def _build(self, port: type[ModelError], exc: Exception) -> ModelError:
        if isinstance(exc, self.sdk.status):
            message = describe_status(exc)
            if issubclass(port, ModelRateLimitError):
                retry_after = parse_retry_after(exc.response.headers)
                return port(message, retry_after=retry_after, provider=self.provider)
            if issubclass(port, ModelServerError):
                return port(message, status=exc.status_code, provider=self.provider)
            return port(message, provider=self.provider)
        if isinstance(exc, self.sdk.timeout):
            # The SDK's own wording is a paragraph of advice; the kind is what matters.
            return port("request timed out", provider=self.provider)
        if isinstance(exc, self.sdk.connection):
            return port(f"connection failed: {exc.message}", provider=self.provider)
        return port(str(exc), provider=self.provider)


def describe_status(exc: SdkStatusError) -> str:
    """``HTTP <status>: <detail>``. Anthropic's SDK lifts the body's
    ``error.message`` into ``api_message``, which reads better than its
    ``message`` (the raw body); OpenAI's has no such attribute."""
    detail = getattr(exc, "api_message", None) or exc.message
    return f"HTTP {exc.status_code}: {detail}"


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or ``None`` when it gave no usable hint.

    Honours, in order, the non-standard ``retry-after-ms`` (OpenAI and several
    gateways send it and it is the more precise), ``retry-after`` as seconds
    (fractions allowed, as both SDKs accept), and ``retry-after`` as an
    HTTP-date. Negative waits clamp to zero; garbage yields ``None`` rather
    than an error, because a missing hint must never turn a rate limit into a
    different failure.
    """
    millis = _finite_float(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000.0, 0.0)

    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_float(raw)
    if seconds is not None:
        return max(seconds, 0.0)

    try:
        moment = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(moment.timestamp() - current, 0.0)


def _finite_float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None
