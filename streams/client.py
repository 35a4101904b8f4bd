"""A Python client of the worker's HTTP API (docs/openapi.json).

Typed methods for every read view, answers parsed into the models the views
build them with (``streams.http.bodies``; a field a newer worker adds is
ignored, not an error), the bearer token on every request, and retries where
the worker asks for them: a 429 (rate limit) or a 503 (PostgreSQL away, or not
opened yet) is retried after its ``Retry-After``, at most ``max_retries``
times and never waiting more than ``max_wait`` seconds in all; a connection
that fails is retried the same way (every view is a GET: repeating one is
safe). Anything else raises an ``ApiError`` that says what the worker said.

    async with CompactorClient("http://127.0.0.1:6066", token=...) as client:
        async for message in client.history("support-1", tenant_id="acme"):
            ...

"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ValidationError

from core.ports.storage import QueryMode, SearchSources
from streams.http.bodies import (
    BatchPage,
    CompactionLog,
    ContextBody,
    ConversationStatus,
    HistoryPage,
    Message,
    SearchResult,
    UsageReport,
)
from streams.http.probe_bodies import Health

Model = TypeVar("Model", bound=BaseModel)
Sleep = Callable[[float], Awaitable[None]]

RETRIED_STATUSES = frozenset({429, 503})
DEFAULT_RETRY_SECONDS = 1.0


class ApiError(Exception):
    """The worker answered with an error (``status``), or could not be reached (0)."""

    def __init__(self, status: int, message: str, *, url: str) -> None:
        super().__init__(f"{url}: {status} {message}" if status else f"{url}: {message}")
        self.status = status
        self.message = message
        self.url = url


class BadRequest(ApiError):
    """400: a parameter is not valid (the message names it)."""


class Unauthorized(ApiError):
    """401: no token, or not a token this worker knows."""


class Forbidden(ApiError):
    """403: the token may not read that (another tenant's, or a scope it lacks)."""


class NotFound(ApiError):
    """404: no such conversation or batch."""


class RateLimited(ApiError):
    """429, still after the retries."""


class NotYetStored(ApiError):
    """409 from the context view: the message named by ``through`` / ``after`` was not
    stored within ``wait_ms``. The answer never holds an older context instead."""


class Unavailable(ApiError):
    """503 (or no connection), still after the retries."""


class UnexpectedAnswer(ApiError):
    """An answer that is not what the document says (another server, a proxy's page)."""


_ERRORS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: NotYetStored,
    429: RateLimited,
    503: Unavailable,
}


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date; None if absent or bad."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


