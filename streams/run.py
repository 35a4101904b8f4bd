"""``compactor worker``: create the topics, then run one worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust

from core.settings import Settings
from streams.admin import ensure_topics
from streams.app import build_app
from streams.topics import TopicNames


def run_worker(settings: Settings, *, loglevel: str = "info") -> int:
    """Create the topics, then run one worker until SIGTERM/SIGINT."""
    app = build_app(settings)
    Path(settings.service.data_dir).mkdir(parents=True, exist_ok=True)
    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    asyncio.run(
        ensure_topics(
            bootstrap,
            TopicNames.with_prefix(settings.kafka.topic_prefix),
            partitions=settings.kafka.partitions,
            replication_factor=settings.kafka.replication_factor,
        )
    )
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
    return 0
