"""Where Kafka is: the environment, then the config file, then a running
``compactor dev up`` stack. (PostgreSQL's DSN is found the same way by
``streams.database.configured_dsn``, which applies the adapter's TLS settings.)"""

from __future__ import annotations

import os

from core.settings import Settings
from streams.stack_state import dev_stack_bootstrap

KAFKA_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def configured_bootstrap(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$KAFKA_BOOTSTRAP_SERVERS`` wins over the file; with neither, the broker of a
    running ``compactor dev up`` stack; None when there is no broker at all."""
    explicit = os.environ.get(KAFKA_BOOTSTRAP_ENV) or settings.kafka.bootstrap_servers
    if explicit or not dev_stack:
        return explicit
    return dev_stack_bootstrap()
