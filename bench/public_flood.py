"""A public GapLens under a flood: one visitor's Runs list with and without 32 other client
addresses posting Single Prompt and Runs events as fast as a script would (nobody listening,
fresh sessions too), and the server's memory. The app runs as `python app.py --public
--preset synthetic` in a subprocess; the flood's sockets are bound to 127.0.0.2 and up, so the
server sees other addresses. Prints name=value lines, the flood's slowdown of the visitor last.

    python bench/public_flood.py [CALLS=10] [ADDRESSES=32]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time

import _common  # noqa: F401 - offline env, repository and tests/ on sys.path
import httpx
from publicserver import flood, memory_kib, public_server
from waiting import wait_until


def runs_list_seconds(visitor, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        visitor.predict(search="", method="all", status="all", sort="newest", selected=[], page=1,
                        api_name="/runs_list")
        times.append(time.perf_counter() - start)
    return times


def main(calls: int = 10, addresses: int = 32) -> None:
    from gradio_client import Client

    with tempfile.TemporaryDirectory() as tmp, public_server(tmp) as (url, proc):
        visitor = Client(url, verbose=False)
        visitor.predict(prompt="a photo of a nurse", n=8, api_name="/single_prompt")   # warm: models, a run
        idle_kib = memory_kib(proc.pid, "VmRSS")
        quiet = runs_list_seconds(visitor, calls)
        quiet_peak_kib = memory_kib(proc.pid)
        stop, refused, accepted = threading.Event(), [], []
        threads = flood(url, [f"127.0.0.{i}" for i in range(2, 2 + addresses)], stop, refused, accepted)
        wait_until(lambda: len(refused) > 5 * addresses, 120, "the flood to hit its limits")
        posted = len(refused) + len(accepted)
        flooded = runs_list_seconds(visitor, calls)
        posted = len(refused) + len(accepted) - posted
        stop.set()
        for t in threads:
            t.join(10)
        flood_peak_kib = memory_kib(proc.pid)
        start = time.perf_counter()
        wait_until(lambda: httpx.get(url + "gradio_api/queue/status", timeout=60).json()["queue_size"] == 0, 120,
                   "the flood's events to be dropped")
        drained = time.perf_counter() - start
    _common.report(addresses=addresses, flood_posts=len(refused) + len(accepted), flood_refused=len(refused),
                   flood_accepted=len(accepted), flood_posts_while_measured=posted, server_rss_idle_mib=idle_kib / 1024,
                   server_peak_mib_no_flood=quiet_peak_kib / 1024, server_peak_mib_flood=flood_peak_kib / 1024,
                   queue_drained_s=drained, runs_list_s_no_flood=statistics.median(quiet),
                   runs_list_s_flood_max=max(flooded), runs_list_s_flood=statistics.median(flooded),
                   flood_slowdown=statistics.median(flooded) / statistics.median(quiet))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
