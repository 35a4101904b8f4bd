"""What the worker refuses to start with, checked before anything connects.

Kept apart from the composition root (``streams.bootstrap``) because more than
the worker asks: ``compactor config check`` runs the same checks, and the
deployment files' tests (compose, Kubernetes) run them on their configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from core.settings import ConfigError, Settings
from streams.addresses import configured_bootstrap
from streams.database import check_database, configured_dsn
from streams.http.auth import AuthPolicy, check_exposure
from streams.transport import check_transport


def startup_checks(
    settings: Settings, servers: str | None, environ: Mapping[str, str] | None = None
) -> None:
    """What the worker refuses to start with, checked before anything connects:
    an unprotected connection to a remote host, unauthenticated reads beyond
    loopback, no database configured (``check_database``). A ConfigError names
    the key. The deployment files' tests (compose, Kubernetes) run exactly this
    on their configuration."""
    env = os.environ if environ is None else environ
    dsn = configured_dsn(settings)
    check_transport(settings, bootstrap=servers, dsn=dsn, environ=env)
    check_exposure(settings.service, AuthPolicy.of(settings.service, env))
    check_database(settings, dsn)


def worker_bootstrap(settings: Settings, bootstrap: str | None = None) -> str:
    """The brokers the worker connects to (``bootstrap`` overrides env and config);
    a ConfigError when there are none."""
    servers = bootstrap or configured_bootstrap(settings)
    if not servers:
        raise ConfigError(
            "no Kafka broker configured: set KAFKA_BOOTSTRAP_SERVERS or [kafka].bootstrap_servers, "
            "or run `compactor dev up`"
        )
    return servers
