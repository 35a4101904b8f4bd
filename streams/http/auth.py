"""Who may read what over HTTP: bearer tokens, tenants, and the bind check.

``[service].api_tokens`` (and ``$COMPACTOR_API_TOKENS``, comma-separated)
read every conversation; ``[[service.tokens]]`` entries with a ``tenant``
read that tenant's only. ``/healthz`` and ``/metrics`` take
``[service].metrics_token`` instead (open when it is unset). Tokens are
compared in constant time (``hmac.compare_digest`` against every configured
token, so the time does not say which one nearly matched) and never logged.

With no token configured the worker only serves loopback: binding elsewhere
is refused unless ``[service].allow_unauthenticated = true``.
See docs/security.md.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from core.settings import ConfigError, ServiceSettings, TokenBinding, check_token

log = logging.getLogger("compactor.auth")

API_TOKENS_ENV = "COMPACTOR_API_TOKENS"
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
# An Authorization header longer than this is refused before any comparison.
MAX_AUTHORIZATION_CHARS = 1024


@dataclass(frozen=True)
class Principal:
    """An authenticated caller; ``tenant`` None reads every tenant."""

    tenant: str | None

    def may_read(self, tenant: str | None) -> bool:
        return self.tenant is None or self.tenant == tenant


EVERYONE = Principal(tenant=None)


@dataclass(frozen=True)
class _Token:
    secret: bytes
    tenant: str | None


def env_tokens(environ: Mapping[str, str]) -> list[TokenBinding]:
    """Tokens from ``$COMPACTOR_API_TOKENS``; a bad one is a ConfigError (not echoed)."""
    raw = environ.get(API_TOKENS_ENV, "")
    found = []
    for index, value in enumerate(part.strip() for part in raw.split(",")):
        if not value:
            continue
        try:
            binding = TokenBinding.model_validate({"token": value})
        except ValueError:
            raise ConfigError(
                f"{API_TOKENS_ENV}: token {index + 1} is not usable (at least 16 printable "
                "ASCII characters, no spaces or commas)"
            ) from None
        found.append(binding)
    return found


class AuthPolicy:
    """The tokens of one worker and what each may read."""

    def __init__(self, tokens: list[TokenBinding], metrics_token: bytes | None) -> None:
        self._tokens = [_Token(t.token.get_secret_value().encode(), t.tenant) for t in tokens]
        self._metrics_token = metrics_token

    @classmethod
    def of(cls, service: ServiceSettings, environ: Mapping[str, str] | None = None) -> AuthPolicy:
        env = os.environ if environ is None else environ
        tokens = [TokenBinding(token=token) for token in service.api_tokens]
        tokens.extend(service.tokens)
        tokens.extend(env_tokens(env))
        for binding in tokens:
            check_token(binding.token)
        metrics = service.metrics_token
        return cls(tokens, None if metrics is None else metrics.get_secret_value().encode())

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    @property
    def guards_operations(self) -> bool:
        return self._metrics_token is not None

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller of a data view; None when it must be refused (401)."""
        if not self._tokens:
            return EVERYONE
        presented = bearer(authorization)
        if presented is None:
            return None
        found: _Token | None = None
        for token in self._tokens:  # no early exit: every token is compared
            if hmac.compare_digest(presented, token.secret):
                found = token
        return None if found is None else Principal(found.tenant)

    def operations_allowed(self, authorization: str | None) -> bool:
        """``/healthz`` and ``/metrics``: open unless ``metrics_token`` is set."""
        if self._metrics_token is None:
            return True
        presented = bearer(authorization)
        return presented is not None and hmac.compare_digest(presented, self._metrics_token)


def bearer(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer …`` header, or None."""
    if not authorization or len(authorization) > MAX_AUTHORIZATION_CHARS:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    try:
        return token.strip().encode("ascii")
    except UnicodeEncodeError:
        return None


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost, or "" (every interface)


def check_exposure(service: ServiceSettings, policy: AuthPolicy) -> None:
    """Refuse to serve unauthenticated reads beyond loopback; warn about loopback."""
    if policy.enabled:
        return
    if not is_loopback(service.web_host) and not service.allow_unauthenticated:
        raise ConfigError(
            f"[service].web_host = {service.web_host!r} is not a loopback address, and no "
            "API token is configured: anyone who reaches it could read every conversation. "
            f"Set [service].api_tokens (or {API_TOKENS_ENV}), bind to 127.0.0.1, or set "
            "[service].allow_unauthenticated = true to accept that (docs/security.md)"
        )
    log.warning(
        "HTTP reads are UNAUTHENTICATED on %s:%d: no [service].api_tokens configured "
        "(see docs/security.md)",
        service.web_host,
        service.web_port,
    )
