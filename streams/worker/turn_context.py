"""The context a platform sends its model, read at every turn: one call, always
within the window, never waiting for a compaction.

``TurnContexts.answer`` is the whole read (``GET /conversations/{id}/context``):

1. **Read-your-writes.** With ``through`` (a message id) or ``after`` (the
   partition and offset the producer's ack returned) it waits, at most
   ``wait_seconds``, until the store has that message, woken by the ingest of
   this worker (``IngestNotices``) or, for a conversation another worker
   ingests, by its own poll; past the wait the answer is ``NotYet``, never a
   silently older context.
2. **Unchanged, answered from memory.** Each look is one round trip
   (``ContextReader.context_look``): the conversation's version (its newest
   arrival number and rows), and its history only when that version is not the
   one an answer was rendered for. Rendered answers are reused (a cache bounded
   by bytes), so a platform reading a context it read before costs one index
   lookup, not the whole history.
3. **Fitted.** Over its limit (``fit=budget``, the default: the budget;
   ``window``: the model's whole window; ``none``: as stored), the history is
   fitted at read time (``core.domain.context_fit``: the oldest part as a
   provisional clip-archive built without a model, in bounded time, off the
   event loop), so the answer is never over the limit whatever the compaction
   is doing; the LLM compaction replaces it when it lands.
4. **Shaped** for the provider (``core.domain.provider_shapes``) or as the
   service's own messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from cachetools import LRUCache

from core.domain.budget import BudgetConfig
from core.domain.context_fit import AsStored, FitSettings, FittedContext, fit_context
from core.domain.provider_shapes import anthropic_shape, openai_shape
from core.domain.tenancy import ConversationRef
from core.ports.storage import (
    ContextLook,
    ContextReader,
    ContextSnapshot,
    ContextVersion,
    ReadScope,
)
from streams.events import public_message
from streams.metrics import Metrics
from streams.worker.ingest_notices import IngestNotices

Shape = Literal["openai", "anthropic", "messages"]
Fit = Literal["budget", "window", "none"]
# Polled this often when no notice is to be expected (a conversation another
# worker ingests, or a new one) ...
POLL_SECONDS = 0.025
# ... and this often when one is (this worker stored it lately): a safety net for a
# partition that moved away, not the way the reader is woken.
NOTICED_POLL_SECONDS = 0.25
# Up to this much text the fit runs on the event loop: a few milliseconds (4 ms
# for 260 turns, 52,000 characters), less than a thread's hand-off and the GIL's
# switching cost a read on a busy worker; above it, in a thread.
INLINE_FIT_CHARS = 256_000


class ContextPorts(Protocol):
    @property
    def context(self) -> ContextReader: ...


@dataclass(frozen=True)
class ContextRequest:
    conversation_key: str
    scope: ReadScope
    shape: Shape = "messages"
    fit: Fit = "budget"
    through: str | None = None  # a message id the answer must include
    after: tuple[int, int] | None = None  # (partition, offset) the answer must include
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class Served:
    body: bytes
    etag: str
    provisional: bool


@dataclass(frozen=True)
class NotYet:
    """The message asked for is not stored within the wait."""

    version: ContextVersion


@dataclass(frozen=True)
class Unknown:
    """No conversation of that id in the caller's scope."""


ContextAnswer = Served | NotYet | Unknown


@dataclass(frozen=True)
class _Rendered:
    """What a history version renders to, before the per-request envelope."""

    version: tuple[int, int]
    request: bytes  # the provider's request part, JSON
    fields: dict[str, Any]  # token_estimate, provisional, ...


