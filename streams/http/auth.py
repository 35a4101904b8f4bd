"""Who may read what over HTTP: bearer tokens, scopes, tenants, and the bind check.

``[service].api_tokens`` (and ``$COMPACTOR_API_TOKENS``, comma-separated) are
admin tokens: every scope but ``metrics``, every tenant. ``[[service.tokens]]``
entries with a ``tenant`` read that tenant's only (read + search unless
``scopes`` says otherwise). ``/healthz`` and ``/metrics`` need the ``metrics``
scope (``[service].metrics_token``) once a token has it, and are open otherwise.

A token may be configured as ``sha256:<64 hex>``, the SHA-256 of the token:
every presented token is hashed and its digest compared in constant time
(``hmac.compare_digest``) with every configured digest, no early exit, so the
time does not say which one nearly matched. Tokens are never logged; the same
token (or hash) listed twice is a ConfigError naming both keys. The policy is
rebuilt from the config file and the environment on SIGHUP (``streams.http.reload``).

With no token configured the worker only serves loopback: binding elsewhere
is refused unless ``[service].allow_unauthenticated = true``. With tokens,
binding elsewhere needs TLS (``[service].tls_certfile``) unless
``[service].allow_plaintext_http = true``: a token sent in clear text is a
token given away.
See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.settings import (
    TOKEN_HASH_PREFIX,
    ConfigError,
    Scope,
    ServiceSettings,
    TokenBinding,
    check_token,
)

log = logging.getLogger("compactor.auth")

API_TOKENS_ENV = "COMPACTOR_API_TOKENS"
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
# An Authorization header longer than this is refused before any comparison.
MAX_AUTHORIZATION_CHARS = 1024

ALL_SCOPES: frozenset[Scope] = frozenset({"read", "search", "erase", "metrics", "admin"})
# Today's api_tokens: everything but the scraper's scope (an API token never
# opened /metrics while a metrics_token was set, and still does not).
ADMIN_SCOPES: frozenset[Scope] = ALL_SCOPES - {"metrics"}
TENANT_SCOPES: frozenset[Scope] = frozenset({"read", "search"})


@dataclass(frozen=True)
class Principal:
    """An authenticated caller; ``tenant`` None reads every tenant.

    ``scopes`` unset: a tenant's default (read, search), or the admin scopes
    without a tenant. ``token_id`` names the token (a hash of its digest) for
    the rate limit and logs, and is not part of equality.
    """

    tenant: str | None
    scopes: frozenset[Scope] = frozenset()
    token_id: str = field(default="anonymous", compare=False)

    def __post_init__(self) -> None:
        if not self.scopes:
            default = TENANT_SCOPES if self.tenant is not None else ADMIN_SCOPES
            object.__setattr__(self, "scopes", default)

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes


# No token configured (loopback only, or allow_unauthenticated): what an admin token may.
EVERYONE = Principal(tenant=None)


@dataclass(frozen=True)
class _Token:
    digest: bytes
    principal: Principal


def token_digest(secret: str, key: str) -> bytes:
    """The SHA-256 of a configured token (``sha256:<hex>`` is the digest itself)."""
    if secret.startswith(TOKEN_HASH_PREFIX):
        hexdigest = secret[len(TOKEN_HASH_PREFIX) :]
        if len(hexdigest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in hexdigest):
            raise ConfigError(f"{key}: a sha256: token must be followed by 64 hex digits")
        return bytes.fromhex(hexdigest)
    return hashlib.sha256(secret.encode()).digest()


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


def _scopes(binding: TokenBinding, key: str) -> frozenset[Scope]:
    if binding.scopes is None:
        return TENANT_SCOPES if binding.tenant is not None else ADMIN_SCOPES
    scopes = frozenset(binding.scopes)
    if not scopes:
        raise ConfigError(f"{key}.scopes: a token needs at least one scope")
    if binding.tenant is not None and "admin" in scopes:
        raise ConfigError(
            f"{key}.scopes: a tenant-bound token cannot have the admin scope "
            "(the operations views show every tenant)"
        )
    return scopes


class AuthPolicy:
    """The tokens of one worker: what each may do, and on which tenant."""

    def __init__(self, tokens: list[tuple[str, bytes, Principal]]) -> None:
        """``tokens``: (the key that configured it, digest, principal) each."""
        seen: dict[bytes, str] = {}
        for key, digest, _ in tokens:
            if digest in seen:
                raise ConfigError(
                    f"{key}: the same token as {seen[digest]} (each token, or its "
                    "sha256: hash, may be listed once; give each use its own token)"
                )
            seen[digest] = key
        self._tokens = [_Token(digest, principal) for _, digest, principal in tokens]
        self._data = any(p.scopes - {"metrics"} for _, _, p in tokens)
        self._metrics = any("metrics" in p.scopes for _, _, p in tokens)

    @classmethod
    def of(cls, service: ServiceSettings, environ: Mapping[str, str] | None = None) -> AuthPolicy:
        env = os.environ if environ is None else environ
        bindings: list[tuple[str, TokenBinding]] = [
            (f"[service].api_tokens[{i}]", TokenBinding(token=token))
            for i, token in enumerate(service.api_tokens)
        ]
        bindings += [(f"[service].tokens[{i}]", b) for i, b in enumerate(service.tokens)]
        bindings += [(f"{API_TOKENS_ENV} token {i + 1}", b) for i, b in enumerate(env_tokens(env))]
        found: list[tuple[str, bytes, Principal]] = []
        for key, binding in bindings:
            check_token(binding.token)
            digest = token_digest(binding.token.get_secret_value(), key)
            scopes = _scopes(binding, key)
            found.append((key, digest, Principal(binding.tenant, scopes, _token_id(digest))))
        if service.metrics_token is not None:
            key = "[service].metrics_token"
            digest = token_digest(service.metrics_token.get_secret_value(), key)
            found.append((key, digest, Principal(None, frozenset({"metrics"}), _token_id(digest))))
        return cls(found)

    @property
    def enabled(self) -> bool:
        """Whether the data views need a token (a token with a scope but metrics exists)."""
        return self._data

    @property
    def has_tokens(self) -> bool:
        """Whether any token is configured (one a client sends, so one to protect)."""
        return bool(self._tokens)

    def identify(self, authorization: str | None) -> Principal | None:
        """The configured token presented, or None; every digest is compared."""
        presented = bearer(authorization)
        if presented is None:
            return None
        digest = hashlib.sha256(presented).digest()
        found: Principal | None = None
        for token in self._tokens:  # no early exit: every token is compared
            if hmac.compare_digest(digest, token.digest):
                found = token.principal
        return found

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller of a data view; None when it must be refused (401)."""
        if not self._data:
            return EVERYONE
        return self.identify(authorization)

    def operations_principal(self, authorization: str | None) -> Principal | None:
        if not self._metrics:
            return EVERYONE
        principal = self.identify(authorization)
        return principal if principal is not None and principal.allows("metrics") else None


