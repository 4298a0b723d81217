"""The chart runtime (engine/report/static/vega_runtime.js after the Vega bundle, ~0.9 MB) as a file
the browser fetches once and keeps, not text inlined in every page.

Inlined in the page's head it was sent twice with every page (in the HTML and in its config, 1.7 MB
in all), parsed as JSON and then as a script before Gradio drew anything. Now the head has one
`<script src>` of `gradio_api/file=<temporary folder>/gaplens-charts-<hash>.js`, a Gradio static
path (`gr.set_static_paths`: that one file, nothing else there), which Gradio's page loads without
waiting for it and browsers keep for good (`CacheForever`: its name changes with its text). An
exported report still inlines the runtime (`charts.runtime_head`): it opens with the network off.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from engine.report import charts

DIRECTORY = Path(tempfile.gettempdir()) / "gaplens-static"
KEEP = b"public, max-age=31536000, immutable"
_served: set[str] = set()   # the ends of the runtime's request paths ("/gradio_api/file=..."), kept forever


def head() -> str:
    """The app's `<head>` addition: the runtime's `<script src>`, the file written and served."""
    path = charts.runtime_file(DIRECTORY)
    address = url(path)
    if "/" + address not in _served:   # gr.set_static_paths adds to one list for the whole process
        gr.set_static_paths([path])
        _served.add("/" + address)
    return str(charts.runtime_link(address))


def url(path: Path) -> str:
    """The runtime's address relative to the page (Gradio's `<base href>`), as Gradio serves files."""
    return f"gradio_api/file={path.as_posix()}"


class CacheForever:
    """ASGI middleware: the runtime's response says a browser may keep it a year without asking again
    (Gradio sends files with only an ETag, so each new page would ask)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.endswith(tuple(_served)):
            return await self.app(scope, receive, send)

        async def kept(message):
            if message["type"] == "http.response.start" and message["status"] == 200:
                message["headers"] = [*message.get("headers", []), (b"cache-control", KEEP)]
            await send(message)
        return await self.app(scope, receive, kept)
