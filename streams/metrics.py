"""Prometheus metrics of one worker.

One registry per app (not the process-global default), so several apps in
one process (tests, benchmarks) never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from core.domain.usage import LlmUsage
from core.provider_guard import GUARD_STATES, CallOutcome, GuardState, ProviderGuard
from streams.watchdog_exits import ExitsFile

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Stored history ÷ budget when a compaction starts: around compact_at (or 1)
# when compactions keep up, higher when they queue behind a burst (P4: ≤ 1.5).
RATIO_BUCKETS = (0.5, 0.8, 0.85, 0.9, 0.95, 1, 1.05, 1.1, 1.25, 1.5, 2, 3, 5)


def _with_process_metrics(r: CollectorRegistry) -> CollectorRegistry:
    """``r`` with the process's own series (process_cpu_seconds_total,
    process_resident_memory_bytes, python_info, python_gc_*)."""
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
    return r


class Metrics:
    """Every series of one worker, as attributes the components count on; built in
    groups, in the order /metrics lists them."""

    def __init__(self, *, state_dir: Path | None = None) -> None:
        self.registry = r = _with_process_metrics(CollectorRegistry(auto_describe=True))
        self._ratio_max = 0.0
        self._record_metrics(r)
        self._compaction_metrics(r)
        self._usage_metrics(r)
        self._progress_metrics(r)
        self._fault_metrics(r, state_dir)
        self._accounting_metrics(r)
        self._reconcile_metrics(r)
        self._provider_metrics(r)
        self._context_metrics(r)

    def _context_metrics(self, r: CollectorRegistry) -> None:
        """The turn-time context (GET /conversations/{id}/context)."""
        self.context_reads = Counter(
            "compactor_context_reads_total",
            "Context reads by shape and how they were answered (read from the store, "
            "cached: the history unchanged since, not_yet: the message asked for was not "
            "stored within the wait)",
            ["format", "outcome"],
            registry=r,
        )
        self.context_provisional = Counter(
            "compactor_context_provisional_total",
            "Context answers fitted at read time (a provisional clip-archive: the stored "
            "history was over the limit while its compaction had not landed)",
            registry=r,
        )

    def _record_metrics(self, r: CollectorRegistry) -> None:
        """What became of the records read and sent."""
        self.events_in = Counter(
            "compactor_events_in_total", "Message events consumed", ["outcome"], registry=r
        )
        self.dead_lettered = Counter(
            "compactor_dead_lettered_total",
            "Records sent to the dead-letter topic",
            ["source", "error_type"],
            registry=r,
        )
        limit = "Compactions this worker may run at once now (fewer while turns are late)"
        self.compaction_limit = Gauge("compactor_compaction_limit", limit, registry=r)
        late = "Groups of messages stored late: see [service].turn_delay_target_ms"
        self.turns_late = Counter("compactor_turns_late_total", late, registry=r)
        self.ingest_left = Counter(
            "compactor_ingest_left_total",
            "Messages stored after the rest of their group, their conversation held by a "
            "compaction being written",
            registry=r,
        )
        self.erasures = Counter(
            "compactor_erasures_total", "Conversations erased (erase requests applied)", registry=r
        )
        self.commands_issued = Counter(
            "compactor_commands_issued_total", "Compaction commands sent", ["reason"], registry=r
        )

    def _compaction_metrics(self, r: CollectorRegistry) -> None:
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

    def _progress_metrics(self, r: CollectorRegistry) -> None:
        """How far behind the worker is, and how far over budget conversations get."""
        self.consumer_lag = Gauge(
            "compactor_consumer_lag",
            "Records not yet read, per topic partition",
            ["topic", "partition"],
            registry=r,
        )
        self.outbox_published = Counter(
            "compactor_outbox_published_total", "Outbox rows published", ["topic"], registry=r
        )
        self.compactions_over_target = Counter(
            "compactor_compactions_over_target_total",
            "Compactions that left (or found) the history over the target: "
            "the messages kept verbatim leave no room for a clip-archive",
            registry=r,
        )
        self.compactions_rejected = Counter(
            "compactor_compactions_rejected_total",
            "Compactions the gate refused before they took effect (history untouched)",
            ["reason", "summarizer"],
            registry=r,
        )
        self.pinned_over_budget = Counter(
            "compactor_pinned_over_budget_total",
            "Compactions that found a conversation's pinned messages alone over the budget",
            registry=r,
        )
        self.history_budget_ratio = Histogram(
            "compactor_history_budget_ratio",
            "Stored history tokens / budget tokens when a compaction loads the history",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.history_budget_ratio_max = Gauge(
            "compactor_history_budget_ratio_max",
            "Largest compactor_history_budget_ratio observed since the worker started",
            registry=r,
        )

    def _usage_metrics(self, r: CollectorRegistry) -> None:
        """What applied compactions spent, by provider and model (never by tenant:
        `compactor usage` and GET /tenants/{tenant}/usage have that)."""
        self.usage_calls = Counter(
            "compactor_usage_llm_calls_total",
            "LLM calls of applied compactions",
            ["provider", "model"],
            registry=r,
        )
        self.usage_tokens = Counter(
            "compactor_usage_tokens_total",
            "Tokens of applied compactions' LLM calls (kind: input, output, cache_read, "
            "cache_write)",
            ["provider", "model", "kind"],
            registry=r,
        )
        self.usage_cost = Counter(
            "compactor_usage_cost_usd_total",
            "Estimated cost of applied compactions ([usage].prices)",
            ["provider", "model"],
            registry=r,
        )
        self.tenant_budget_fallbacks = Counter(
            "compactor_tenant_budget_fallbacks_total",
            "Compactions sent to the extractive summariser: their tenant's "
            "llm_tokens_per_day was spent",
            registry=r,
        )

    def count_usage(self, usage: LlmUsage) -> None:
        labels = (usage.summarizer, usage.model)
        self.usage_calls.labels(*labels).inc(usage.calls)
        for kind, tokens in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
        ):
            self.usage_tokens.labels(*labels, kind).inc(tokens)
        self.usage_cost.labels(*labels).inc(usage.cost_usd or 0.0)

    def observe_history_at_compaction(self, stored_tokens: int, budget_tokens: int) -> None:
        """How far over the budget a conversation got before its compaction began:
        the figure a burst drives up while compactions queue (docs/performance.md, P4)."""
        ratio = stored_tokens / max(1, budget_tokens)
        self.history_budget_ratio.observe(ratio)
        if ratio > self._ratio_max:
            self._ratio_max = ratio
            self.history_budget_ratio_max.set(ratio)

    def _fault_metrics(self, r: CollectorRegistry, state_dir: Path | None) -> None:
        """Outages waited out, stalls healed (watchdog exits kept in ``state_dir``)."""
        self._exits_file = ExitsFile(state_dir)
        self._exits = self._exits_file.read()
        self.accounting_retries = Counter(
            "compactor_accounting_retries_total",
            "Records whose accounting failed and is retried (not acknowledged)",
            ["error_type"],
            registry=r,
        )
        self.watchdog_heals = Counter(
            "compactor_watchdog_heals_total",
            "Partitions re-sought because they made no progress (table recovery or reading)",
            ["what"],
            registry=r,
        )
        self.watchdog_exits = Counter(
            "compactor_watchdog_exits_total",
            "Times the worker exited because re-seeking a stuck partition did not help",
            registry=r,
        )
        if self._exits:
            self.watchdog_exits.inc(self._exits)
        self.loop_lag = Histogram(
            "compactor_event_loop_lag_seconds",
            "How late the event loop ran a 50 ms timer (every step that does not yield "
            "delays the consumers, the agents and every read by as much)",
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.loop_stalls = Counter(
            "compactor_event_loop_stalls_total",
            "Times the event loop was held by one step for [service].loop_stall_seconds "
            "or more (logged with the stack holding it)",
            registry=r,
        )

    def _accounting_metrics(self, r: CollectorRegistry) -> None:
        self.accounting_batch_events = Histogram(
            "compactor_accounting_batch_events",
            "Message events accounted as one group",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
            registry=r,
        )
        self.table_writes = Counter(
            "compactor_table_writes_total",
            "Token-table entries written to the Faust table (changelog records)",
            registry=r,
        )
        self.table_flush_interval = Gauge(
            "compactor_table_flush_interval_seconds",
            "The wait before the token table's next flush, and the commits behind it "
            "(longer than table_flush_seconds after a large flush: table_writes_per_second)",
            registry=r,
        )

    def _reconcile_metrics(self, r: CollectorRegistry) -> None:
        self.reconcile_tick_seconds = Histogram(
            "compactor_reconcile_tick_seconds",
            "Wall time of one reconciliation pass (index rebuilds included)",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=r,
        )
        self.compactions_given_up = Counter(
            "compactor_compactions_given_up_total",
            "Compaction ids reconciliation stopped re-sending after MAX_ATTEMPTS sends "
            "without a completion (the conversation stalled until a new message or a recompact)",
            registry=r,
        )
        self.resends_held = Counter(
            "compactor_reconcile_resends_held_total",
            "Late commands not re-sent: still queued or in flight (not lost)",
            registry=r,
        )
        self.requests_held = Counter(
            "compactor_reconcile_requests_held_total",
            "Reconcile requests not sent: the previous one is still unread",
            registry=r,
        )
        self.reconcile_candidates = Gauge(
            "compactor_reconcile_candidates",
            "Table entries reconciliation may act on (its index)",
            registry=r,
        )
        # Accounting's, listed here as /metrics always has.
        self.accounting_waiting = Gauge(
            "compactor_accounting_waiting",
            "1 while accounting is retrying a record (database or broker away)",
            registry=r,
        )

    def _provider_metrics(self, r: CollectorRegistry) -> None:
        self.operator_requests = Counter(
            "compactor_operator_requests_total",
            "Recompact and restore requests by outcome (applied, noop, failed)",
            ["action", "outcome"],
            registry=r,
        )
        self.compactions_retried_after_outage = Counter(
            "compactor_compactions_retried_after_outage_total",
            "Compactions that failed in a provider outage and went again once it answered",
            registry=r,
        )
        self.llm_provider_state = Gauge(
            "compactor_llm_provider_state",
            "1 for the provider guard's state: closed, paused (retry-after), "
            "open (breaker cooling down), half_open (one probe allowed)",
            ["state"],
            registry=r,
        )
        self.llm_calls_in_flight = Gauge(
            "compactor_llm_calls_in_flight", "LLM calls running now (worker-wide)", registry=r
        )
        self.llm_calls_waiting = Gauge(
            "compactor_llm_calls_waiting",
            "LLM calls waiting for a slot or for a retry-after pause to end",
            registry=r,
        )
        self.llm_calls_refused = Counter(
            "compactor_llm_calls_refused_total",
            "LLM calls the provider guard refused, by its state then",
            ["state"],
            registry=r,
        )
        self.llm_calls = Counter(
            "compactor_llm_calls_total",
            "LLM calls made, by outcome (success, rate_limited, server_error, "
            "timeout, auth, rejected)",
            ["outcome"],
            registry=r,
        )

    def watch_provider_guard(self, guard: ProviderGuard) -> None:
        """Report ``guard`` (the runtime compactor's ``provider_guard``).

        Gauges read it at scrape time (the breaker goes from open to half-open
        by the clock alone, with no event to report); counters are fed by its
        observer. Watching another guard replaces the previous one.
        """

        def is_state(state: GuardState) -> Callable[[], float]:
            return lambda: 1.0 if guard.state() == state else 0.0

        for state in GUARD_STATES:
            self.llm_provider_state.labels(state).set_function(is_state(state))
        self.llm_calls_in_flight.set_function(lambda: guard.in_flight)
        self.llm_calls_waiting.set_function(lambda: guard.waiting)
        guard.observer = _GuardCounters(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def count_watchdog_exit(self) -> None:
        """The worker is about to exit for the watchdog: count it, in the registry
        and in the data_dir file the next start reads (best effort)."""
        self.watchdog_exits.inc()
        self._exits += 1
        self._exits_file.record(self._exits)


class _GuardCounters:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def on_call(self, outcome: CallOutcome) -> None:
        self._metrics.llm_calls.labels(outcome).inc()

    def on_refused(self, state: GuardState) -> None:
        self._metrics.llm_calls_refused.labels(state).inc()
