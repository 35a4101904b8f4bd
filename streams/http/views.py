"""HTTP views of a worker (JSON), served by Faust's web server: the routes.

``/conversations/{id}`` reads the token table, which is partitioned: a request
reaching the wrong worker is forwarded to the one that owns the key (the
owner of the conversation's messages partition). Faust forwards the request
with its headers, so the owner authenticates the same bearer token again.

Every request passes the guard first (``streams.http.guard``, installed by
``register_views``). A tenant-bound token reaches only the views below, each
of which checks the conversation's tenant (403 otherwise, also for an unknown
conversation, so a 403/404 difference reveals nothing). Inputs are bounded:
path ids by ``MAX_ID_LENGTH``, the query by ``[service].max_query_chars``,
``limit`` by ``[service].max_search_limit``. Every body is built by a model of
``streams.http.bodies``, the API's contract: ``streams.http.openapi``
generates the document (``/openapi.json``) from the same models, and
``tests/unit/http/test_openapi.py`` keeps routes, parameters and fields in
step with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import faust
from aiohttp import web
from faust.web import Request, Response, View

from core.ports.storage import (
    Archive,
    CompactionLedger,
    CompactionLogReader,
    ContextReader,
    HistoryReader,
    MemoryReader,
    MemorySearch,
    UsageStore,
)
from core.settings import ResolvedModel, ServiceSettings, Settings
from streams.database import explicit_dsn
from streams.http import bodies, openapi, pages, probe_bodies, ui
from streams.http.access import (
    addressed,
    json_body,
    principal_of,
    problem_response,
    read_scope,
)
from streams.http.audit import audit_reads
from streams.http.auth import AuthPolicy, check_exposure
from streams.http.context import register_context
from streams.http.forwarding import (
    PRINCIPAL,
    Forwarding,
    client_ssl_context,
    install,
    internal_key,
    node_of,
)
from streams.http.guard import Limits, guard, store_outage_is_503
from streams.http.probes import register_probes
from streams.http.reload import PolicyRef, register_reload
from streams.http.search import register_search
from streams.http.usage import register_usage
from streams.worker.components import Components

log = logging.getLogger("compactor.auth")


class ViewRuntime(Protocol):
    """What the views need of the worker's runtime (``streams.runtime.WorkerRuntime``);
    each view is registered with the part it reads (``HistoryViewPorts``, ...)."""

    resolved_model: ResolvedModel

    @property
    def is_open(self) -> bool: ...

    @property
    def history(self) -> HistoryReader: ...

    @property
    def context(self) -> ContextReader: ...

    @property
    def archive(self) -> Archive: ...

    @property
    def memory(self) -> MemorySearch: ...

    @property
    def compactions(self) -> CompactionLedger: ...

    @property
    def usage(self) -> UsageStore: ...


class HistoryViewPorts(Protocol):
    @property
    def history(self) -> HistoryReader: ...


class BatchViewPorts(Protocol):
    @property
    def archive(self) -> MemoryReader: ...


class CompactionsViewPorts(Protocol):
    @property
    def history(self) -> HistoryReader: ...

    @property
    def compactions(self) -> CompactionLedger: ...

    @property
    def archive(self) -> CompactionLogReader: ...


def register_views(
    app: faust.App,
    settings: Settings,
    components: Components[Any],
    runtime: ViewRuntime,
    config_path: Path | None = None,
) -> Callable[[], bool]:
    """Registers the views behind the guard; returns the token reload (what SIGHUP
    calls), which reads ``config_path`` again (None: wherever ``load_settings``
    finds the file)."""
    ref = install_guard(app, settings)
    register_operations(app, components, runtime)
    register_probes(app, components, runtime)
    register_conversations(app, settings, components, runtime)
    register_context(app, settings, components, runtime)
    register_search(app, settings, runtime)
    register_usage(app, runtime)
    register_document(app, settings.service)
    ui.register_ui(app)
    return register_reload(app, ref, config_path)


def install_guard(app: faust.App, settings: Settings) -> PolicyRef:
    """The middlewares every request passes (audit, guard, outage → 503) and request
    forwarding; the policy they read, which a reload swaps."""
    service = settings.service
    policy = AuthPolicy.of(service)
    check_exposure(service, policy)
    ref = PolicyRef(policy)
    forwarding = Forwarding(
        internal_key(service, explicit_dsn(settings)),
        client_ssl_context(service),
        here=lambda: node_of(app.conf.canonical_url),
    )
    if forwarding.key is None and policy.enabled:
        log.warning(
            "no internal key: a request for a conversation another worker serves is "
            "answered 503 instead of being forwarded (a caller's token is never sent on); "
            "set [service].internal_token, the same on every worker (docs/security.md)"
        )
    install(app, forwarding)
    web_app = cast(web.Application, app.web.web_app)  # type: ignore[attr-defined]
    # Outermost, so it logs every answer, the guard's refusals included.
    web_app.middlewares.append(audit_reads(lambda request: request.get(PRINCIPAL)))
    web_app.middlewares.append(guard(ref, Limits.of(service), forwarding))
    web_app.middlewares.append(store_outage_is_503)
    return ref


def register_operations(app: faust.App, components: Components[Any], runtime: ViewRuntime) -> None:
    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request) -> Response:
            try:
                assignment = app.consumer.assignment()
            except Exception:  # not started yet (or stopping): nothing assigned
                assignment = set()
            health = components.health
            answer = probe_bodies.Health(
                status="ok" if health.ok else "degraded",
                problems=[probe_bodies.HealthProblem.model_validate(p) for p in health.describe()],
                app_id=app.conf.id,
                summariser=runtime.resolved_model.kind,
                assigned_partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assignment),
            )
            return self.json(json_body(answer), status=200 if health.ok else 503)

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(components.metrics.render(), content_type="text/plain; version=0.0.4")


def register_conversations(
    app: faust.App, settings: Settings, components: Components[Any], runtime: ViewRuntime
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
            # Runs on the owner (after forwarding): its guard authenticated the
            # caller again, and the key below is built from that principal.
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            tally = tallies.get(key)
            if tally is None:
                return problem_response(self, bodies.unknown_conversation(key), 404)
            return self.json(json_body(bodies.ConversationStatus.of(tally, budget)))

    register_pages(app, settings, runtime)


def register_pages(app: faust.App, settings: Settings, runtime: ViewRuntime) -> None:
    """The views that return a page (``limit`` + ``cursor``, ``streams.http.pages``),
    and the compaction log."""
    register_history(app, settings.service, runtime)
    register_batch(app, settings.service, runtime)
    register_compactions(app, runtime)


def register_history(app: faust.App, service: ServiceSettings, runtime: HistoryViewPorts) -> None:
    @app.page("/conversations/{conversation_id}/history")
    class History(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            try:
                limit, after = pages.page_request(request.query, service)
            except ValueError as error:
                return problem_response(self, str(error), 400)
            history = await runtime.history.load_history(
                key,
                scope=read_scope(principal_of(request)),
                after=after,
                limit=limit + 1,  # one more: is there a next page?
            )
            if not history and after is None:
                return problem_response(self, bodies.unknown_conversation(key), 404)
            page = history[:limit]
            following = pages.cursor_of(page[-1]) if len(history) > limit else None
            return self.json(json_body(bodies.HistoryPage.of(key, page, following)))


def register_batch(app: faust.App, service: ServiceSettings, runtime: BatchViewPorts) -> None:
    @app.page("/conversations/{conversation_id}/batches/{batch_id}")
    class Batch(View):
        async def get(self, request: Request, conversation_id: str, batch_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id, batch_id), str):
                return key
            try:
                limit, after = pages.page_request(request.query, service)
            except ValueError as error:
                return problem_response(self, str(error), 400)
            expanded = await runtime.archive.expand_batch(
                key,
                batch_id,
                scope=read_scope(principal_of(request)),
                after=after,
                limit=limit + 1,
            )
            if expanded is None:
                unknown = f"unknown batch {batch_id!r} in {conversation_id!r}"
                return problem_response(self, unknown, 404)
            turns = expanded.turns
            following = pages.cursor_of(turns[limit - 1]) if len(turns) > limit else None
            page = expanded.model_copy(update={"turns": turns[:limit]})
            return self.json(json_body(bodies.BatchPage.of(page, following)))


def register_compactions(app: faust.App, runtime: CompactionsViewPorts) -> None:
    @app.page("/conversations/{conversation_id}/compactions")
    class Compactions(View):
        async def get(self, request: Request, conversation_id: str) -> Response:
            if not isinstance(key := addressed(self, request, conversation_id), str):
                return key
            scope = read_scope(principal_of(request))
            records = await runtime.archive.compaction_log(key, scope=scope)
            if not records and not await runtime.history.load_history(key, scope=scope, limit=1):
                return problem_response(self, bodies.unknown_conversation(key), 404)
            rejected = await runtime.compactions.rejections(key)
            return self.json(json_body(bodies.CompactionLog.of(key, records, rejected)))


def register_document(app: faust.App, service: ServiceSettings) -> None:
    """``/openapi.json``: the API's contract with this worker's bounds (``[service]``)."""
    document = openapi.document(service)

    @app.page(openapi.OPENAPI_PATH)
    class Document(View):
        async def get(self, request: Request) -> Response:
            return self.json(document)
