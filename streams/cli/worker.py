"""``compactor worker``: create the topics, then run one worker until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import faust

from core.settings import ConfigError, Settings
from streams.bootstrap import build_app
from streams.kafka.admin import PreparedTopics, dead_letter_bytes, prepare_topics, worker_kafka
from streams.kafka.probe import broker_problem
from streams.kafka.security import kafka_security
from streams.kafka.topic_drift import refuse_clip_archives_without_compaction
from streams.logs import configure as configure_logging
from streams.preflight import startup_checks, worker_bootstrap
from streams.topics import TopicNames

log = logging.getLogger("compactor.worker")


def run_worker(
    settings: Settings, *, loglevel: str = "info", config_path: Path | None = None
) -> int:
    """Create the topics, then run one worker until SIGTERM/SIGINT; a token reload
    (SIGHUP) reads ``config_path`` again."""
    json_logs = settings.service.log_format == "json"
    if json_logs:
        configure_logging("json", loglevel)
    bootstrap = worker_bootstrap(settings)
    startup_checks(settings, bootstrap)  # before anything connects
    security = kafka_security(settings.kafka)
    # aiokafka reports a refused login or an untrusted certificate only as
    # "Unable to bootstrap"; the probe names the problem.
    problem = broker_problem(bootstrap, 5.0, security)
    if problem is not None:
        raise ConfigError(
            f"Kafka at {bootstrap} does not answer over {security.describe()}: {problem}"
        )
    prepared = asyncio.run(prepare_topics(bootstrap, settings.kafka, security=security))
    names = TopicNames.with_prefix(settings.kafka.topic_prefix)
    refuse_clip_archives_without_compaction(prepared, names)
    settings = settings.model_copy(update={"kafka": worker_kafka(settings.kafka, prepared)})
    _warn_if_dead_letters_cut(settings, prepared)
    app = build_app(settings, bootstrap=bootstrap, config_path=config_path)
    Path(settings.service.data_dir).mkdir(parents=True, exist_ok=True)
    # Faust (mode) replaces the root logger's handlers when the worker starts;
    # with JSON logs it is told not to, so the lines stay JSON.
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, override_logging=not json_logs)
    if json_logs:
        worker.spinner = None  # (Faust drops it itself when it sets up logging)
    # What startup made (modules, the app, its clients) lives as long as the process:
    # out of the collector's reach, a full collection no longer walks it (each took
    # ~74 ms of the event loop every few seconds under load, docs/performance.md).
    gc.freeze()
    worker.execute_from_commandline()
    return 0


def _warn_if_dead_letters_cut(settings: Settings, prepared: PreparedTopics) -> None:
    needed = dead_letter_bytes(prepared.largest_record)
    if prepared.dead_letter_limit < needed:
        log.warning(
            "%s accepts records up to %d bytes, but the source topics accept %d: a dead "
            "letter of a larger record will be truncated; `compactor topics --apply-configs` "
            "sets its max.message.bytes to %d",
            TopicNames.with_prefix(settings.kafka.topic_prefix).dead_letters,
            prepared.dead_letter_limit,
            prepared.largest_record,
            needed,
        )
