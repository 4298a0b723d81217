"""Helpers every tab uses: error translation, ZeroGPU wrapping, gallery items, status text."""
from __future__ import annotations

import functools
import hmac
import inspect
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import gradio as gr

from engine.common import access
from engine.backends.device import on_zero_gpu
from engine.common.errors import GapLensError
from engine.common.events import Done, Event, Progress, Warning
from engine.methods import METHODS
from engine.methods.options import field_default
from engine.hosting.space import GpuWork, gpu_seconds, needs_gpu

logger = logging.getLogger(__name__)
GPU_HANDLER = "gaplens_gpu_handler"   # set on the function of every handler `gpu` wraps


def gpu(engine, *, duration=None, specs=None, check=None):
    """Decorator for a handler (plain or generator) whose work may need the GPU. On a ZeroGPU Space the
    handler runs inside spaces.GPU, in the worker process `spaces` forks, when the request uses a device
    model, decided per call: `specs(*args, **kwargs)` returns the ModelSpecs the request uses (default the
    engine's preset), and work with the synthetic world, an images API or a folder runs here, spending no
    GPU quota. The visitor and the engine's model configuration (`Engine.model_config`) travel into the
    GPU function as arguments and are set there: the worker may have been forked for another visitor or
    preset. `duration(*args, **kwargs)` returns the work the call will do (engine.hosting.space.GpuWork, or a
    list of them), which `gpu_seconds` turns into the seconds to ask this hardware for (a number is taken as
    seconds; default 60); the mark `gpu_work` finds on the handler is that function. `check(*args, **kwargs)`
    runs first, outside the GPU function, and raises GapLensError for a request the handler refuses (a run
    that is not the visitor's, a value out of bounds): a refused request never takes a ZeroGPU slot.
    Callables get the handler's arguments by name (a `*values` parameter's in order), however Gradio passed
    them. Elsewhere the handler runs as it is (it checks its request itself). GapLensError becomes gr.Error
    (user_errors) either way."""
    def decorate(fn):
        fn = user_errors(fn)
        signature = inspect.signature(fn)

        def named(call):
            def by_name(*args, **kwargs):
                arguments, rest = {}, ()
                for name, value in signature.bind(*args, **kwargs).arguments.items():
                    kind = signature.parameters[name].kind
                    if kind is inspect.Parameter.VAR_POSITIONAL:   # *values: passed on in order
                        rest = value
                    elif kind is inspect.Parameter.VAR_KEYWORD:    # **form: by its own names
                        arguments.update(value)
                    else:
                        arguments[name] = value
                return call(*rest, **arguments)
            return by_name

        work = named(duration) if callable(duration) else (lambda *args, **kwargs: duration or 60)
        setattr(inspect.unwrap(fn), GPU_HANDLER, work)
        if not on_zero_gpu():
            return fn
        on_gpu = _spaces_gpu(engine, fn, work)
        needed = named(specs) if specs else (lambda *args, **kwargs: engine.preset.specs().values())
        refused = named(check) if check else (lambda *args, **kwargs: None)
        if inspect.isgeneratorfunction(fn):
            def handler(*args, **kwargs):
                refused(*args, **kwargs)
                if needs_gpu(needed(*args, **kwargs)):
                    yield from on_gpu(access.current(), engine.model_config(), *args, **kwargs)
                else:
                    yield from fn(*args, **kwargs)
        else:
            def handler(*args, **kwargs):
                refused(*args, **kwargs)
                if needs_gpu(needed(*args, **kwargs)):
                    return on_gpu(access.current(), engine.model_config(), *args, **kwargs)
                return fn(*args, **kwargs)
        return user_errors(functools.wraps(fn)(handler))
    return decorate


def _spaces_gpu(engine, fn, work):
    """`fn` as a spaces.GPU function that takes the visitor and the engine's model configuration first,
    asking for the seconds `work(*args, **kwargs)` takes with the engine's preset (`gpu_seconds`)."""
    import spaces

    if inspect.isgeneratorfunction(fn):
        def inside(visitor, models, *args, **kwargs):
            engine.adopt(models)
            yield from _stream_as(visitor, fn(*args, **kwargs))
    else:
        def inside(visitor, models, *args, **kwargs):
            engine.adopt(models)
            with access.acting_as(visitor):
                return fn(*args, **kwargs)

    def seconds(visitor, models, *args, **kwargs):
        done = work(*args, **kwargs)
        return int(done) if isinstance(done, (int, float)) else gpu_seconds(engine.preset, done)
    return spaces.GPU(duration=seconds)(inside)


def gpu_work(fn):
    """The work function (the handler's arguments -> GpuWork) of a handler `gpu` wrapped, None for any other
    function. `fn` may be wrapped by functools.partial (whose arguments the work function gets too) or
    functools.wraps."""
    args, keywords = (), {}
    while fn is not None:
        mark = getattr(fn, GPU_HANDLER, None)
        if mark is not None:
            return functools.partial(mark, *args, **keywords) if args or keywords else mark
        if isinstance(fn, functools.partial):
            args, keywords = fn.args + args, {**fn.keywords, **keywords}
            fn = fn.func
        else:
            fn = getattr(fn, "__wrapped__", None)
    return None


def calls_gpu(outer, handler):
    """`outer`, an event's function that calls the GPU handler `handler` with the same arguments but its own
    (e.g. to read Gradio's event data first), marked as a GPU handler doing `handler`'s work."""
    setattr(outer, GPU_HANDLER, gpu_work(handler))
    return outer


def is_gpu_handler(fn) -> bool:
    """True when `fn` (an event's function, possibly wrapped by `as_visitor` or functools.partial) is a
    handler `gpu` wrapped."""
    return gpu_work(fn) is not None


def request_check(engine, method: str, make_request):
    """`check(*args, **kwargs)` of a handler whose arguments make a request of `method` (`make_request`):
    the method's own checks and bounds (`preflight`, engine.core.run.recorded), starting nothing."""
    preflight = METHODS[method].run.preflight
    return lambda *args, **kwargs: preflight(make_request(*args, **kwargs), engine)


def in_order(outputs: list, update: dict) -> tuple:
    """The values of `update` ({component or output name: value}) in the order of `outputs` (components
    or names), gr.skip() for the rest: what a GPU handler yields (spaces pickles every value, and
    components do not pickle)."""
    return tuple(update.get(component, gr.skip()) for component in outputs)


def request_work(engine, method: str, request, questions: int = 0) -> GpuWork:
    """The GPU work of a request of `method`: the images and LLM replies its estimate counts (the one its
    budget is checked against: engine.methods.METHODS), each image asked `questions` questions, captioned
    and embedded."""
    cost = METHODS[method].run.estimate(request, until_cap=engine.max_set_images())
    return GpuWork.of_images(cost.images, getattr(request, "steps", None), questions=questions,
                             llm_calls=cost.llm_calls)


class LoadHook(NamedTuple):
    """What a tab's `build` returns for each update of a page when it opens: `fn()` updates
    `outputs`; `after_model_change` (no inputs, the same outputs), when given, runs again
    after the Models panel changes a model; `on_tab_open`, when given, is an event (Gradio's
    listener arguments) run each time the tab is opened; `fn(request)`, when its parameter is named
    `request`, gets the page's gr.Request (its ?query); `loads_models`: `fn` may load a model
    (the generator, for its defaults), so the page's other updates do not wait for it. app.py
    wires them, the hooks of a page together (`together`)."""

    fn: Callable
    outputs: list
    after_model_change: Callable | None = None
    on_tab_open: dict | None = None
    loads_models: bool = False


def together(hooks: list[LoadHook]) -> LoadHook:
    """One hook doing what each of `hooks` does, their outputs in order: a page's start-up sends
    one event instead of one per hook (each a queue round trip for the page and an event's state
    for the server: 23 of them took ~1 s of a fresh page on a quiet 2-core machine). A hook that
    fails leaves its outputs as they were and says why in a toast; the others still update.
    `after_model_change` runs those of the hooks that have one (the others' outputs skipped)."""
    def run(step: Callable[[LoadHook], Callable | None], request: gr.Request | None = None) -> tuple:
        values, failed = [], []
        for hook in hooks:
            fn, got = step(hook), None
            try:
                if fn is not None:
                    got = fn(request) if "request" in inspect.signature(fn).parameters else fn()
            except Exception as exc:  # noqa: BLE001 - one part of the page failing leaves the rest
                if not isinstance(exc, gr.Error):
                    logger.exception("a page-load update failed")
                failed.append(exc.message if isinstance(exc, gr.Error) else f"{type(exc).__name__}: {exc}")
                fn = None
            if fn is None:
                values += [gr.skip()] * len(hook.outputs)
            else:   # Gradio's own rule: a hook with one output returns its value, not a sequence of one
                values += [got] if len(hook.outputs) == 1 else list(got)
        for message in failed:
            gr.Warning(f"part of the page could not be filled in: {message}")
        return tuple(values)

    def start(request: gr.Request):   # Gradio passes the page's request by this annotation
        return run(lambda hook: hook.fn, request)

    changes = any(hook.after_model_change for hook in hooks)
    return LoadHook(start, [o for hook in hooks for o in hook.outputs],
                    (lambda: run(lambda hook: hook.after_model_change)) if changes else None,
                    loads_models=any(hook.loads_models for hook in hooks))


def default(request_class, name: str):
    """The default of the field `name` of a method's request dataclass: a tab's widget starts
    where the CLI and the API start."""
    return field_default(_field(request_class, name))


def options(request_class, name: str, labels: dict | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs of the values the field `name` of a method's request accepts (its
    metadata "choices", which the CLI's --help and the method's check read too); `labels` names
    some values, the rest show as themselves."""
    return [((labels or {}).get(value, value), value) for value in _field(request_class, name).metadata["choices"]]


def _field(request_class, name: str) -> Field:
    return next(f for f in fields(request_class) if f.name == name)


def user_errors(fn):
    """Show GapLensError (bad input, a model that fails to load, bad LLM output) as a gr.Error
    naming the problem instead of a traceback. Works for plain and generator handlers."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except GapLensError as exc:
                raise gr.Error(str(exc), title=exc.title) from exc
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GapLensError as exc:
            raise gr.Error(str(exc), title=exc.title) from exc
    return call


def checked(trigger, engine, method: str, make_request, **event):
    """`trigger` (e.g. `button.click`) bound to a check of the request first: `make_request`
    builds it from the same inputs (`event`: inputs or inputs_kwargs) as the run, then the
    method's own checks run on it (`preflight`, engine.core.engine.recorded); a bad value is one toast
    naming the field. Returns that event: chain the run on it with `.success(...)`, so it never
    starts on a bad request (a handler that raises marks every output it names as failed,
    hiding the result they showed)."""
    request_checked = request_check(engine, method, make_request)

    @user_errors
    def check(*args, **kwargs):
        clicked()
        request_checked(*args, **kwargs)

    check.__signature__ = inspect.signature(make_request)   # Gradio passes the inputs by these names
    return trigger(check, outputs=None, api_name=False, show_progress="hidden", **event)


# -- visitors of a public GapLens (engine/common/access.py) ------------------------------------------------
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
    forwarded = (headers.getlist("x-forwarded-for") if hasattr(headers, "getlist")   # every line, not the first
                 else headers.get("x-forwarded-for"))
    address = access.client_address(getattr(getattr(request, "client", None), "host", None), forwarded,
                                    access.forwarded_hops())
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
            yield from _stream_as(visitor_of(gaplens_request), fn(*args, **kwargs))
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


def _stream_as(visitor: access.Visitor | None, stream):
    """Yields what `stream` yields, running each of its steps (and its closing) for `visitor`, whatever
    thread the step runs in."""
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


def bind_visitors(demo: gr.Blocks) -> None:
    """Public mode: run every event handler of `demo` for its visitor (`as_visitor`), and put
    the streaming handlers (the methods, which use the GPU) in one queue of concurrency 1."""
    for block_fn in demo.fns.values():
        if block_fn.fn is None:
            continue
        if inspect.isgeneratorfunction(block_fn.fn):
            block_fn.concurrency_id = GPU_QUEUE
        block_fn.fn = as_visitor(block_fn.fn)


UPDATE_EVERY = 0.5   # seconds between two updates of a page by frequent events (progress, live tables)


# -- how long a visitor waits: from their click, not from when the run's own record started -------------------
_CLICKS: dict[str, float] = {}   # Gradio session -> time.perf_counter() of its last run button's check
_CLICKS_KEPT = 4096


def _session() -> str | None:
    """The Gradio session of the event being handled (None outside one, e.g. in a ZeroGPU worker)."""
    from gradio.context import LocalContext

    return getattr(LocalContext.request.get(None), "session_hash", None)


def clicked() -> None:
    """Notes that this session's run button was pressed now: its check (`checked`) is the first
    step a click runs, before the queue, the models and the run record."""
    session = _session()
    if session:
        _CLICKS.pop(session, None)
        _CLICKS[session] = time.perf_counter()
        while len(_CLICKS) > _CLICKS_KEPT:   # sessions whose check was refused and that never ran
            _CLICKS.pop(next(iter(_CLICKS)))


def since_click() -> float:
    """When the run being handled was asked for: its session's last click (`clicked`, used up),
    else now (a direct API call, or a worker process that cannot see the click)."""
    started = _CLICKS.pop(_session() or "", None)
    return started if started is not None else time.perf_counter()


@dataclass
class View:
    """One streamed run as its tab shows it, which the tab's `render(event, view)` reads and
    updates: the run's warnings (listed under the status line: they belong to the result they
    describe, not to a toast over it), when it was asked for (the click: `since_click`), the
    latest value of every output shown, and what the tab keeps between events."""

    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=since_click)
    shown: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)

    def waited(self) -> float:
        """Seconds since the run was asked for: what the visitor waited (the run's own record
        starts later, after the check, the queue and loading its models)."""
        return time.perf_counter() - self.started

    def progress_text(self, event: Progress) -> str:
        """'**stage**, about N s left (T s)': the status line of a Progress event."""
        eta = f", about {event.eta_s:.0f} s left" if event.eta_s else ""
        return f"**{event.message or event.stage}**{eta} ({self.waited():.1f} s)"


def streamed(events: Iterable[Event], render: Callable[[Event, View], dict], outputs: list, *,
             status="progress", frequent: tuple = (Progress,), view: View | None = None):
    """The one streaming loop of the tabs: every event but a Warning goes to `render(event, view)`,
    which returns {output: new value} (outputs are names or components); yields each update as the
    values of `outputs` in their order, gr.skip() for the rest, which is what a GPU handler must
    yield (`in_order`), and at Done every output shown so far (`view.shown`, which may start with
    blank values): API clients read the last yield. Warnings join `view.notes`, listed under the
    `status` output. Updates of `frequent` events (default Progress) are dropped when the last went
    out less than UPDATE_EVERY seconds ago: a few a second at most."""
    view = view if view is not None else View()
    status_line, shown_at = view.shown.get(status, ""), 0.0
    for event in events:
        if isinstance(event, Warning):
            view.notes.append(event.message)
            update = {status: status_line} if status_line else {}
        else:
            update = render(event, view) or {}
            if isinstance(event, frequent):
                if not update or time.perf_counter() - shown_at < UPDATE_EVERY:
                    continue
                shown_at = time.perf_counter()
        if status in update:
            status_line = update[status]
            update[status] = with_notes(status_line, view.notes)
        view.shown.update(update)
        if isinstance(event, Done):
            yield in_order(outputs, view.shown)
        elif update:
            yield in_order(outputs, update)


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


EXPORTS = Path(tempfile.gettempdir()) / "gaplens-exports"
EXPORT_MAX_AGE_S = 3600


def export_dir() -> Path:
    """A fresh directory for one download under the system temp dir (Gradio copies what a
    handler returns into its own cache and serves it from there); folders older than an hour
    are removed first, so exports do not pile up."""
    EXPORTS.mkdir(parents=True, exist_ok=True)
    for old in EXPORTS.iterdir():
        try:
            if time.time() - old.stat().st_mtime > EXPORT_MAX_AGE_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix="export-", dir=EXPORTS))


STORE_FILE = re.compile(r"(?:[0-9a-f]{64}|refused)\.png")   # an image of the store, or its refusal placeholder


def served(path) -> str | None:
    """A copy of the store image at `path` in Gradio's cache, which is what a page shows (None for
    a file that is not a store image). The store's own folder is never served (app.allowed_paths):
    the copy's folder is a hash of its bytes keyed by this installation's secret seed (Gradio's
    save_file_to_cache, the copy Gradio itself makes of a returned file), so only someone handed
    its URL (the visitor whose run holds the image, or anyone for a published run) can fetch it,
    and a guessed image key finds nothing."""
    from gradio import processing_utils, utils

    if not path or not STORE_FILE.fullmatch(Path(path).name):
        return None
    try:
        return processing_utils.save_file_to_cache(path, cache_dir=utils.get_upload_folder())
    except OSError:  # deleted meanwhile: shown as missing
        return None


def served_url(path) -> str:
    """The address a page's <img> fetches the `served` copy of a store image from ('' when none)."""
    copy = served(path)
    return f"gradio_api/file={copy}" if copy else ""


def gallery_items(records, captions=None) -> list[tuple[str, str]]:
    """(path, caption) pairs for gr.Gallery (paths: `served` copies); flagged images say so in their caption."""
    items = []
    for i, r in enumerate(records):
        caption = captions[i] if captions else f"seed {r.seed}"
        if getattr(r, "refused", None):
            caption += " [refused by the API: excluded]"
        elif r.nsfw:
            caption += " [flagged by safety checker: excluded]"
        path = served(r.path)
        if path:
            items.append((path, caption))
    return items


def status_markdown(status: dict) -> str:
    models = "\n".join(f"| {role} | `{label}` |" for role, label in status["models"].items())
    loaded = ", ".join(m["model"] for m in status["loaded"]) or "none yet (models load on first use)"
    return (f"**Preset:** `{status['preset']}`: {status['reason']}\n\n"
            f"| role | model |\n|---|---|\n{models}\n\n"
            f"**Loaded:** {loaded}  \n**Device:** {status['device']}; {status['memory']}  \n"
            + (f"**Memory:** {status['resident']}  \n" if status.get("resident") else "")
            + f"**Store:** `{status['data_dir']}`: "
            + (f"{status['stored_images']} images, " if status.get("stored_images") is not None else "")
            + f"{status['runs']} runs; "
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

