"""The inspector page at ``/ui/``: static HTML, CSS and JavaScript shipped in the package.

No build step and nothing from a CDN: the three files beside this module are
served as they are (read once, at registration). They hold no data, so the
guard lets ``/ui/`` through without a token (``is_ui_path``); the page asks for
a token, keeps it in the tab's ``sessionStorage`` and reads everything through
the same views as any client, so a tenant token sees its tenant only. The
Content-Security-Policy allows this origin's scripts and styles only.
"""

from __future__ import annotations

from importlib import resources

import faust
from faust.web import Request, Response, View

PREFIX = "/ui"
_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "inspector.js": "text/javascript; charset=utf-8",
    "inspector.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_ui_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def asset_names() -> tuple[str, ...]:
    return tuple(_TYPES)


def read_asset(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def register_ui(app: faust.App) -> None:
    """``/ui`` (redirect), ``/ui/`` (the page) and ``/ui/{name}`` (its script and style)."""
    assets = {name: read_asset(name) for name in _TYPES}

    def serve(view: View, name: str) -> Response:
        if name not in assets:
            return view.json({"error": f"no file {name!r} here"}, status=404)
        return view.bytes(assets[name], headers={**HEADERS, "Content-Type": _TYPES[name]})

    @app.page(PREFIX)
    class Root(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(b"", status=308, headers={"Location": PREFIX + "/"})

    @app.page(PREFIX + "/")
    class Page(View):
        async def get(self, request: Request) -> Response:
            return serve(self, "index.html")

    @app.page(PREFIX + "/{name}")
    class Asset(View):
        async def get(self, request: Request, name: str) -> Response:
            return serve(self, name)
