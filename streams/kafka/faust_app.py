"""The ``faust.App`` and its raw topics, configured from the settings.

Every Faust setting the worker depends on is here, with why.
"""

from __future__ import annotations

from pathlib import Path

import faust

from core.settings import Settings
from streams.http.forwarding import server_ssl_context
from streams.kafka.producers import faust_producer_settings
from streams.kafka.security import kafka_security


def create_app(settings: Settings, servers: str) -> faust.App:
    svc = settings.service
    return faust.App(
        svc.app_id,
        broker=[f"kafka://{server.strip()}" for server in servers.split(",") if server.strip()],
        broker_credentials=kafka_security(settings.kafka).faust_credentials(),
        store=svc.store,
        datadir=str(Path(svc.data_dir) / svc.app_id),
        topic_partitions=settings.kafka.partitions,
        # run_worker resolves an unset factor against the cluster before building the app.
        topic_replication_factor=settings.kafka.replication_factor or 1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # How long a dead worker keeps its partitions (Faust's default is 60 s).
        broker_session_timeout=settings.kafka.session_timeout_seconds,
        broker_heartbeat_interval=settings.kafka.heartbeat_interval_seconds,
        # acks=all (and idempotence, faust_patches.durable_producer) as every producer
        # of the service; the request limit follows the source topics (cli/worker.py).
        **faust_producer_settings(settings.kafka.max_request_bytes),
        # A rebalance does not wait for records being processed: revoked work is
        # abandoned (every write is idempotent and the new owner redoes it), so
        # neither a slow LLM call nor a database outage can hold up the group.
        stream_wait_empty=False,
        web_enabled=True,
        web_host=svc.web_host,
        web_port=svc.web_port,
        web_bind=svc.web_host,
        web_in_thread=False,
        # HTTPS when [service].tls_certfile / tls_keyfile are set (Faust hands the
        # context to aiohttp's TCPSite).
        web_ssl_context=server_ssl_context(svc),
    )


def raw_topic(app: faust.App, *names: str, partitions: int | None = None) -> faust.TopicT:
    """Bytes in, bytes out: the components decode and validate themselves."""
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )
