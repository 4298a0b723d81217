"""A fair queue for a public GapLens: one visitor, or one script, cannot take it down (issue 27).

Gradio's queue is first come, first served, with one `max_size` for every event: 64 posts to
`queue/join` from one client filled it, nobody else could even list their runs, and the events
ran though nobody listened. In public mode `install` puts this in front of it:

- Admission (wrapped around `Queue.push`, before Gradio creates any per-session state): at most
  `per_visitor` queued or running events per visitor and `per_address` per client address, of
  them `gpu_per_visitor` / `gpu_per_address` generating (the GPU concurrency group). A page's own
  start-up (its load events, sent at once) does not count: a visitor may have at most one of each
  load event waiting or running instead, so a fresh page is never refused by itself. New sessions
  are rationed per address, and those without an open page (a heartbeat) for everyone
  (`new_sessions`, `new_sessions_total`: each costs Gradio ~0.2 s of its event loop and ~0.8 MB
  of state); a session counts as having an open page when it holds a heartbeat and its address
  loaded the page for it (a heartbeat alone proves nothing: anyone may open one for any session).
  Refusals are HTTP 429 with a sentence the page shows.
- Fairness: every concurrency group keeps its own queue of at most `waiting` events (reads
  such as Runs and status never wait behind generation), new events are queued round-robin
  by address, those of clients with an open page (a heartbeat) or stream ahead of those nobody
  listens for, and a full group makes room for a newcomer by dropping an event nobody listens
  for, else the newest event of the address holding the most.
- Gone clients: an event whose client never listens for it (no page open, i.e. no heartbeat,
  and no `queue/data` or `call/` stream within `listen_grace_s`) is dropped, queued or running;
  Gradio itself drops the events of a client whose stream closes.
- A time limit: a generation running past `gpu_time_limit_s` stops at its next step (what it
  computed stays in the store).
- HTTP (`FairQueueMiddleware`): API posts of at most `max_body_bytes`; page loads (the page, its
  config, the API info: ~0.5 s each) rationed per address (`page_loads`); uploads only from an
  address with a live session (heartbeat or queue stream), at most `uploads_per_address` at a
  time and `upload_bytes_per_hour` an hour; open streams (heartbeats, queue and call streams) at
  most `streams_per_address` per address, `streams_per_session` per session and `streams_total` in
  all (429 past them).

The client address is `engine.common.access.client_address`: behind `--forwarded-hops` proxies (1 on a
Space), the X-Forwarded-For entry that many from the right (Werkzeug's ProxyFix); elsewhere the socket
peer, which uvicorn rewrites only for the proxies the host names (app.py's --forwarded-allow-ips).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import math
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

import gradio as gr
from fastapi import HTTPException
from gradio.server_messages import ProcessCompletedMessage
from gradio.utils import error_payload
from starlette.middleware import Middleware
from starlette.responses import JSONResponse

from engine.common import access

from .common import GPU_QUEUE, visitor_of


@dataclass
class QueuePolicy:
    """The limits of a public GapLens' queue (module docstring)."""

    per_visitor: int = 8            # queued or running events (a page load sends 3 at once)
    gpu_per_visitor: int = 2        # ... of them generating
    per_address: int = 16
    gpu_per_address: int = 4
    waiting: int = 64               # queued events per concurrency group
    # A new session costs Gradio ~0.2 s of its event loop (a copy of the page's config) and ~0.8 MB:
    # rationed per address (a burst, then one every 30 s) and, without an open page, for everyone.
    new_sessions: tuple[int, float] = (16, 1 / 30)         # per address: (burst, per second)
    new_sessions_total: tuple[int, float] = (16, 1.0)
    page_loads: tuple[int, float] = (20, 1 / 3)            # GET of the page, its config or API info, per address
    sessions: int = 500             # Gradio session states kept (least recently used dropped)
    listen_grace_s: float = 5.0     # an event nobody listens for this long is dropped (pages keep a heartbeat)
    gpu_time_limit_s: float = 600.0
    max_body_bytes: int = 256 * 2**10   # an API post: a request's texts are at most 1000 characters each
    uploads_per_address: int = 2    # at a time
    upload_bytes_per_hour: int = 1 << 30   # per address (set from max_file_size by `install`)
    session_seen_s: float = 600.0   # a session stream closed this recently still counts as live for uploads
    # open streams (heartbeats, queue/data and call/ streams: each holds a socket, a task and buffers)
    streams_per_address: int = 32
    streams_per_session: int = 4    # a page holds one heartbeat and one queue stream
    streams_total: int = 1024