def _token_id(digest: bytes) -> str:
    """A name for a token in logs and rate limits, which reveals nothing of it."""
    return "tok-" + hashlib.sha256(b"compactor token id:" + digest).hexdigest()[:12]


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
    """Refuse to serve unauthenticated reads beyond loopback, and tokens over plain
    HTTP beyond loopback; warn about what is allowed anyway."""
    if not policy.enabled:
        _check_unauthenticated(service)
    if policy.has_tokens:
        _check_plaintext(service)


def _check_unauthenticated(service: ServiceSettings) -> None:
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


def _check_plaintext(service: ServiceSettings) -> None:
    """Bearer tokens and conversations in clear text beyond loopback: refused unless
    ``allow_plaintext_http``, then a WARNING at every start (and reload)."""
    if is_loopback(service.web_host) or service.tls_certfile is not None:
        return
    if not service.allow_plaintext_http:
        raise ConfigError(
            f"[service].web_host = {service.web_host!r} is not a loopback address and "
            "tokens are configured, but the HTTP API has no TLS: every bearer token and "
            "conversation would cross the network in clear text. Set "
            "[service].tls_certfile and tls_keyfile, bind to 127.0.0.1, or set "
            "[service].allow_plaintext_http = true for a network you trust entirely "
            "(docs/security.md)"
        )
    log.warning(
        "PLAINTEXT HTTP on %s:%d with tokens configured ([service].allow_plaintext_http "
        "= true): bearer tokens and conversations cross the network unencrypted; set "
        "[service].tls_certfile / tls_keyfile (docs/security.md)",
        service.web_host,
        service.web_port,
    )
