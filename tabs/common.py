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


def with_notes(status: str, notes: list[str]) -> str:
    """The status line with the run's warnings under it as a "Notes" list (repeats counted):
    warnings belong to the result they describe, not to a toast that covers it."""
    if not notes:
        return status
    counts: dict[str, int] = {}
    for note in notes:
        counts[note] = counts.get(note, 0) + 1
    items = "\n".join(f"- {note}" + (f" (×{k})" if k > 1 else "") for note, k in counts.items())
    return f"{status}\n\n**Notes ({len(notes)})**\n\n{items}"


def distinct_captions(records) -> list[str]:
    """'seed N: <what differs>' per record: the words every shown prompt starts with are left
    out, so captions cut to one line still say which prompt an image is of ('seed 3: a female
    doctor' rather than 'a photo of a...')."""
    words = [r.prompt.split() for r in records]
    if len({tuple(w) for w in words}) < 2:
        return [f"seed {r.seed}" for r in records]
    start = 0
    while all(len(w) > start for w in words) and len({w[start] for w in words}) == 1:
        start += 1
    return [f"seed {r.seed}: " + " ".join(w[start:] or w) for r, w in zip(records, words)]


def gallery_items(records, captions=None) -> list[tuple[str, str]]:
    """(path, caption) pairs for gr.Gallery; flagged images say so in their caption."""
    items = []
    for i, r in enumerate(records):
        caption = captions[i] if captions else f"seed {r.seed}"
        if r.nsfw:
            caption += " [flagged by safety checker: excluded]"
        items.append((r.path, caption))
    return items


def status_markdown(status: dict) -> str:
    models = "\n".join(f"| {role} | `{label}` |" for role, label in status["models"].items())
    loaded = ", ".join(m["model"] for m in status["loaded"]) or "none yet (models load on first use)"
    return (f"**Preset:** `{status['preset']}`: {status['reason']}\n\n"
            f"| role | model |\n|---|---|\n{models}\n\n"
            f"**Loaded:** {loaded}  \n**Device:** {status['device']}; {status['memory']}  \n"
            f"**Store:** `{status['data_dir']}`: {status['stored_images']} images, {status['runs']} runs; "
            f"at most {status['max_images']} images per set")

