"""Requests forwarded between workers, and HTTPS for the HTTP API.

Faust forwards ``/conversations/{id}`` (``app.topic_route``) to the worker that
owns the conversation's partition, through ``Router._route_req``, which sends
the caller's headers as they are. ``install`` replaces that one method on the
app's router: the forwarding worker drops the caller's ``Authorization`` and
sends instead the principal its guard verified (tenant, scopes, token id),
signed with HMAC-SHA256 under the deployment's internal key, with the method,
the path, a timestamp, a random nonce and the destination (the owner's
advertised host and port). The owner accepts those headers only on the
forwarded path (``GET /conversations/{id}``), only with a valid signature
within ``MAX_SKEW_SECONDS`` of its clock, addressed to itself, whose nonce it
has not seen (``streams.http.nonces``: a captured request cannot be sent
again, to this worker or another), and never forwards such a request again.

The internal key is ``[service].internal_token``, else derived from the
PostgreSQL DSN (which every worker of a deployment shares) when it carries a
password. Without either, nothing is secret to sign with, and a caller's
token never goes to whatever address a consumer-group member advertised: a
request that carries one and would need forwarding is answered 503, naming
``[service].internal_token`` (the worker logs a WARNING at start when tokens
are configured). Without tokens (loopback only, no credential to leak)
requests are forwarded as Faust does. See docs/security.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import ssl
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import faust
from aiohttp import web
from faust.exceptions import SameNode
from faust.web.exceptions import ServiceUnavailable
from yarl import URL

from core.settings import ConfigError, ServiceSettings
from streams.http.auth import ALL_SCOPES, Principal
from streams.http.nonces import SeenNonces

log = logging.getLogger("compactor.auth")

PRINCIPAL = web.RequestKey("compactor.principal", Principal)
# Set on a request that arrived forwarded (never forwarded again).
FORWARDED = web.RequestKey("compactor.forwarded", bool)

PRINCIPAL_HEADER = "X-Compactor-Forwarded-Principal"
SIGNATURE_HEADER = "X-Compactor-Forwarded-Signature"
# The only path a worker forwards (app.topic_route of the Conversation view).
FORWARDABLE = re.compile(r"^/conversations/[^/]+$")
MAX_SKEW_SECONDS = 30.0
# The signed payload's version: 2 added the nonce and the destination (a worker
# refuses version 1, which could be replayed).
VERSION = 2
NO_INTERNAL_KEY = (
    "this conversation is served by another worker, and requests are only forwarded "
    "with a signed principal: set [service].internal_token (the same on every worker)"
)
# Headers never passed on: the caller's credential, and what aiohttp sets itself.
_STRIPPED = frozenset(
    {"authorization", "host", "content-length", "transfer-encoding", "connection"}
    | {PRINCIPAL_HEADER.lower(), SIGNATURE_HEADER.lower()}
)


def internal_key(service: ServiceSettings, dsn: str | None) -> bytes | None:
    """The key forwarded requests are signed with; None when nothing secret is configured."""
    if service.internal_token is not None:
        secret = service.internal_token.get_secret_value().encode()
        return hmac.new(secret, b"compactor forwarding v1", hashlib.sha256).digest()
    if dsn and urlsplit(dsn).password:
        message = f"compactor forwarding v1:{service.app_id}".encode()
        return hmac.new(dsn.encode(), message, hashlib.sha256).digest()
    return None


def node_of(url: URL | str) -> str:
    """A worker's identity as a destination: the host and port of its advertised
    URL (``Router._urlident``'s, which picks the destination)."""
    parsed = url if isinstance(url, URL) else URL(url)
    host = (parsed.host if parsed.scheme else parsed.path) or ""
    return f"{host.lower()}:{int(parsed.port or 80)}"


@dataclass(frozen=True)
class Refused:
    """A forwarded request's signed headers refused (401), and why (for tests)."""

    reason: str


@dataclass(frozen=True)
class Forwarding:
    """How this worker signs the requests it forwards and checks those it gets.

    ``here`` is this worker's identity as a destination (``node_of`` its
    advertised URL, read when a request arrives, as Faust's router reads it)."""

    key: bytes | None
    client_ssl: ssl.SSLContext | None = None
    here: Callable[[], str] = lambda: ""
    seen: SeenNonces = field(default_factory=lambda: SeenNonces(MAX_SKEW_SECONDS))

    def sign(
        self,
        principal: Principal,
        method: str,
        path_qs: str,
        destination: str,
        now: float | None = None,
    ) -> dict[str, str]:
        assert self.key is not None
        payload = {
            "v": VERSION,
            "t": principal.tenant,
            "s": sorted(principal.scopes),
            "i": principal.token_id,
            "ts": time.time() if now is None else now,
            "m": method.upper(),
            "p": path_qs,
            "d": destination,
            "n": secrets.token_urlsafe(16),
        }
        encoded = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
        return {PRINCIPAL_HEADER: encoded, SIGNATURE_HEADER: self._mac(encoded).decode()}

    def verify(
        self, headers: Mapping[str, str], method: str, path_qs: str, now: float | None = None
    ) -> Principal | Refused:
        """The signed principal of a forwarded request, or why it is refused."""
        payload = self._signed_payload(headers)
        if isinstance(payload, Refused):
            return payload
        try:
            tenant, scopes, token_id = payload["t"], payload["s"], payload["i"]
            stamp, nonce = payload["ts"], payload["n"]
            signed = (payload["v"], payload["m"], payload["p"], payload["d"])
        except (KeyError, TypeError):
            return Refused("malformed")
        moment = time.time() if now is None else now
        if signed != (VERSION, method.upper(), path_qs, self.here()):
            return Refused("another version, method, path or destination")
        if (
            not isinstance(stamp, int | float)
            or abs(moment - stamp) > MAX_SKEW_SECONDS
            or not isinstance(nonce, str)
            or not isinstance(scopes, list)
            or not set(scopes) <= ALL_SCOPES
            or not (tenant is None or isinstance(tenant, str))
        ):
            return Refused("stale or malformed")
        if (seen := self.seen.record(nonce, float(stamp))) != "new":
            return Refused(seen)
        return Principal(tenant, frozenset(scopes), str(token_id))

    def _signed_payload(self, headers: Mapping[str, str]) -> dict[str, object] | Refused:
        """The payload whose signature is this deployment's; bytes are compared
        (a header that is not ASCII is refused, never compared as text)."""
        encoded, signature = headers.get(PRINCIPAL_HEADER), headers.get(SIGNATURE_HEADER)
        if self.key is None or not encoded or not signature or len(encoded) > 4096:
            return Refused("missing")
        if not (encoded.isascii() and signature.isascii()):
            return Refused("not ASCII")
        if not hmac.compare_digest(self._mac(encoded), signature.encode("ascii")):
            return Refused("signature")
        try:
            payload = json.loads(base64.urlsafe_b64decode(encoded.encode("ascii")))
        except ValueError:
            return Refused("malformed")
        return payload if isinstance(payload, dict) else Refused("malformed")

    def _mac(self, encoded: str) -> bytes:
        assert self.key is not None
        return hmac.new(self.key, encoded.encode("ascii"), hashlib.sha256).hexdigest().encode()


def install(app: faust.App, forwarding: Forwarding) -> None:
    """Route this app's forwarded requests through ``signed_route_req``."""
    router = app.router
    router.compactor_forwarding = forwarding  # type: ignore[attr-defined]
    router._route_req = types.MethodType(signed_route_req, router)  # type: ignore[attr-defined]


async def signed_route_req(self: Any, dest_url: URL, web_driver: Any, request: Any) -> Any:
    """Faust's ``Router._route_req``, with the caller's token replaced by a signed principal."""
    app = self.app
    host, port = self._urlident(dest_url)
    if (host, port) == self._urlident(app.conf.canonical_url):
        raise SameNode()
    forwarding: Forwarding = self.compactor_forwarding
    incoming = cast(web.Request, request)
    if incoming.get(FORWARDED):
        # Forwarded to us, and we do not own the key either (a rebalance in
        # between): one hop only, the caller retries.
        raise ServiceUnavailable()
    headers = {k: v for k, v in incoming.headers.items() if k.lower() not in _STRIPPED}
    if forwarding.key is None:
        if "Authorization" in incoming.headers:  # never sent on (see the module)
            return web_driver.json({"error": NO_INTERNAL_KEY}, status=503)
    else:
        found = incoming.get(PRINCIPAL)
        principal = found if isinstance(found, Principal) else Principal("", frozenset({"read"}))
        destination = node_of(dest_url)
        headers.update(forwarding.sign(principal, incoming.method, incoming.path_qs, destination))
    routed_url = incoming.url.with_host(host).with_port(int(port))
    extra: dict[str, Any] = {} if forwarding.client_ssl is None else {"ssl": forwarding.client_ssl}
    async with app.http_client.request(
        method=incoming.method, headers=headers, url=routed_url, **extra
    ) as response:
        return web_driver.text(
            await response.text(), content_type=response.content_type, status=response.status
        )


def server_ssl_context(service: ServiceSettings) -> ssl.SSLContext | None:
    """The HTTPS context of the web server, or None (plain HTTP)."""
    cert, key = service.tls_certfile, service.tls_keyfile
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "tls_certfile" if cert is None else "tls_keyfile"
        raise ConfigError(
            f"[service].{missing} is needed too: HTTPS needs a certificate and its key"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(
            f"[service].tls_certfile / tls_keyfile cannot be loaded: {error}"
        ) from None
    return context


def client_ssl_context(service: ServiceSettings) -> ssl.SSLContext | None:
    """How a forwarding worker verifies the owner's certificate (None: aiohttp's default)."""
    if service.tls_cafile is None:
        return None
    try:
        return ssl.create_default_context(cafile=service.tls_cafile)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"[service].tls_cafile cannot be loaded: {error}") from None
