"""The worker's timers, registered on the Faust app by ``streams.app``.

Each tick logs its own errors: an exception in a Faust timer stops the worker.
"""

from __future__ import annotations

import logging

import faust

from core.settings import Settings
from streams.kafka import consumer
from streams.kafka.consumer import CommandToken
from streams.kafka.log_limits import limit_repeats
from streams.worker import Components
from streams.worker.batching import AcksAfterFlush

log = logging.getLogger("compactor.worker")


def register_timers(
    app: faust.App,
    settings: Settings,
    components: Components[CommandToken],
    side: consumer.ConsumerSide,
    acks: AcksAfterFlush,
) -> None:
    """Each tick logs its own errors: an exception in a Faust timer stops the worker."""

    @app.timer(interval=settings.service.reconcile_interval_seconds)  # type: ignore[untyped-decorator]
    async def reconcile() -> None:
        await components.reconciler.tick()

    @app.timer(interval=settings.service.outbox_relay_interval_seconds)  # type: ignore[untyped-decorator]
    async def relay_outbox() -> None:
        await components.relay.tick()

    @app.timer(interval=max(settings.service.table_flush_seconds, 0.5))  # type: ignore[untyped-decorator]
    async def flush_table() -> None:
        """Entries (and the acks waiting on them) of a stream that went quiet."""
        try:
            await acks.settle()
        except Exception as error:
            log.warning("table flush failed, retried at the next one: %s", error)

    @app.timer(interval=5.0)  # type: ignore[untyped-decorator]
    async def measure_lag() -> None:
        side.lag.tick()

    @app.timer(interval=2.0)  # type: ignore[untyped-decorator]
    async def watch_progress() -> None:
        await side.watchdog.tick()

    @app.task  # type: ignore[untyped-decorator]
    async def quiet_outage_logs() -> None:
        """After Faust has set up logging, so its configuration cannot drop the filter."""
        limit_repeats()