@dataclass
class _Event:
    visitor: str
    address: str
    gpu: bool
    load: bool = False   # one of the page's load events
    joined: float = field(default_factory=time.monotonic)


class FairQueue:
    """The state the queue hooks and the middleware share: who each event is, who listens."""

    def __init__(self, demo: gr.Blocks, policy: QueuePolicy):
        self.demo, self.policy = demo, policy
        self.events: dict[str, _Event] = {}
        self.session_buckets: dict[str, _Bucket] = {}              # address -> its new sessions
        self.all_sessions = _Bucket(*policy.new_sessions_total)
        self.page_buckets: dict[str, _Bucket] = {}                 # address -> its page loads
        self.known_sessions: dict[str, float] = {}                 # session hash -> first seen
        self.streams: Counter = Counter()                         # session hash -> open heartbeat and queue streams
        self.call_streams: Counter = Counter()                    # event id -> open call/ streams
        self.live: dict[str, list] = defaultdict(lambda: [0, -math.inf])  # address -> [open streams, last seen]
        self.open_streams = 0
        self.page_credits: dict[str, list] = {}                   # address -> [page loads not yet used, last load]
        self.uploads: Counter = Counter()                         # address -> uploads in progress
        self.uploaded: dict[str, deque] = defaultdict(deque)      # address -> (time, bytes)
        self.middleware_active = False
        self._sweeper: asyncio.Task | None = None

    @functools.cached_property
    def load_fns(self) -> int:
        """Returns how many load events a page sends when it opens."""
        return sum(_is_load(fn) for fn in self.demo.fns.values())

    @property
    def queue(self):
        return self.demo._queue

    # -- admission -----------------------------------------------------------------------------
    async def push(self, original, body, request, username):
        """Gradio's Queue.push after this queue's checks (module docstring)."""
        fn = self.demo.fns.get(body.fn_index) if body.fn_index is not None else None   # creates no session state
        if fn is None:
            return await original(body=body, request=request, username=username)
        if not _finite(body.data):   # Gradio's own components would fail on them with a blank error
            raise HTTPException(status_code=422, detail="a number in this request is NaN or infinite; GapLens takes "
                                                        "finite numbers only")
        visitor = visitor_of(gr.Request(request=request, username=username, session_hash=body.session_hash))
        if visitor.host:
            return await original(body=body, request=request, username=username)
        self._start_sweeper()
        gpu = fn.concurrency_id == GPU_QUEUE
        load = _is_load(fn) and visitor.id != access.ANONYMOUS.id
        self._admit(visitor, body.session_hash, gpu, load)
        group = self.queue.event_queue_per_concurrency_id.get(fn.concurrency_id)
        if group is not None and len(group.queue) >= self.policy.waiting:
            await self._make_room(group, visitor.address)
        success, event_id, state = await original(body=body, request=request, username=username)
        if success and state == "success":
            self.events[event_id] = _Event(visitor.id, visitor.address, gpu, load)
            self._round_robin(fn.concurrency_id, event_id)
        return success, event_id, state

    def _admit(self, visitor: access.Visitor, session: str, gpu: bool, load: bool = False) -> None:
        p = self.policy
        live = [e for i, e in self.events.items() if i in self.queue.event_ids_to_events]
        if load:   # a page's start-up: at most one of each load event per visitor, apart from its requests
            waiting = sum(e.load and e.visitor == visitor.id for e in live)
            if waiting >= self.load_fns:
                raise _refuse(f"you have {waiting} page-load requests waiting or running on this public GapLens; "
                              "wait for your page to finish loading")
        live = [e for e in live if not e.load]
        anonymous = visitor.id == access.ANONYMOUS.id   # no session (an API call): its address counts
        for key, attr, who, most, most_gpu in (("" if anonymous else visitor.id, "visitor", "you have",
                                                p.per_visitor, p.gpu_per_visitor),
                                               (visitor.address, "address", "your network (client address) has",
                                                p.per_address, p.gpu_per_address)):
            mine = [e for e in live if key and getattr(e, attr) == key]
            generating = sum(e.gpu for e in mine)
            if key and (len(mine) >= most or (gpu and generating >= most_gpu)):
                raise _refuse(f"{who} {len(mine)} requests waiting or running on this public GapLens ({generating} "
                              f"generating); at most {most} at a time ({most_gpu} generating) are accepted: wait for "
                              "one to finish")
        if session is not None and session not in self.known_sessions:
            burst, rate = p.new_sessions
            if not self.session_buckets.setdefault(visitor.address, _Bucket(burst, rate)).take():
                raise _refuse(f"too many new sessions from your network (client address): at most {burst} at once and "
                              f"one every {1 / rate:.0f} s; keep using an open page")
            if not (self.streams[session] and self._page_credit(visitor.address)) and not self.all_sessions.take():
                raise _refuse("many new visitors are arriving at this public GapLens right now; try again in a minute")
            if len(self.known_sessions) > 10 * p.sessions:   # Gradio keeps `sessions` states: forget the oldest
                for old in sorted(self.known_sessions, key=self.known_sessions.get)[:p.sessions]:
                    del self.known_sessions[old]
            self.known_sessions[session] = time.monotonic()

    def _page_credit(self, address: str) -> bool:
        """Whether `address` loaded a page whose session is not yet known (and use that load up): a
        new session with an open page (a heartbeat) is spared the rationing of everyone's new
        sessions only then, as anyone can open a heartbeat for a session of their choice."""
        credit = self.page_credits.get(address)
        if not credit or credit[0] < 1:
            return False
        credit[0] -= 1
        return True

    def page_loaded(self, address: str) -> None:
        """A page (or its config) was served to `address`: its next new session may have an open page."""
        credit = self.page_credits.setdefault(address, [0, 0.0])
        credit[0], credit[1] = min(credit[0] + 1, self.policy.page_loads[0]), time.monotonic()

    def stream_refusal(self, address: str, session: str | None) -> str | None:
        """Why another stream from `address` (for `session`, a heartbeat or queue stream) is refused now, or None."""
        p = self.policy
        if self.open_streams >= p.streams_total:
            return f"this public GapLens holds {self.open_streams} open streams, its most; try again in a minute"
        if self.live[address][0] >= p.streams_per_address:
            return (f"your network (client address) holds {self.live[address][0]} open streams; at most "
                    f"{p.streams_per_address} are accepted: close some GapLens pages")
        if session is not None and self.streams[session] >= p.streams_per_session:
            return (f"this session holds {self.streams[session]} open streams; at most {p.streams_per_session} are "
                    "accepted: reload the page")
        return None

    async def _make_room(self, group, address: str) -> None:
        """A full group drops its newest event nobody listens for (no open page or stream); else
        the newest event of the address waiting most, when it holds more than the newcomer's
        would; else the newcomer is refused."""
        known = [e for e in group.queue if e._id in self.events]
        unheard = [e for e in known if self.middleware_active and not self._listened(e)]
        if unheard:
            return await self.drop(unheard[-1], "dropped: nobody was listening for this request")
        waiting = Counter(self.events[e._id].address for e in known)
        heavy, most = waiting.most_common(1)[0] if waiting else ("", 0)
        if most <= waiting.get(address, 0) + 1:
            raise _refuse(f"the queue of this public GapLens is full ({len(group.queue)} requests waiting); "
                          "try again in a minute")
        victim = [e for e in known if self.events[e._id].address == heavy][-1]
        await self.drop(victim, "the queue of this public GapLens is full: this request made room for someone "
                                "else's; try again in a minute")

    def _round_robin(self, group_id: str, event_id: str) -> None:
        """Move the new event ahead of every event in a later round of its address (an address's
        k-th waiting event is in round k), so each address gets one turn per round; events nobody
        listens for (no open page or stream) come after every listened-for one."""
        group = self.queue.event_queue_per_concurrency_id.get(group_id)
        if group is None or not group.queue or group.queue[-1]._id != event_id:
            return
        new = group.queue.pop()
        seen: Counter = Counter()
        keys = []
        for e in group.queue:
            address = self.events[e._id].address if e._id in self.events else e._id
            keys.append((self.middleware_active and not self._listened(e), seen[address]))
            seen[address] += 1
        mine = (self.middleware_active and not self._listened(new), seen[self.events[event_id].address or event_id])
        at = next((i for i, k in enumerate(keys) if k > mine), len(group.queue))
        group.queue.insert(at, new)

    # -- dropping --------------------------------------------------------------------------------
    async def drop(self, event, message: str) -> None:
        """Tell the event's client why (if it listens) and remove the event, queued or running
        (a running generation stops at its next step)."""
        self.queue.send_message(event, ProcessCompletedMessage(output=error_payload(gr.Error(message), True),
                                                               success=False, title="Queue"))
        await self.queue.clean_events(event_id=event._id)
        # a running generator is only left, not closed, by Gradio's loop (it returns when no event is
        # alive): close it as Gradio's /cancel does, so the run ends "stopped" now rather than whenever
        # the session state lets go of it
        await self.queue.reset_iterators(event._id)
        self.events.pop(event._id, None)

    def _listened(self, event) -> bool:
        return self.streams[event.session_hash] > 0 or self.call_streams[event._id] > 0

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Every second: forget finished events and idle addresses; drop the events nobody listens for."""
        while not self.queue.stopped:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for buckets in (self.session_buckets, self.page_buckets):
                for address in [a for a, b in buckets.items() if b.full()]:
                    del buckets[address]
            for address in [a for a, (opened, seen) in self.live.items()
                            if not opened and now - seen > self.policy.session_seen_s]:
                del self.live[address]
            for address in [a for a, (_, at) in self.page_credits.items() if now - at > self.policy.session_seen_s]:
                del self.page_credits[address]
            for address in [a for a, sent in self.uploaded.items() if not sent or now - sent[-1][0] > 3600]:
                del self.uploaded[address]
            for event_id, info in list(self.events.items()):
                event = self.queue.event_ids_to_events.get(event_id)
                if event is None:
                    self.events.pop(event_id, None)
                elif (self.middleware_active and now - info.joined > self.policy.listen_grace_s
                      and not self._listened(event)):
                    await self.drop(event, "dropped: nobody was listening for this request")

    # -- uploads (middleware) ------------------------------------------------------------------
    def upload_refusal(self, address: str, length: int | None) -> str | None:
        """Why an upload of `length` bytes from `address` is refused now, or None."""
        p = self.policy
        opened, seen = self.live[address]
        if not opened and time.monotonic() - seen > p.session_seen_s:
            return "uploads need an open GapLens page (a live session) from the same address"
        if length is None:
            return "an upload must say its size (Content-Length)"
        if self.uploads[address] >= p.uploads_per_address:
            return f"at most {p.uploads_per_address} uploads at a time from one address"
        sent = self.uploaded[address]
        while sent and time.monotonic() - sent[0][0] > 3600:
            sent.popleft()
        if sum(b for _, b in sent) + length > p.upload_bytes_per_hour:
            return f"at most {p.upload_bytes_per_hour / 2**20:.0f} MiB of uploads an hour from one address"
        sent.append((time.monotonic(), length))
        return None


class _Bucket:
    """A token bucket: `burst` tokens, refilled at `rate` a second."""

    def __init__(self, burst: int, rate: float):
        self.burst, self.rate = burst, rate
        self.tokens, self.at = float(burst), time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens, self.at = min(self.burst, self.tokens + (now - self.at) * self.rate), now

    def take(self) -> bool:
        self._refill()
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.burst


def _finite(value) -> bool:
    """Whether every number in `value` (a request's JSON data, walked without recursion) is finite."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return True


def _refuse(message: str) -> HTTPException:
    return HTTPException(status_code=429, detail=message)


def _time_limited(fn, seconds: float):
    """`fn` (a generator handler) stopped with a gr.Error at its first step past `seconds`."""
    @functools.wraps(fn)
    def limited(*args, **kwargs):
        deadline = time.monotonic() + seconds
        stream = fn(*args, **kwargs)
        try:
            for item in stream:
                yield item
                if time.monotonic() > deadline:
                    raise gr.Error(f"this request ran past the {seconds / 60:.0f} minutes one request may take on this "
                                   "public GapLens and was stopped; what it computed is stored, so running it again "
                                   "continues from there")
        finally:
            stream.close()
    return limited


def install(demo: gr.Blocks, policy: QueuePolicy | None = None, max_file_size: int | None = None) -> FairQueue:
    """Public mode: put the fair queue in front of `demo`'s queue (call after `demo.queue()`),
    and time-limit its generation handlers. Returns the FairQueue; `launch_kwargs` gives what
    `demo.launch` needs for the HTTP side."""
    policy = policy or QueuePolicy()
    if max_file_size:
        policy.upload_bytes_per_hour = 4 * max_file_size
    fair = FairQueue(demo, policy)
    original = demo._queue.push
    demo._queue.push = functools.partial(fair.push, original)
    for block_fn in demo.fns.values():
        if block_fn.concurrency_id == GPU_QUEUE and inspect.isgeneratorfunction(block_fn.fn):
            block_fn.fn = _time_limited(block_fn.fn, policy.gpu_time_limit_s)
    return fair


def launch_kwargs(fair: FairQueue) -> dict:
    """What `demo.launch` takes for the fair queue: the HTTP middleware and the number of session states kept."""
    return {"app_kwargs": {"middleware": [Middleware(FairQueueMiddleware, fair=fair)]},
            "state_session_capacity": fair.policy.sessions}


# -- HTTP ---------------------------------------------------------------------------------------
API = "/gradio_api/"
PAGES = {"config", "info"}   # GETs that build the whole page's config (~0.5 s each): the page itself, config, API info


class FairQueueMiddleware:
    """Bounds API post bodies and uploads, and tracks who listens (FairQueue)."""

    def __init__(self, app, fair: FairQueue):
        self.app, self.fair = app, fair

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        fair = self.fair
        fair.middleware_active = True
        path = scope["path"]
        lines = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        headers = dict(lines)
        address = access.client_address((scope.get("client") or ("",))[0],
                                        [v for k, v in lines if k == "x-forwarded-for"],
                                        access.forwarded_hops())
        if scope["method"] == "GET" and (path.rstrip("/").rsplit("/", 1)[-1] in PAGES or path == "/"):
            burst, rate = fair.policy.page_loads
            if not fair.page_buckets.setdefault(address, _Bucket(burst, rate)).take():
                return await JSONResponse({"detail": f"too many page loads from your network (client address): at "
                                                     f"most {burst} at once and one every {1 / rate:.0f} s"},
                                          429)(scope, receive, send)
            fair.page_loaded(address)
        if API not in path:   # the page and its assets
            return await self.app(scope, receive, send)
        route = path.split(API, 1)[1]
        length = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
        if scope["method"] == "POST" and route.startswith("upload"):
            return await self._upload(scope, receive, send, address, length)
        if scope["method"] == "POST":
            return await self._bounded(scope, receive, send, length)
        if scope["method"] == "GET" and route.startswith(("queue/data", "heartbeat/", "call/")):
            return await self._listening(scope, receive, send, route, address)
        return await self.app(scope, receive, send)

    async def _bounded(self, scope, receive, send, length):
        limit = self.fair.policy.max_body_bytes
        refusal = JSONResponse({"detail": f"a request to a public GapLens is at most {limit // 1024} KiB"}, 413)
        if length is not None and length > limit:
            return await refusal(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                return await refusal(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await self.app(scope, replay, send)

    async def _upload(self, scope, receive, send, address, length):
        refusal = self.fair.upload_refusal(address, length)
        if refusal:
            return await JSONResponse({"detail": f"upload refused: {refusal}"}, 429)(scope, receive, send)
        self.fair.uploads[address] += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.fair.uploads[address] -= 1

    async def _listening(self, scope, receive, send, route, address):
        fair = self.fair
        query = dict(part.split("=", 1) for part in scope.get("query_string", b"").decode().split("&") if "=" in part)
        if route.startswith("queue/data"):
            counter, key = fair.streams, query.get("session_hash", "")
        elif route.startswith("heartbeat/"):   # an open page (or client) keeps one for its session
            counter, key = fair.streams, route.rstrip("/").rsplit("/", 1)[-1]
        else:
            counter, key = fair.call_streams, route.rstrip("/").rsplit("/", 1)[-1]
        refusal = fair.stream_refusal(address, key if counter is fair.streams else None)
        if refusal:
            return await JSONResponse({"detail": refusal}, 429)(scope, receive, send)
        counter[key] += 1
        fair.live[address][0] += 1
        fair.open_streams += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            fair.open_streams -= 1
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
            fair.live[address][0] -= 1
            fair.live[address][1] = time.monotonic()


def _is_load(fn) -> bool:
    """Whether Gradio function `fn` runs when a page loads (demo.load)."""
    return any(event == "load" for _, event in fn.targets)
