"""Where Kafka and PostgreSQL are: the environment, then the config file, then a
running ``compactor dev up`` stack. ``streams.bootstrap`` opens what this finds."""

from __future__ import annotations

import os

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV
from core.adapters.postgres.tls import dsn_with_tls
from core.settings import Settings
from streams.stack_state import Explicit, dev_stack_bootstrap, dev_stack_dsn

KAFKA_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def configured_dsn(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$POSTGRES_DSN`` wins over the file, as every other secret does; with neither,
    the PostgreSQL of a running ``compactor dev up`` stack, so that commands share it
    instead of each starting an embedded server. ``dev_stack=False`` asks only what
    was given explicitly (what ``dev up`` must not replace)."""
    explicit = os.environ.get(POSTGRES_DSN_ENV) or settings.postgres.dsn
    if explicit:
        # [postgres].sslmode / ssl_rootcert, unless the DSN says otherwise.
        return dsn_with_tls(explicit, settings.postgres)
    return dev_stack_dsn() if dev_stack else None


def configured_bootstrap(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """``$KAFKA_BOOTSTRAP_SERVERS`` wins over the file; with neither, the broker of a
    running ``compactor dev up`` stack; None when there is no broker at all."""
    explicit = os.environ.get(KAFKA_BOOTSTRAP_ENV) or settings.kafka.bootstrap_servers
    if explicit or not dev_stack:
        return explicit
    return dev_stack_bootstrap()


def explicit_addresses(settings: Settings) -> Explicit:
    """Addresses given by the environment or the config file: ``dev`` never replaces them."""
    return Explicit(
        kafka_bootstrap=configured_bootstrap(settings, dev_stack=False),
        kafka_source=(
            f"${KAFKA_BOOTSTRAP_ENV}"
            if os.environ.get(KAFKA_BOOTSTRAP_ENV)
            else "[kafka].bootstrap_servers"
        ),
        postgres_dsn=configured_dsn(settings, dev_stack=False),
        postgres_source=(
            f"${POSTGRES_DSN_ENV}" if os.environ.get(POSTGRES_DSN_ENV) else "[postgres].dsn"
        ),
    )
