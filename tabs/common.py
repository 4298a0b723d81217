"""Helpers every tab uses: error translation, ZeroGPU wrapping, gallery items, status text."""
from __future__ import annotations

import functools
import inspect

import gradio as gr

from engine.errors import GapLensError

try:  # On a Hugging Face Space with ZeroGPU, GPU work must run inside spaces.GPU.
    import spaces

    def gpu(fn=None, *, duration: int = 120):
        return spaces.GPU(duration=duration)(fn) if fn else spaces.GPU(duration=duration)
except ImportError:  # elsewhere it is a no-op
    def gpu(fn=None, *, duration: int = 120):
        return fn if fn else (lambda f: f)


def user_errors(fn):
    """Show GapLensError (bad input, a model that fails to load, bad LLM output) as a gr.Error
    naming the problem instead of a traceback. Works for plain and generator handlers."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except GapLensError as exc:
                raise gr.Error(str(exc), title=type(exc).__name__.replace("Error", " error")) from exc
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GapLensError as exc:
            raise gr.Error(str(exc), title=type(exc).__name__.replace("Error", " error")) from exc
    return call


def gallery_items(records, captions=None) -> list[tuple[str, str]]:
    """(path, caption) pairs for gr.Gallery; flagged images say so in their caption."""
    items = []
    for i, r in enumerate(records):
        caption = captions[i] if captions else f"seed {r.seed}"
        if r.nsfw:
            caption += " [flagged by safety checker: excluded]"
        items.append((r.path, caption))
    return items


def not_built_yet(name: str, issue: str) -> None:
    gr.Markdown(f"### {name}\nThis tab is not built yet ({issue}). The engine and the Single Prompt "
                f"tab work today; this one arrives in a coming release.", elem_classes=["gl-placeholder"])


def status_markdown(status: dict) -> str:
    models = "\n".join(f"| {role} | `{label}` |" for role, label in status["models"].items())
    loaded = ", ".join(m["model"] for m in status["loaded"]) or "none yet (models load on first use)"
    return (f"**Preset:** `{status['preset']}`: {status['reason']}\n\n"
            f"| role | model |\n|---|---|\n{models}\n\n"
            f"**Loaded:** {loaded}  \n**Device:** {status['device']}; {status['memory']}  \n"
            f"**Store:** `{status['data_dir']}`: {status['stored_images']} images, {status['runs']} runs; "
            f"at most {status['max_images']} images per set")


# -- rendering shared by the tabs and the Runs view ----------------------------------------------
from engine import charts  # noqa: E402


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_ci(value, ci, digits: int = 3) -> str:
    lo, hi = ci if ci else (None, None)
    return f"{fmt(value, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def axis_html(name: str, m: dict) -> str:
    """One axis: its distribution (bars with counts and 95% CIs, target ticks) and its metrics."""
    classes = m["classes"]
    counts = m["counts"]
    shares = [m["representation_parity"].get(c, 0.0) for c in classes]
    share_ci = [tuple(m["share_ci"][c]) for c in classes] if "share_ci" in m else None
    ref = m.get("reference")
    targets = ([ref.get(c) for c in classes] if isinstance(ref, dict)
               else [1 / len(classes)] * len(classes) if classes else None)
    chart = charts.bar_chart(classes, shares, title=f"{name}", counts=[counts.get(c, 0) for c in classes],
                             ci=share_ci, reference=targets, vmax=1.0, chart_id=f"axis-{name}")
    ci = m.get("ci", {})
    rows = [("Composite Bias Score", "composite_bias_score"), ("Parity Difference", "parity_difference"),
            ("Normalised entropy", "normalised_entropy"),
            (f"KL from reference ({m.get('kl_unit', '')})", "kl_divergence"),
            ("Bias Amplification", "bias_amplification")]
    table = "".join(f"<tr><td>{label}</td><td class='gl-metric' data-metric='{key}'>"
                    f"{fmt_ci(m.get(key), ci.get(key))}</td></tr>" for label, key in rows)
    excluded = (f"<p style='font-size:12px'>{m['n_excluded']} answer(s) outside the classes "
                f"(e.g. 'other') are excluded.</p>" if m.get("n_excluded") else "")
    return (f"<div class='gl-axis' data-axis='{name}'><div class='gl-chart'>{chart}</div>"
            f"<table style='font-size:13px'><tr><th>metric ({m.get('mode', '')} mode)</th><th>value [95% CI]</th></tr>"
            f"{table}</table>{excluded}</div>")
