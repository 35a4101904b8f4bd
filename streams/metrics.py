"""Prometheus metrics of one worker.

One registry per app (not the process-global default), so several apps in
one process (tests, benchmarks) never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events_in = Counter(
            "compactor_events_in_total", "Message events consumed", ["outcome"], registry=r
        )
        self.dead_lettered = Counter(
            "compactor_dead_lettered_total",
            "Records sent to the dead-letter topic",
            ["source", "error_type"],
            registry=r,
        )
        self.commands_issued = Counter(
            "compactor_commands_issued_total", "Compaction commands sent", ["reason"], registry=r
        )
        self.compactions_started = Counter(
            "compactor_compactions_started_total", "Compactions started", registry=r
        )
        self.compactions_succeeded = Counter(
            "compactor_compactions_succeeded_total", "Compactions committed", registry=r
        )
        self.compactions_failed = Counter(
            "compactor_compactions_failed_total",
            "Compactions that failed (history untouched)",
            ["reason"],
            registry=r,
        )
        self.compactions_noop = Counter(
            "compactor_compactions_noop_total",
            "Commands that needed no compaction (stale, nothing to compress, replayed)",
            ["reason"],
            registry=r,
        )
        self.compaction_latency = Histogram(
            "compactor_compaction_latency_seconds",
            "Command received to events published",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.llm_tokens = Counter(
            "compactor_llm_tokens_total",
            "Tokens used by summarisation calls",
            ["direction"],
            registry=r,
        )
        self.in_flight = Gauge(
            "compactor_compactions_in_flight", "Compactions running now", registry=r
        )
        self.consumer_lag = Gauge(
            "compactor_consumer_lag",
            "Records not yet read, per topic partition",
            ["topic", "partition"],
            registry=r,
        )
        self.outbox_published = Counter(
            "compactor_outbox_published_total", "Outbox rows published", ["topic"], registry=r
        )
        self.accounting_retries = Counter(
            "compactor_accounting_retries_total",
            "Records whose accounting failed and is retried (not acknowledged)",
            ["error_type"],
            registry=r,
        )
        self.accounting_waiting = Gauge(
            "compactor_accounting_waiting",
            "1 while accounting is retrying a record (database or broker away)",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
