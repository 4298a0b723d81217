"""The reporting package: every piece of HTML GapLens makes comes from here.

Markup lives in Jinja2 templates under `templates/` (`*.html`, rendered with autoescape on),
so every string from outside (prompts, axis names, LLM and VQA replies, imported runs) is
escaped by construction; a fragment that is already safe HTML (a chart this package rendered)
enters a template as `Markup`. JSON inside a `<script>` uses the `|tojson` filter.

Layers (DESIGN.md): tabs, the CLI and export read this package; nothing below it
(methods, core, backends, store, metrics) imports it.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from markupsafe import Markup, escape

TEMPLATES = Path(__file__).resolve().parent / "templates"

__all__ = ["Markup", "escape", "render", "environment"]


@lru_cache(maxsize=1)
def environment():
    """The one Jinja2 environment: templates from `templates/`, autoescape always on."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    return env


def render(template: str, **context) -> Markup:
    """`templates/<template>` rendered with `context`; the result is safe to embed in another template."""
    return Markup(environment().get_template(template).render(**context))
