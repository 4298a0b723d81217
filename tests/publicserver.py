"""`python app.py --public` in a subprocess, and clients speaking Gradio's queue protocol from any
loopback address (127.0.0.2 and up: the socket's source address is bound, so the server sees a
different client address, as it would for another machine). For tests and bench/ scripts."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx

from apphelpers import free_port
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def public_server(data_dir, *flags: str, env: dict | None = None):
    """`python app.py --public --preset synthetic` on a free port with its own store; yields
    (url, process). The server's output goes to data_dir/server.log."""
    port = free_port()
    log = open(Path(data_dir) / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--public", "--preset", "synthetic", "--port",
                             str(port), "--data-dir", str(Path(data_dir) / "store"), *flags],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
                                 **(env or {})})
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(lambda: _up(url) or proc.poll() is not None, 180, "the public server to start")
        if proc.poll() is not None:
            raise AssertionError("the server stopped: " + (Path(data_dir) / "server.log").read_text()[-2000:])
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "gradio_api/info", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def memory_kib(pid: int, field: str = "VmHWM") -> int:
    """A process's peak (VmHWM) or current (VmRSS) resident memory in KiB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def queue_size(url: str) -> int:
    """How many events wait in the server's queue (Gradio's queue/status)."""
    with client() as http:
        return http.get(url + "gradio_api/queue/status").json()["queue_size"]


def run_statuses(data_dir) -> list[str]:
    """The status of every run in the store of `public_server(data_dir)`."""
    with sqlite3.connect(Path(data_dir) / "store" / "gaplens.sqlite") as db:
        return [row[0] for row in db.execute("SELECT status FROM runs")]


def client(source: str = "127.0.0.1", timeout: float = 60) -> httpx.Client:
    """An HTTP client whose connections come from `source` (a loopback address)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=timeout)


@functools.lru_cache(maxsize=8)
def _config_and_info(url: str) -> tuple[dict, dict]:
    return httpx.get(url + "config", timeout=60).json(), httpx.get(url + "gradio_api/info", timeout=60).json()


def endpoint(url: str, api_name: str, **values) -> tuple[int, list]:
    """(fn_index, data) of a queue/join post to the endpoint `api_name`: every input at its
    default, those named in `values` (the API's parameter names) replaced."""
    config, info = _config_and_info(url)
    info = info["named_endpoints"][f"/{api_name}"]
    dep = next(d for d in config["dependencies"] if d.get("api_name") == api_name)
    components = {c["id"]: c for c in config["components"]}
    data = [components[i].get("props", {}).get("value") for i in dep["inputs"]]
    shown = [pos for pos, i in enumerate(dep["inputs"]) if components[i]["type"] != "state"]
    for pos, param in zip(shown, info["parameters"]):
        if param["parameter_name"] in values:
            data[pos] = values.pop(param["parameter_name"])
    assert not values, f"/{api_name} has no parameter(s) {sorted(values)}"
    return dep["id"], data


def join(http: httpx.Client, url: str, fn_index: int, data: list, session: str | None = None,
         headers: list | None = None) -> httpx.Response:
    """One raw post to queue/join (nobody listens unless `listen` is called for its session);
    `headers`: (name, value) pairs sent as they are, a name possibly more than once."""
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session or uuid.uuid4().hex,
                       "event_data": None, "trigger_id": None})   # NaN and Infinity as a script may send them
    return http.post(url + "gradio_api/queue/join", content=body,
                     headers=[("content-type", "application/json"), *(headers or [])])


def listen(http: httpx.Client, url: str, session: str, event_id: str) -> dict:
    """Read the session's queue stream until `event_id` completes; returns that message
    ({"success": bool, "output": {...}})."""
    with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}) as response:
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:])
            if message.get("msg") == "process_completed" and message.get("event_id") == event_id:
                return message
    raise AssertionError(f"the stream closed before event {event_id} completed")


def call(url: str, api_name: str, source: str = "127.0.0.1", session: str | None = None, headers: list | None = None,
         **values) -> dict:
    """Call `api_name` the way a page does (join, then listen) from `source` (with `headers`, see
    `join`): the completion message, or {"refused": status, "detail": ...} when the join was refused."""
    fn_index, data = endpoint(url, api_name, **values)
    session = session or uuid.uuid4().hex
    with client(source) as http:
        response = join(http, url, fn_index, data, session, headers)
        if response.status_code != 200:
            return {"refused": response.status_code, "detail": response.json().get("detail", "")}
        return listen(http, url, session, response.json()["event_id"])


def flood(url: str, addresses, stop: threading.Event, refused: list, accepted: list) -> list[threading.Thread]:
    """From each of `addresses`, until `stop` is set, what a script would post: Single Prompt
    (64 images, grown until ±0.01) and Runs under the address's session, and Runs under a fresh
    session each round, twice a second; nobody listens. Join statuses go to `refused` and
    `accepted`. Returns the started threads."""
    heavy = endpoint(url, "single_prompt", prompt="a photo of a doctor", n=64, until=0.01)
    cheap = endpoint(url, "runs_list", search="doctor")

    def one(address):
        session = uuid.uuid4().hex
        with client(address) as http:
            while not stop.is_set():
                for (fn_index, data), fresh in ((heavy, False), (cheap, False), (cheap, True)):
                    try:
                        status = join(http, url, fn_index, data, None if fresh else session).status_code
                    except httpx.HTTPError:   # a connection the busy server closed: the next post opens another
                        continue
                    (accepted if status == 200 else refused).append(status)
                stop.wait(0.5)
    threads = [threading.Thread(target=one, args=(a,), daemon=True) for a in addresses]
    for t in threads:
        t.start()
    return threads
