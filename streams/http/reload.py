"""Tokens reloaded on SIGHUP, without a restart: rotate a token, then signal.

The worker's policy is one ``PolicyRef``; a reload re-reads the config file
the worker was started with (``config_path``, resolved by whoever started it:
the CLI's ``--config``, ``$COMPACTOR_CONFIG`` or ./config.toml) and the
environment, and swaps the whole policy in one assignment, or keeps the old
one when the new is not usable. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

import faust

from core.settings import ConfigError, ServiceSettings, load_settings
from streams.http.auth import AuthPolicy, check_exposure

log = logging.getLogger("compactor.auth")


class PolicyRef:
    """The worker's current policy; ``reload`` swaps it whole (one assignment)."""

    def __init__(self, policy: AuthPolicy) -> None:
        self.policy = policy

    def reload(
        self,
        load: Callable[[], ServiceSettings],
        environ: Mapping[str, str] | None = None,
        check: Callable[[ServiceSettings, AuthPolicy], None] | None = None,
    ) -> bool:
        """Rebuild the policy from ``load()`` and the environment; on any error keep
        the old one and log why (never a token). True when swapped."""
        try:
            service = load()
            policy = AuthPolicy.of(service, environ)
            if check is not None:
                check(service, policy)
        except (ConfigError, OSError, ValueError) as error:
            log.error("token reload failed, the previous tokens stay in force: %s", error)
            return False
        self.policy = policy
        log.info("tokens reloaded")
        return True


def configured_service(config_path: Path | None) -> ServiceSettings:
    """``[service]`` as the config file says now: ``config_path``, else wherever
    ``load_settings`` finds one."""
    return load_settings(config_path).service


def register_reload(app: faust.App, ref: PolicyRef, config_path: Path | None) -> Callable[[], bool]:
    """Reload ``ref`` on SIGHUP once the worker runs; returns the reload itself."""

    def reload() -> bool:
        return ref.reload(lambda: configured_service(config_path), check=check_exposure)

    @app.task  # type: ignore[untyped-decorator]
    async def reload_on_sighup() -> None:
        watch_sighup(reload)

    return reload


def watch_sighup(reload: Callable[[], bool]) -> None:
    """Call ``reload`` (the tokens from the config file and the environment) on SIGHUP."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