class CompactorClient:
    """One worker's HTTP API. Use as ``async with``, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        max_wait: float = 60.0,
        sleep: Sleep = asyncio.sleep,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_retries = max_retries
        self._max_wait = max_wait
        self._sleep = sleep
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> CompactorClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    # -- the views ---------------------------------------------------------------

    async def conversation(
        self, conversation_id: str, *, tenant_id: str | None = None
    ) -> ConversationStatus:
        """The worker's token tally: tokens, budget, compactions so far."""
        return await self._get(ConversationStatus, _path(conversation_id), {"tenant_id": tenant_id})

    async def history_page(
        self,
        conversation_id: str,
        *,
        tenant_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> HistoryPage:
        """One page of what the model sees now (the clip-archive first, on page one)."""
        query = {"tenant_id": tenant_id, "limit": limit, "cursor": cursor}
        return await self._get(HistoryPage, _path(conversation_id, "history"), query)

    async def history_pages(
        self, conversation_id: str, *, tenant_id: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[HistoryPage]:
        """Every page, following ``next_cursor``."""
        cursor: str | None = None
        while True:
            page = await self.history_page(
                conversation_id, tenant_id=tenant_id, limit=page_size, cursor=cursor
            )
            yield page
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def history(
        self, conversation_id: str, *, tenant_id: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[Message]:
        """Every message of the live history, in order (the clip-archive first)."""
        async for page in self.history_pages(
            conversation_id, tenant_id=tenant_id, page_size=page_size
        ):
            for message in page.messages:
                yield message

    async def context(
        self,
        conversation_id: str,
        *,
        tenant_id: str | None = None,
        format: Literal["messages", "openai", "anthropic"] = "messages",
        fit: Literal["budget", "window", "none"] = "budget",
        through: str | None = None,
        after: tuple[int, int] | None = None,
        wait_ms: int | None = None,
    ) -> ContextBody:
        """The whole context to send the model now, in ``format``'s request shape
        (``body.request``: pass it to the SDK's create call), never over ``fit``'s
        limit. ``through`` / ``after`` (a message id; the partition and offset the
        producer's ack returned): it includes that message, waiting up to ``wait_ms``
        for it to be stored (``NotYetStored`` otherwise)."""
        query = {
            "tenant_id": tenant_id,
            "format": format,
            "fit": fit,
            "through": through,
            "after": None if after is None else f"{after[0]}:{after[1]}",
            "wait_ms": wait_ms,
        }
        return await self._get(ContextBody, _path(conversation_id, "context"), query)

    async def compactions(
        self, conversation_id: str, *, tenant_id: str | None = None
    ) -> CompactionLog:
        """The conversation's compactions, oldest first, with the batches each archived."""
        return await self._get(
            CompactionLog, _path(conversation_id, "compactions"), {"tenant_id": tenant_id}
        )

    async def batch_page(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        tenant_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> BatchPage:
        """One archived batch: its summary and a page of its raw turns."""
        query = {"tenant_id": tenant_id, "limit": limit, "cursor": cursor}
        return await self._get(BatchPage, _path(conversation_id, "batches", batch_id), query)

    async def batch(
        self,
        conversation_id: str,
        batch_id: str,
        *,
        tenant_id: str | None = None,
        page_size: int | None = None,
    ) -> BatchPage:
        """The batch with every raw turn (all pages read; ``next_cursor`` None)."""
        first = await self.batch_page(
            conversation_id, batch_id, tenant_id=tenant_id, limit=page_size
        )
        turns, cursor = list(first.turns), first.next_cursor
        while cursor is not None:
            page = await self.batch_page(
                conversation_id, batch_id, tenant_id=tenant_id, limit=page_size, cursor=cursor
            )
            turns += page.turns
            cursor = page.next_cursor
        return first.model_copy(update={"turns": turns, "next_cursor": None})

    async def search(
        self,
        query: str,
        *,
        conversation_id: str | None = None,
        tenant_id: str | None = None,
        limit: int = 5,
        sources: SearchSources = "both",
        mode: QueryMode = "plain",
    ) -> SearchResult:
        """``memory_read`` in one conversation, one tenant (or everything, where allowed)."""
        params = {
            "q": query,
            "conversation_id": conversation_id,
            "tenant_id": tenant_id,
            "limit": limit,
            "sources": sources,
            "mode": mode,
        }
        return await self._get(SearchResult, "/memory/search", params)

    async def usage(self, tenant: str, *, since: date | None = None) -> UsageReport:
        """What the tenant's compactions cost, by UTC day (the admin's token, or the
        tenant's own)."""
        path = "/tenants/" + quote(tenant, safe="") + "/usage"
        query = {"since": None if since is None else since.isoformat()}
        return await self._get(UsageReport, path, query)

    async def health(self) -> Health:
        """``/healthz`` (a degraded worker's 503 is returned, not raised)."""
        return await self._get(Health, "/healthz", {}, answers=(200, 503))

    async def openapi(self) -> dict[str, Any]:
        """The worker's OpenAPI document, with its own bounds."""
        body = await self._request("/openapi.json", {})
        if not isinstance(body, dict):
            raise UnexpectedAnswer(200, "the document is not a JSON object", url="/openapi.json")
        return body

    # -- plumbing ----------------------------------------------------------------

    async def _get(
        self,
        model: type[Model],
        path: str,
        query: Mapping[str, object],
        answers: tuple[int, ...] = (200,),
    ) -> Model:
        body = await self._request(path, query, answers)
        try:
            return model.model_validate(body)
        except ValidationError as error:
            raise UnexpectedAnswer(
                200, f"the answer is not a {model.__name__}: {error}", url=self.base_url + path
            ) from None

    async def _request(
        self, path: str, query: Mapping[str, object], answers: tuple[int, ...] = (200,)
    ) -> Any:
        url = self.base_url + path
        params = {k: str(v) for k, v in query.items() if v is not None}
        waited, attempt = 0.0, 0
        while True:
            status, body, wait = await self._once(url, params)
            if status in answers:
                return body
            retriable = status in RETRIED_STATUSES or status == 0
            pause = wait if wait is not None else DEFAULT_RETRY_SECONDS * 2**attempt
            if not retriable or attempt >= self._max_retries or waited + pause > self._max_wait:
                raise _error(status, body, url)
            await self._sleep(pause)
            waited += pause
            attempt += 1

    async def _once(self, url: str, params: dict[str, str]) -> tuple[int, Any, float | None]:
        """(status, body, Retry-After seconds); status 0: no connection."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(url, params=params, headers=self._headers) as answer:
                wait = retry_after_seconds(answer.headers.get("Retry-After"), time.time())
                if answer.content_type == "application/json":
                    return answer.status, await answer.json(), wait
                return answer.status, await answer.text(), wait
        except (aiohttp.ClientConnectionError, TimeoutError) as error:
            return 0, f"no answer: {type(error).__name__}: {error}", None


def _path(conversation_id: str, *rest: str) -> str:
    parts = ["conversations", conversation_id, *rest]
    return "/" + "/".join(quote(part, safe="") for part in parts)


def _error(status: int, body: Any, url: str) -> ApiError:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    else:
        message = str(body)[:200] or "no body"
    kind = _ERRORS.get(status, Unavailable if status == 0 else UnexpectedAnswer)
    return kind(status, message, url=url)
