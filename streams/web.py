"""HTTP views of a worker (JSON), served by Faust's web server.

``/conversations/{id}`` reads the token table, which is partitioned: a request
reaching the wrong worker is forwarded to the one that owns the key (the
owner of the conversation's messages partition). The bodies are built by
plain functions, so their shape is testable without a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import faust
from faust.web import Request, Response, View

from core.accounting import ConversationTally
from core.budget import BudgetConfig, over_budget
from core.clip_archive import is_clip_archive
from core.messages import ConversationMessage
from core.settings import Settings
from core.storage.ports import ExpandedBatch, QueryMode, SearchSources
from core.tokens import estimate_history_tokens
from streams.wiring import LazyRuntime
from streams.worker import Components


def conversation_body(tally: ConversationTally, budget: BudgetConfig) -> dict[str, Any]:
    return {
        "conversation_id": tally.conversation_id,
        "token_total": tally.token_total,
        "message_count": tally.message_count,
        "budget_tokens": budget.budget_tokens,
        "over_budget": over_budget(tally.token_total, budget),
        "compactions": tally.compactions,
        "generation": tally.generation,
        "compaction_outstanding": tally.outstanding,
    }


def history_body(conversation_id: str, history: Sequence[ConversationMessage]) -> dict[str, Any]:
    first = history[0] if history else None
    return {
        "conversation_id": conversation_id,
        "token_estimate": estimate_history_tokens(history),
        "clip_archive": first.model_dump(mode="json")
        if first is not None and is_clip_archive(first)
        else None,
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in history],
    }


_SOURCES: tuple[SearchSources, ...] = ("both", "summaries", "raw")
_MODES: tuple[QueryMode, ...] = ("plain", "websearch")


def search_options(query: Any) -> tuple[SearchSources, QueryMode]:
    """``sources`` and ``mode`` of a memory search request; ValueError names a bad one."""
    sources, mode = query.get("sources", "both"), query.get("mode", "plain")
    for name, value, allowed in (("sources", sources, _SOURCES), ("mode", mode, _MODES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return sources, mode


def batch_body(expanded: ExpandedBatch) -> dict[str, Any]:
    """A batch with every raw turn it covers, in conversation order."""
    stored = expanded.batch
    return {
        "batch_id": stored.id,
        "label": stored.label,
        "conversation_id": stored.conversation_id,
        "depth": stored.batch.depth,
        "start_time": stored.batch.start_time.isoformat(),
        "end_time": stored.batch.end_time.isoformat(),
        "message_count": stored.batch.message_count,
        "superseded_by": stored.superseded_by,
        "summary": stored.batch.content,
        "turns": [m.model_dump(mode="json", exclude_none=True) for m in expanded.turns],
        "turns_missing": expanded.turns_missing,
    }


def unknown(conversation_id: str) -> dict[str, str]:
    return {"error": f"unknown conversation {conversation_id!r}"}


def register_views(
    app: faust.App, settings: Settings, components: Components[Any], resources: LazyRuntime
) -> None:
    register_operations(app, components, resources)
    register_conversations(app, settings, components, resources)


def register_operations(
    app: faust.App, components: Components[Any], resources: LazyRuntime
) -> None:
    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            assignment = app.consumer.assignment() if app.consumer is not None else set()
            health = components.health
            return self.json(
                {
                    "status": "ok" if health.ok else "degraded",
                    "problems": health.describe(),
                    "app_id": app.conf.id,
                    "summariser": resources.resolved_model.kind,
                    "assigned_partitions": sorted(
                        f"{tp.topic}:{tp.partition}" for tp in assignment
                    ),
                },
                status=200 if health.ok else 503,
            )

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(components.metrics.render(), content_type="text/plain; version=0.0.4")


def register_conversations(
    app: faust.App, settings: Settings, components: Components[Any], resources: LazyRuntime
) -> None:
    budget = settings.budget
    tallies = components.table
    # The owner of a conversation's table entry is the owner of its messages
    # partition (the entry is written while processing that partition), so
    # requests are routed by the messages topic, whose keys are the raw UTF-8
    # conversation id as producers send it. Faust's table_route would hash
    # the table's own key encoding instead (JSON: '"conv-1"'), which lands on
    # another partition for most keys: with several workers, most lookups
    # went to a worker without the entry and answered 404.
    messages_topic = app.topic(
        components.names.messages,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )

    @app.page("/conversations/{conversation_id}")
    class Conversation(View):
        @app.topic_route(topic=messages_topic, match_info="conversation_id")  # type: ignore[arg-type]
        async def get(self, request: Request, conversation_id: str) -> Response:
            tally = tallies.get(conversation_id)
            if tally is None:
                return self.json(unknown(conversation_id), status=404)
            return self.json(conversation_body(tally, budget))

    @app.page("/conversations/{conversation_id}/history")
    class History(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            store = await resources.store()
            history = await store.load_history(conversation_id)
            if not history:
                return self.json(unknown(conversation_id), status=404)
            return self.json(history_body(conversation_id, history))

    @app.page("/memory/search")
    class MemorySearch(View):
        async def get(self, request: Request) -> Response:
            query = request.query.get("q", "")
            try:
                limit = int(request.query.get("limit", "5"))
                sources, mode = search_options(request.query)
                store = await resources.store()
                result = await store.memory_read(
                    query,
                    conversation_id=request.query.get("conversation_id"),
                    limit=limit,
                    sources=sources,
                    mode=mode,
                )
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            return self.json(result.model_dump(mode="json"))

    @app.page("/conversations/{conversation_id}/batches/{batch_id}")
    class Batch(View):
        async def get(self, request: Request, conversation_id: str, batch_id: str) -> Response:
            store = await resources.store()
            expanded = await store.expand_batch(conversation_id, batch_id)
            if expanded is None:
                return self.json(
                    {"error": f"unknown batch {batch_id!r} in {conversation_id!r}"}, status=404
                )
            return self.json(batch_body(expanded))
