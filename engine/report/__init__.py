"""The reporting package: every piece of HTML GapLens makes comes from here.

Markup lives in Jinja2 templates under `templates/` (rendered with autoescape on), so every
string from outside (prompts, axis names, LLM and VQA replies, imported runs) is escaped by
construction; a fragment that is already safe HTML (a chart this package rendered) enters a
template as `Markup`. JSON inside a `<script>` uses the `|tojson` filter (which encodes `<`,
`>`, `&` and `'`, so no string can close the script). Python modules here only prepare data:
one module per method page (`page(results) -> Markup`), `generic` for any other method,
`charts`, `runs` (the Runs view), `export` (the report file) and `study` (the study pages).

Layers (DESIGN.md): tabs, the CLI and export read this package; nothing below it
(methods, core, backends, store, metrics) imports it.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from typing import Callable

from markupsafe import Markup, escape

from ..backends.base import CANT_TELL
from ..common.scores import is_missing

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"

# Methods whose page module is engine/report/<name>.py (used until engine.methods.METHODS names them).
PAGES = ("single_prompt", "generate", "counterfactuals", "intersectional", "mine", "mitigate")

__all__ = ["Markup", "escape", "render", "macro", "environment", "fmt", "fmt_ci", "signed", "clip", "static",
           "page_for", "PAGES"]


def fmt(value, digits: int = 3) -> str:
    """`value` with `digits` decimals; "n/a" for None, NaN or a non-number; never "-0.000"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or is_missing(value):
        return "n/a" if value is None or isinstance(value, (int, float)) else str(value)
    text = f"{value:.{int(digits)}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt_ci(value, ci=None, digits: int = 3) -> str:
    """"value [low, high]" (each through `fmt`)."""
    lo, hi = ci if ci else (None, None)
    return f"{fmt(value, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def signed(value, digits: int = 3) -> str:
    """`value` with an explicit sign ("+0.120", "-0.050"); a value that rounds to zero has none."""
    text = fmt(value, digits)
    if text == "n/a" or float(text) == 0:
        return text
    return text if text.startswith("-") else "+" + text


def clip(text, length: int = 80, keep: str = "start") -> str:
    """`text` cut to `length` characters, keeping its start (or its end, `keep="end"`), with
    "…" where something was cut (never silently)."""
    text = "" if text is None else str(text)
    if len(text) <= length:
        return text
    n = max(0, length - 1)
    return "…" + text[len(text) - n:] if keep == "end" else text[:n] + "…"


def percent(value, digits: int = 0) -> str:
    return "n/a" if not isinstance(value, (int, float)) or is_missing(value) else f"{value:.{digits}%}"


@lru_cache(maxsize=None)
def static(name: str) -> str:
    """The text of `static/<name>` (CSS and JS shipped with the pages), read once."""
    return (STATIC / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def environment():
    """The one Jinja2 environment: templates from `templates/`, autoescape always on."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    env.filters.update(fmt=fmt, fmt_ci=fmt_ci, signed=signed, clip=clip, percent=percent)
    return env


def render(template: str, **context) -> Markup:
    """`templates/<template>` rendered with `context`; the result is safe to embed in another template."""
    return Markup(environment().get_template(template).render(**context))


def macro(template: str, name: str) -> Callable[..., Markup]:
    """The macro `name` of `templates/<template>` as a function returning Markup."""
    fn = getattr(environment().get_template(template).module, name)
    return lambda *args, **kwargs: Markup(fn(*args, **kwargs))


def thumbnail_data_uri(path: str, size: int = 128, quality: int = 82) -> str:
    """A small JPEG of the image as a data: URI (for self-contained HTML)."""
    import base64
    import io

    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((size, size))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def with_cant_tell(m: dict, classes: list, shares: list, counts: list | None = None, ci: list | None = None):
    """Returns (classes, shares, counts, ci) with "can't tell" as one more bar when the distribution
    `m` counts it (issue 35: its share of all images, with its Jeffreys interval "cant_tell_ci" where
    the run has one; never a class of the metrics), else as given."""
    if "cant_tell" not in m:
        return classes, shares, counts, ci
    return ([*classes, CANT_TELL], [*shares, m["cant_tell_share"]],
            None if counts is None else [*counts, m["cant_tell"]],
            None if ci is None else [*ci, tuple(m.get("cant_tell_ci") or (None, None))])


def cant_tell_note(m: dict) -> Markup:
    """The sentence under a distribution where more than 20% of the answers are "can't tell" (else empty)."""
    return render("note.html", text=m["cant_tell_note"]) if m.get("cant_tell_note") else Markup("")


def page_for(method: str) -> Callable[[dict], Markup]:
    """The `page(results) -> Markup` function of `method`: the module `METHODS[method].page`
    names when engine.methods has that table, else engine/report/<method>.py for a method in
    PAGES; the generic page for any other method (or one whose page module does not exist)."""
    module = None
    try:
        from engine.methods import METHODS  # type: ignore[attr-defined]

        entry = METHODS.get(method)
        module = getattr(entry, "page", None) if entry is not None else None
    except ImportError:
        module = f"{__name__}.{method}" if method in PAGES else None
    try:
        return importlib.import_module(module or f"{__name__}.generic").page
    except ModuleNotFoundError as exc:
        if exc.name != module:  # a page that exists but fails to import is a bug: say so
            raise
        return importlib.import_module(f"{__name__}.generic").page
