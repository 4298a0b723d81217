"""Helpers every tab uses: error translation, ZeroGPU wrapping, gallery items, status text."""
from __future__ import annotations

import functools
import inspect

import gradio as gr

from engine.errors import GapLensError

try:  # On a Hugging Face Space with ZeroGPU, GPU work must run inside spaces.GPU.
    import spaces

    def gpu(fn=None, *, duration=120):
        """spaces.GPU: `duration` is seconds, or a callable taking the handler's inputs and returning
        them (ZeroGPU's dynamic duration: a short request gets a GPU sooner)."""
        return spaces.GPU(duration=duration)(fn) if fn else spaces.GPU(duration=duration)
except ImportError:  # elsewhere it is a no-op
    def gpu(fn=None, *, duration=120):
        return fn if fn else (lambda f: f)

# Seconds a GPU call may take: start-up (moving weights, VQA, CLIP and the LLM) plus each image-step.
GPU_BASE_SECONDS = 30
GPU_SECONDS_PER_IMAGE_STEP = 0.5   # FLUX.1-schnell at 1024 px on an H200 is about 0.3 s a step per image
GPU_MAX_SECONDS = 300
DEFAULT_STEPS_GUESS = 30           # a blank steps field means the family default: assume a slow one


def gpu_seconds(images, steps, calls: int = 1) -> int:
    """Returns the GPU time to ask ZeroGPU for: GPU_BASE_SECONDS + images x steps x calls x
    GPU_SECONDS_PER_IMAGE_STEP, capped at GPU_MAX_SECONDS (blank or bad inputs count as large)."""
    def number(value, fallback):
        try:
            return max(1, int(float(value)))
        except (TypeError, ValueError):
            return fallback
    work = number(images, 16) * number(steps, DEFAULT_STEPS_GUESS) * max(1, int(calls))
    return int(min(GPU_MAX_SECONDS, GPU_BASE_SECONDS + work * GPU_SECONDS_PER_IMAGE_STEP))


def gpu_seconds_for_sets(n, steps, rows) -> int:
    """Returns gpu_seconds for an initial set plus one set per row of a counterfactual table."""
    try:
        count = len(rows) if rows is not None else 0
    except TypeError:
        count = 8
    return gpu_seconds(n, steps, calls=1 + count)


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


def status_markdown(status: dict) -> str:
    models = "\n".join(f"| {role} | `{label}` |" for role, label in status["models"].items())
    loaded = ", ".join(m["model"] for m in status["loaded"]) or "none yet (models load on first use)"
    return (f"**Preset:** `{status['preset']}`: {status['reason']}\n\n"
            f"| role | model |\n|---|---|\n{models}\n\n"
            f"**Loaded:** {loaded}  \n**Device:** {status['device']}; {status['memory']}  \n"
            + (f"**Memory:** {status['resident']}  \n" if status.get("resident") else "")
            + f"**Store:** `{status['data_dir']}`: {status['stored_images']} images, {status['runs']} runs; "
            f"at most {status['max_images']} images per set")

