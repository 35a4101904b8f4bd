"""The views' query parameters as pydantic models, for the OpenAPI document.

The views check their parameters themselves (a bad one is a 400 whose
``error`` names it); ``streams.http.openapi`` documents them from these
models, and ``tests/unit/http/test_openapi.py`` fails when a view reads a
parameter no model here declares.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.domain.tenancy import TENANT_ID_PATTERN
from core.ports.storage import QueryMode, SearchSources
from streams.events import MAX_ID_LENGTH
from streams.http.pages import MAX_CURSOR_CHARS

TenantParam = Annotated[
    str,
    Field(
        pattern=TENANT_ID_PATTERN,
        description="The conversation's tenant. A tenant-bound token reads its own tenant "
        "(naming another is 403); any other token names it here (absent: the conversations "
        "without a tenant).",
    ),
]


class Params(BaseModel):
    """A view's query parameters, for the document (the views check them: a bad one is
    a 400 whose ``error`` names it). Bounds set by ``[service]`` are filled in by
    ``streams.http.openapi`` from the worker's settings."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class TenantParams(Params):
    tenant_id: TenantParam | None = None


class PageParams(TenantParams):
    limit: int | None = Field(
        default=None,
        ge=1,
        description="Messages per page ([service].page_default_limit when absent, "
        "[service].page_max_limit at most)",
    )
    cursor: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="The previous page's next_cursor (opaque)",
    )


class SearchParams(Params):
    q: str = Field(min_length=1, description="The query ([service].max_query_chars at most)")
    conversation_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="Search this conversation (with tenant_id: that tenant's)",
    )
    tenant_id: TenantParam | None = None
    limit: int = Field(default=5, ge=1, description="Hits ([service].max_search_limit at most)")
    sources: SearchSources = "both"
    mode: QueryMode = Field(
        default="plain", description="websearch: quoted phrases, or, -word (PostgreSQL's syntax)"
    )


class RecompactParams(TenantParams):
    request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="The request's id: the same id again is the same compaction (a client "
        "that retries should send its own; absent: a new one is made)",
    )


class RestoreParams(RecompactParams):
    batch_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="The archived batch whose raw turns come back (absent: the newest)",
    )


class UsageParams(Params):
    since: date | None = Field(default=None, description="From this UTC day on (YYYY-MM-DD)")


class ContextParams(TenantParams):
    format: Literal["messages", "openai", "anthropic"] = Field(
        default="messages",
        description="messages: the service's own; openai: Chat Completions messages (the "
        "clip-archive a system message, tool_calls and tool messages); anthropic: system + "
        "messages with tool_use / tool_result blocks, one role at a time, the user first",
    )
    fit: Literal["budget", "window", "none"] = Field(
        default="budget",
        description="Over this limit the oldest part becomes a provisional clip-archive (no "
        "model): budget (context_budget x model_max_tokens), window (model_max_tokens), none",
    )
    through: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="A message id the answer must include (live or summarised); 409 when it "
        "is not stored within wait_ms",
    )
    after: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,9}:[0-9]{1,19}$",
        description="partition:offset of a record of this conversation (the producer's ack) "
        "the answer must include; 409 when it is not stored within wait_ms",
    )
    wait_ms: int = Field(
        default=0,
        ge=0,
        description="How long to wait for through/after ([service].context_max_wait_ms at most)",
    )
