"""``compactor worker``: create the topics, then run one worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust

from core.settings import ConfigError, Settings
from streams.bootstrap import build_app
from streams.kafka.admin import ensure_topics, topic_configs
from streams.kafka.probe import broker_problem
from streams.kafka.security import kafka_security
from streams.logs import configure as configure_logging
from streams.topics import TopicNames


def run_worker(settings: Settings, *, loglevel: str = "info") -> int:
    """Create the topics, then run one worker until SIGTERM/SIGINT."""
    json_logs = settings.service.log_format == "json"
    if json_logs:
        configure_logging("json", loglevel)
    app = build_app(settings)
    Path(settings.service.data_dir).mkdir(parents=True, exist_ok=True)
    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    security = kafka_security(settings.kafka)
    # aiokafka reports a refused login or an untrusted certificate only as
    # "Unable to bootstrap"; the probe names the problem.
    problem = broker_problem(bootstrap, 5.0, security)
    if problem is not None:
        raise ConfigError(
            f"Kafka at {bootstrap} does not answer over {security.describe()}: {problem}"
        )
    asyncio.run(
        ensure_topics(
            bootstrap,
            TopicNames.with_prefix(settings.kafka.topic_prefix),
            partitions=settings.kafka.partitions,
            replication_factor=settings.kafka.replication_factor,
            security=security,
            configs=topic_configs(
                TopicNames.with_prefix(settings.kafka.topic_prefix), settings.kafka
            ),
        )
    )
    # Faust (mode) replaces the root logger's handlers when the worker starts;
    # with JSON logs it is told not to, so the lines stay JSON.
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, override_logging=not json_logs)
    if json_logs:
        worker.spinner = None  # (Faust drops it itself when it sets up logging)
    worker.execute_from_commandline()
    return 0
