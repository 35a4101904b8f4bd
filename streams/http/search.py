"""``/memory/search``: archived summaries and raw turns found by a query
(``memory_read``), in the caller's read scope."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import faust
from faust.web import Request, Response, View

from core.domain.tenancy import conversation_key
from core.ports.storage import MemorySearch, QueryMode, SearchSources
from core.settings import ServiceSettings, Settings
from streams.events import MAX_ID_LENGTH
from streams.http import bodies
from streams.http.access import (
    Forbidden,
    bad_text,
    json_body,
    principal_of,
    problem_response,
    read_scope,
    requested_tenant,
)
from streams.http.auth import Principal


class SearchViewPorts(Protocol):
    @property
    def memory(self) -> MemorySearch: ...


_SOURCES: tuple[SearchSources, ...] = ("both", "summaries", "raw")
_MODES: tuple[QueryMode, ...] = ("plain", "websearch")


def search_options(query: Any) -> tuple[SearchSources, QueryMode]:
    """``sources`` and ``mode`` of a memory search request; ValueError names a bad one."""
    sources, mode = query.get("sources", "both"), query.get("mode", "plain")
    for name, value, allowed in (("sources", sources, _SOURCES), ("mode", mode, _MODES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return sources, mode


@dataclass(frozen=True)
class SearchRequest:
    query: str
    conversation_key: str | None  # one conversation (its tenant's, when tenant_id is set)
    tenant_id: str | None
    limit: int
    sources: SearchSources
    mode: QueryMode


def search_request(
    query: Mapping[str, str], principal: Principal, service: ServiceSettings
) -> SearchRequest:
    """A memory search as asked; ValueError (400) or Forbidden (403) says why not."""
    text = query.get("q", "")
    problem = bad_text("q", text, service.max_query_chars)
    raw_limit = query.get("limit", "5")
    if problem is None and (len(raw_limit) > 4 or not raw_limit.isdigit()):
        problem = f"limit must be a whole number from 1 to {service.max_search_limit}"
    if problem is None and not 1 <= int(raw_limit) <= service.max_search_limit:
        problem = f"limit must be a whole number from 1 to {service.max_search_limit}"
    conversation_id = query.get("conversation_id")
    if problem is None and conversation_id is not None:
        problem = bad_text("conversation_id", conversation_id, MAX_ID_LENGTH)
    if problem is not None:
        raise ValueError(problem)
    sources, mode = search_options(query)
    tenant = requested_tenant(query, principal)
    if tenant is None and conversation_id is None and not service.allow_global_search:
        raise ValueError(
            "memory search needs conversation_id or tenant_id (a search across every "
            "conversation needs [service].allow_global_search = true)"
        )
    key = None if conversation_id is None else conversation_key(tenant, conversation_id)
    return SearchRequest(text, key, tenant, int(raw_limit), sources, mode)


def register_search(app: faust.App, settings: Settings, runtime: SearchViewPorts) -> None:
    @app.page("/memory/search")
    class MemorySearchView(View):
        async def get(self, request: Request) -> Response:
            principal = principal_of(request)
            try:
                asked = search_request(request.query, principal, settings.service)
            except ValueError as error:
                return problem_response(self, str(error), 400)
            except Forbidden:
                return problem_response(self, bodies.FORBIDDEN, 403)
            try:
                result = await runtime.memory.memory_read(
                    asked.query,
                    conversation_id=asked.conversation_key,
                    limit=asked.limit,
                    sources=asked.sources,
                    mode=asked.mode,
                    tenant_id=asked.tenant_id,
                    scope=read_scope(principal),
                )
            except ValueError as error:
                return problem_response(self, str(error), 400)
            return self.json(json_body(bodies.SearchResult.of(result)))
