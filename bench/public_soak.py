"""A public GapLens under a steady stream of ordinary requests: does its memory level off? The app
runs as `python app.py --public --preset synthetic` in a subprocess; REQUESTS calls (Single Prompt
of 4 images with a new prompt, the Runs list, the status panel, in turn) go through Gradio's queue
as a script sends them (join, then listen), from 30 client addresses (127.0.2.x), one session each.
Prints name=value lines: the server's resident memory after the warm-up, after the first two thirds
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


def one(url: str, i: int, sessions: dict) -> bool:
    """Request `i` of the soak; True when it completed."""
    address = ADDRESSES[i % len(ADDRESSES)]
    session = sessions.setdefault(address, uuid.uuid4().hex)
    kind = i % 3
    if kind == 0:
        done = call(url, "single_prompt", address, session, prompt=f"a photo of a worker number {i}", n=4)
    elif kind == 1:
        done = call(url, "runs_list", address, session, search="")
    else:
        done = call(url, "status", address, session)
    return bool(done.get("success"))


def main(requests: int = 300) -> None:
    with tempfile.TemporaryDirectory() as tmp, public_server(tmp) as (url, proc):
        sessions: dict = {}
        for i in range(30):   # warm-up: every address's session, the models, the caches
            one(url, i, sessions)
        start, rss, ok = time.perf_counter(), [], 0
        for i in range(requests):
            ok += one(url, 30 + i, sessions)
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