class TurnContexts:
    def __init__(
        self,
        runtime: ContextPorts,
        budget: BudgetConfig,
        notices: IngestNotices,
        metrics: Metrics,
        *,
        pending: Callable[[str], str | None] = lambda _: None,
        cache_bytes: int = 64 * 1024 * 1024,
        fit_settings: FitSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float = POLL_SECONDS,
        noticed_poll_seconds: float = NOTICED_POLL_SECONDS,
    ) -> None:
        """``pending``: the compaction in flight for a conversation, when this worker
        holds its table entry (None otherwise, or when there is none)."""
        self._polls = (poll_seconds, noticed_poll_seconds)
        self._runtime = runtime
        self._budget = budget
        self._notices = notices
        self._metrics = metrics
        self._pending = pending
        self._fit_settings = fit_settings or FitSettings()
        self._clock = clock
        self._cache: LRUCache[tuple[str, Shape, Fit], _Rendered] = LRUCache(
            maxsize=cache_bytes, getsizeof=lambda r: len(r.request) + 512
        )

    async def answer(self, request: ContextRequest) -> ContextAnswer:
        key = (request.conversation_key, request.shape, request.fit)
        cached = self._cache.get(key)
        look = await self._settled(request, None if cached is None else cached.version)
        version = look.version if isinstance(look, ContextSnapshot) else look
        if not _satisfied(version, request):
            self._metrics.context_reads.labels(request.shape, "not_yet").inc()
            return NotYet(version)
        if not version.exists:  # never was, or erased: nothing of it stays here
            self._forget(request.conversation_key)
            return Unknown()
        if isinstance(look, ContextSnapshot):
            rendered, outcome = await self._render(request, look), "read"
            self._cache[key] = rendered
        else:  # the look found the version the cache holds
            assert cached is not None and cached.version == version.version
            rendered, outcome = cached, "cached"
        provisional = bool(rendered.fields["provisional"])
        self._metrics.context_reads.labels(request.shape, outcome).inc()
        if provisional:
            self._metrics.context_provisional.inc()
        return self._served(request, version, rendered)

    def _forget(self, conversation_key: str) -> None:
        for shape in get_args(Shape):
            for fit in get_args(Fit):
                self._cache.pop((conversation_key, shape, fit), None)

    async def _settled(self, request: ContextRequest, known: tuple[int, int] | None) -> ContextLook:
        """Where the conversation stands once it includes what ``request`` asks for or
        its wait is over: a snapshot, or the version alone when that is ``known``.
        Each look is one round trip; the history comes with it only when it moved."""
        deadline = self._clock() + min(request.wait_seconds, 60.0)
        reader = self._runtime.context
        key = request.conversation_key
        latest: ContextSnapshot | None = None  # read by an earlier look of this wait
        while True:
            seen = self._notices.mark(key)  # before the look: a store after it wakes us
            look = await reader.context_look(
                key, scope=request.scope, through=request.through, known=known
            )
            if isinstance(look, ContextSnapshot):
                latest, known = look, look.version.version
            elif latest is not None and look.version == latest.version.version:
                look = ContextSnapshot(look, latest.history)  # its newer watermark
            version = look.version if isinstance(look, ContextSnapshot) else look
            left = deadline - self._clock()
            if _satisfied(version, request) or left <= 0:
                return look
            poll = self._polls[seen is not None]
            await self._notices.wait(key, min(left, poll), seen=seen)

    async def _render(self, request: ContextRequest, snapshot: ContextSnapshot) -> _Rendered:
        limit = self._limit(request.fit)
        stored = sum(s.tokens for s in snapshot.history)
        if limit is None or stored <= limit:
            fitted: FittedContext = AsStored(snapshot.history, stored)
        elif sum(len(s.message.content) for s in snapshot.history) <= INLINE_FIT_CHARS:
            fitted = fit_context(snapshot.history, limit, self._fit_settings)
        else:  # bounded, but tens of milliseconds: not on the loop
            fitted = await asyncio.to_thread(
                fit_context, snapshot.history, limit, self._fit_settings
            )
        payload = _shaped(request.shape, [s.message for s in fitted.messages])
        folded = 0 if isinstance(fitted, AsStored) else len(fitted.folded)
        return _Rendered(
            version=snapshot.version.version,
            request=json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(),
            fields={
                "token_estimate": fitted.tokens,
                "stored_tokens": stored,
                "limit": limit,
                "provisional": not isinstance(fitted, AsStored),
                "folded_messages": folded,
                "shortened": getattr(fitted, "shortened", False),
            },
        )

    def _limit(self, fit: Fit) -> int | None:
        if fit == "none":
            return None
        if fit == "window":
            return self._budget.model_max_tokens
        return self._budget.budget_tokens

    def _served(
        self, request: ContextRequest, version: ContextVersion, rendered: _Rendered
    ) -> Served:
        ref = ConversationRef.of_key(request.conversation_key)
        mark = version.watermark
        envelope = {
            "conversation_id": ref.conversation_id,
            "tenant_id": ref.tenant_id,
            "format": request.shape,
            "fit": request.fit,
            **rendered.fields,
            "budget": self._budget.budget_tokens,
            "model_max_tokens": self._budget.model_max_tokens,
            "pending_compaction": self._pending(request.conversation_key),
            "watermark": {
                "message_id": mark.message_id,
                "partition": mark.partition,
                "offset": mark.offset,
                "seq": rendered.version[0],
            },
        }
        head = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
        body = head[:-1].encode() + b',"request":' + rendered.request + b"}"
        etag = hashlib.sha256(body).hexdigest()[:32]
        return Served(body, f'"{etag}"', bool(rendered.fields["provisional"]))


def _satisfied(version: ContextVersion, request: ContextRequest) -> bool:
    if request.through is not None and not version.includes:
        return False
    if request.after is not None:
        return version.watermark.covers(*request.after)
    return True


def _shaped(shape: Shape, messages: list[Any]) -> dict[str, Any]:
    """The provider's request part: ``messages`` (and Anthropic's ``system``)."""
    if shape == "openai":
        return {"messages": openai_shape(messages)}
    if shape == "anthropic":
        shaped = anthropic_shape(messages)
        return {"system": shaped.system, "messages": shaped.messages}
    return {
        "messages": [public_message(m).model_dump(mode="json", exclude_none=True) for m in messages]
    }
