"""A public GapLens under a steady stream of ordinary requests: does its memory level off? The app
runs as `python app.py --public --preset synthetic` in a subprocess; REQUESTS calls (Single Prompt
of 4 images with a new prompt, the Runs list, the status panel, in turn) go through Gradio's queue
as a script sends them (join, then listen), from 30 client addresses (127.0.2.x), one session each.
The warm-up makes every session, and each session's outputs, before anything is measured (the app
rations new page-less sessions to one a second, so a refused first request is tried again): a new
session's state (~1 MB, a copy of the page's config) is the app's own bound (QueuePolicy.sessions),
not growth. Prints name=value lines: the server's resident memory after the warm-up, after the first two thirds
and at the end, and, last, the memory each request added over the last third (target: flat, within
noise).

    python bench/public_soak.py [REQUESTS=300]
"""
from __future__ import annotations

import sys
import tempfile
import time
import uuid

import _common  # noqa: F401 - offline env, repository and tests/ on sys.path
from publicserver import call, memory_kib, public_server

ADDRESSES = [f"127.0.2.{i}" for i in range(2, 32)]


def one(url: str, i: int, sessions: dict) -> dict:
    """Request `i` of the soak: its completion message, or {"refused": status, ...}."""
    address = ADDRESSES[i % len(ADDRESSES)]
    session = sessions.setdefault(address, uuid.uuid4().hex)
    kind = i % 3
    if kind == 0:
        return call(url, "single_prompt", address, session, prompt=f"a photo of a worker number {i}", n=4)
    if kind == 1:
        return call(url, "runs_list", address, session, search="")
    return call(url, "status", address, session)


def warm_up(url: str, sessions: dict) -> None:
    """Every address's session, with each kind of request's outputs, completed once."""
    for i in range(3 * len(ADDRESSES)):
        for _ in range(60):
            done = one(url, i, sessions)
            if "refused" not in done:
                break
            time.sleep(0.5)   # the new-session ration refills one a second
        if not done.get("success"):
            raise SystemExit(f"warm-up request {i} did not complete: {done}")


def main(requests: int = 300) -> None:
    with tempfile.TemporaryDirectory() as tmp, public_server(tmp) as (url, proc):
        sessions: dict = {}
        warm_up(url, sessions)
        start, rss, ok = time.perf_counter(), [], 0
        for i in range(requests):
            ok += bool(one(url, 3 * len(ADDRESSES) + i, sessions).get("success"))
            rss.append(memory_kib(proc.pid, "VmRSS") / 1024)
        seconds = time.perf_counter() - start
        peak = memory_kib(proc.pid) / 1024
    third = requests // 3
    _common.report(requests=requests, completed=ok, seconds=seconds, server_rss_mib_start=rss[0],
                   server_rss_mib_two_thirds=rss[-third - 1], server_rss_mib_end=rss[-1], server_peak_mib=peak,
                   mib_per_request_first_third=(rss[third] - rss[0]) / third,
                   mib_per_request_last_third=(rss[-1] - rss[-third - 1]) / third)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
