"""Helpers every tab uses: error translation, ZeroGPU wrapping, gallery items, status text."""
from __future__ import annotations

import functools
import hmac
import inspect
import os

import gradio as gr

from engine import access
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


# -- visitors of a public GapLens (engine/access.py) ------------------------------------------------
HOST_TOKEN_HEADER = "x-gaplens-host-token"
GPU_QUEUE = "gaplens-gpu"


def visitor_of(request: gr.Request | None) -> access.Visitor:
    """Who sent `request`: the host (header `x-gaplens-host-token` equal to $GAPLENS_HOST_TOKEN,
    or a Hugging Face login listed in $GAPLENS_HOSTS, default the Space's owner), else a
    visitor keyed by their Hugging Face login where the Space has OAuth, else by their Gradio
    session; with the client address it came from (`access.client_address`)."""
    if request is None:
        return access.ANONYMOUS
    headers = getattr(request, "headers", None) or {}
    token = os.environ.get("GAPLENS_HOST_TOKEN", "")
    sent = headers.get(HOST_TOKEN_HEADER, "")
    if token and sent and hmac.compare_digest(token.encode(), str(sent).encode()):
        return access.HOST
    address = access.client_address(getattr(getattr(request, "client", None), "host", None),
                                    headers.get("x-forwarded-for"), behind_proxy=bool(os.environ.get("SPACE_ID")))
    username = None
    try:
        info = request.session.get("oauth_info") or {}
        username = (info.get("userinfo") or {}).get("preferred_username")
    except Exception:  # noqa: BLE001 - no session middleware: the Space has no OAuth
        username = None
    if username:
        hosts = {h.strip() for h in os.environ.get("GAPLENS_HOSTS", os.environ.get("SPACE_AUTHOR_NAME", "")).split(",")}
        return access.HOST if username in hosts else access.Visitor(f"hf:{username}", address=address)
    if getattr(request, "username", None):
        return access.Visitor(f"user:{request.username}", address=address)
    if getattr(request, "session_hash", None):
        return access.Visitor(f"session:{request.session_hash}", address=address)
    return access.Visitor(access.ANONYMOUS.id, address=address)


def as_visitor(fn):
    """`fn` run for the visitor who sent the request (Gradio passes the gr.Request to the
    first parameter this wrapper adds), with GapLensError shown as gr.Error. Generators get
    the visitor around every step, whatever thread Gradio runs the step in."""
    fn = user_errors(fn)
    if inspect.isgeneratorfunction(fn):
        def wrapper(gaplens_request, *args, **kwargs):
            visitor = visitor_of(gaplens_request)
            stream = fn(*args, **kwargs)
            try:
                while True:
                    with access.acting_as(visitor):
                        try:
                            item = next(stream)
                        except StopIteration:
                            return
                    yield item
            finally:
                with access.acting_as(visitor):
                    stream.close()
    else:
        def wrapper(gaplens_request, *args, **kwargs):
            with access.acting_as(visitor_of(gaplens_request)):
                return fn(*args, **kwargs)
    signature = inspect.signature(fn)
    request = inspect.Parameter("gaplens_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    wrapper.__signature__ = signature.replace(parameters=[request, *signature.parameters.values()])
    wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), "gaplens_request": gr.Request}
    wrapper.__wrapped__ = getattr(fn, "__wrapped__", fn)  # resolves the original's string annotations
    wrapper.__name__ = getattr(fn, "__name__", "handler")
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


def bind_visitors(demo: gr.Blocks) -> None:
    """Public mode: run every event handler of `demo` for its visitor (`as_visitor`), and put
    the streaming handlers (the methods, which use the GPU) in one queue of concurrency 1."""
    for block_fn in demo.fns.values():
        if block_fn.fn is None:
            continue
        if inspect.isgeneratorfunction(block_fn.fn):
            block_fn.concurrency_id = GPU_QUEUE
        block_fn.fn = as_visitor(block_fn.fn)


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
        if getattr(r, "refused", None):
            caption += " [refused by the API: excluded]"
        elif r.nsfw:
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
            f"at most {status['max_images']} images per set" + _source_note(status)
            + (f"  \n**This hour you may still** generate {status['left']['images']} images and make "
               f"{status['left']['llm_calls']} LLM calls" if status.get("left") else ""))


def _source_note(status: dict) -> str:
    kind = status.get("generator_kind", "model")
    if kind == "api":
        return (f"  \n**Images API:** not seedable, so regenerating an image does not reproduce it (stored images "
                f"are reused); at most {status.get('max_api_calls')} API calls per run")
    if kind == "source":
        return ("  \n**Existing images:** the generator is a folder or dataset; image i of a prompt is its i-th "
                "image, and Mine Prompts / Mitigate, which need new images, are not available")
    return ""

