"""HTTP views of a worker (JSON), served by Faust's web server.

``/conversations/{id}`` reads the token table, which is partitioned: a request
reaching the wrong worker is forwarded to the one that owns the key (the
owner of the conversation's messages partition).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import faust
from faust.web import Request, Response, View

from core.budget import over_budget
from core.split import is_clip_archive
from core.tokens import estimate_history_tokens

if TYPE_CHECKING:
    from streams.app import Service


def register_views(app: faust.App, service: Service, conversations: Any) -> None:
    budget = service.budget
    # The owner of a conversation's table entry is the owner of its messages
    # partition (the entry is written while processing that partition), so
    # requests are routed by the messages topic, whose keys are the raw UTF-8
    # conversation id as producers send it. Faust's table_route would hash
    # the table's own key encoding instead (JSON: '"conv-1"'), which lands on
    # another partition for most keys: with several workers, most lookups
    # went to a worker without the entry and answered 404.
    messages_topic = app.topic(
        service.names.messages,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )

    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            assignment = app.consumer.assignment() if app.consumer is not None else set()
            return self.json(
                {
                    "status": "ok",
                    "app_id": app.conf.id,
                    "summariser": service.resolved_model.kind,
                    "assigned_partitions": sorted(
                        f"{tp.topic}:{tp.partition}" for tp in assignment
                    ),
                }
            )

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(service.metrics.render(), content_type="text/plain; version=0.0.4")

    @app.page("/conversations/{conversation_id}")
    class Conversation(View):
        @app.topic_route(topic=messages_topic, match_info="conversation_id")  # type: ignore[arg-type]
        async def get(self, request: Request, conversation_id: str) -> Response:
            raw = conversations.get(conversation_id)
            if raw is None:
                return self.json({"error": f"unknown conversation {conversation_id!r}"}, status=404)
            return self.json(
                {
                    "conversation_id": conversation_id,
                    "token_total": raw["token_total"],
                    "message_count": raw["message_count"],
                    "budget_tokens": budget.budget_tokens,
                    "over_budget": over_budget(raw["token_total"], budget),
                    "compactions": raw["compactions"],
                    "generation": raw["generation"],
                    "compaction_outstanding": raw["outstanding"],
                }
            )

    @app.page("/conversations/{conversation_id}/history")
    class History(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            store = await service.store()
            history = await store.load_history(conversation_id)
            if not history:
                return self.json({"error": f"unknown conversation {conversation_id!r}"}, status=404)
            return self.json(
                {
                    "conversation_id": conversation_id,
                    "token_estimate": estimate_history_tokens(history),
                    "clip_archive": history[0].model_dump(mode="json")
                    if is_clip_archive(history[0])
                    else None,
                    "messages": [m.model_dump(mode="json", exclude_none=True) for m in history],
                }
            )

    @app.page("/memory/search")
    class MemorySearch(View):
        async def get(self, request: Request) -> Response:
            query = request.query.get("q", "")
            try:
                limit = int(request.query.get("limit", "5"))
                store = await service.store()
                result = await store.memory_read(
                    query, conversation_id=request.query.get("conversation_id"), limit=limit
                )
            except ValueError as error:
                return self.json({"error": str(error)}, status=400)
            return self.json(result.model_dump(mode="json"))
