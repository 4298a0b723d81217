"""Public mode, third walk (issue 36), over HTTP as a script sends it: `python app.py --public
--preset synthetic` on a CPU Space (SPACE_ID set, no GPU) in a subprocess, one per module; each
attack is refused in one sentence, within a time bound, and the server's memory (VmHWM/VmRSS from
/proc) barely moves."""
import asyncio
import io
import json
import random
import re
import sqlite3
import threading
import time
import uuid
import zipfile

import httpx
import pytest

from publicserver import call, client, endpoint, join, memory_kib, public_server, queue_size, run_statuses
from waiting import wait_until

pytestmark = pytest.mark.slow

MIB_KIB = 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("bounds")
    with public_server(data_dir, "--hourly-images", "16", "--visitors-per-address", "1",
                       env={"SPACE_ID": "test/gaplens"}) as (url, proc):
        yield url, proc, data_dir


def _error(done: dict) -> str:
    return str(done.get("detail") or (done.get("output") or {}).get("error") or "")


def _run_id(done: dict) -> str:
    return re.search(r"run `([^`]+)`", json.dumps(done)).group(1)


def _charges(data_dir, what: str) -> list[tuple]:
    with sqlite3.connect(data_dir / "store" / "gaplens.sqlite") as db:
        return db.execute("SELECT address, images, export_bytes FROM charges WHERE what LIKE ?", (what,)).fetchall()


def test_a_study_pack_is_bounded_before_any_work_and_charged_like_an_export(server):
    url, proc, data_dir = server
    session = uuid.uuid4().hex
    ids = [_run_id(call(url, "single_prompt", "127.0.0.2", session, prompt=p, n=2))
           for p in ("a photo of a doctor", "a photo of a nurse")]
    peak = memory_kib(proc.pid)
    start = time.perf_counter()
    done = call(url, "study_build", "127.0.0.2", session, selected=ids, raters=200_000)
    assert not done["success"] and "200" in _error(done) and time.perf_counter() - start < 10
    assert memory_kib(proc.pid) - peak < 16 * MIB_KIB
    done = call(url, "study_build", "127.0.0.2", session, selected=ids, raters=4)
    assert done["success"], _error(done)
    (charge,) = _charges(data_dir, "study pack")
    assert charge[0] == "127.0.0.2" and charge[2] > 1000   # the pack's bytes, charged to its address


def test_a_cpu_space_offers_only_what_runs_here_and_refuses_the_rest_before_loading(server):
    url, proc, _ = server
    config = httpx.get(url + "config", timeout=60).json()
    offered = {str(c) for comp in config["components"] if comp["type"] in ("dropdown", "checkboxgroup")
               and comp.get("props", {}).get("elem_id") not in ("preset-picker",)
               for c in comp.get("props", {}).get("choices") or []}
    assert "synthetic" in str(offered)
    assert not [c for c in offered if re.search(r"sd-turbo|sd15|sdxl|blip|vlm:", c)]
    rss = memory_kib(proc.pid, "VmRSS")
    start = time.perf_counter()
    for api, values in (("compare_models", dict(presets=["synthetic", "sd-turbo"], prompt="a photo of a cat", n=2)),
                        ("sp_spot_compare", dict(other_spec="vlm:Qwen/Qwen2.5-VL-3B-Instruct"))):
        done = call(url, api, "127.0.0.3", **values)
        assert not done["success"] and "not in the list of choices" in _error(done)
    assert time.perf_counter() - start < 10 and memory_kib(proc.pid, "VmRSS") - rss < 16 * MIB_KIB
    status = json.dumps(call(url, "status", "127.0.0.3"))
    assert "no GPU on this Space: the synthetic world only" in status
    assert " images, " not in status.split("Store:")[1]   # no store-wide image count for visitors (item 7)


def test_a_cpu_spaces_engine_refuses_a_device_model_with_the_panels_sentence(tmp_path):
    from engine.common import access
    from engine.common.errors import NotAllowedError
    from engine.core.engine import Engine
    from engine.hosting import backend_choices
    from engine.hosting.space import NO_GPU

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True)
    assert "sd-turbo" in backend_choices.offered(engine, "generator")
    engine.hardware_note = NO_GPU
    with access.acting_as(access.Visitor("session:a")):
        assert set(backend_choices.offered(engine, "generator")) == {"synthetic", "colour"}
        with pytest.raises(NotAllowedError, match="^no GPU on this Space: the synthetic world only: this public"):
            backend_choices.resolve(engine, "generator", "sd-turbo")
    assert engine.models.loaded() == []


def test_a_clients_own_forwarded_lines_never_give_it_a_fresh_address(server):
    """On a Space (one proxy hop): the proxy's entry, the last of one line, counts; a client that adds
    lines of its own, before or after the line the proxy appended to, is counted by its peer (here
    127.0.0.9), never by an address it wrote (issue 43)."""
    url, _, data_dir = server
    real = [("X-Forwarded-For", "5.6.7.8")]
    assert call(url, "single_prompt", headers=real, prompt="a photo of a judge", n=16)["success"]   # its hour spent
    assert "generate 0 images" in json.dumps(call(url, "status", headers=[("X-Forwarded-For", "1.1.1.1, 5.6.7.8")]))
    orders = ([("X-Forwarded-For", "9.9.9.9"), *real],                                   # a line before the proxy's
              [("X-Forwarded-For", "10.9.9.9, 5.6.7.8"), ("X-Forwarded-For", "10.10.10.10")])   # a line after it
    assert call(url, "single_prompt", "127.0.0.9", headers=orders[0], prompt="a photo of a chef", n=16)["success"]
    done = call(url, "single_prompt", "127.0.0.9", headers=orders[1], prompt="a photo of a cook", n=16)
    assert not done["success"] and "from one client address may generate 16 images per hour together; 0 are " \
                                    "left" in _error(done)
    assert {a for a, images, _ in _charges(data_dir, "%") if images} <= {"127.0.0.2", "5.6.7.8", "127.0.0.9"}


def _heartbeat(url: str, source: str, session: str, stop: threading.Event) -> None:
    def hold():
        try:
            with client(source, timeout=None) as http, http.stream("GET", f"{url}gradio_api/heartbeat/{session}") as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return
        except httpx.HTTPError:   # the server stopped
            return
    threading.Thread(target=hold, daemon=True).start()


def _export(results: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("gaplens/manifest.json", json.dumps({"format": "gaplens-export", "format_version": 1}))
        zf.writestr("gaplens/runs.jsonl", json.dumps({
            "id": "20250101-000000-abcdef", "method": "single_prompt", "status": "done", "request": "{}",
            "results": results, "summary": "{}", "models": "{}", "version": "1", "error": None, "created": 0,
            "updated": 0}) + "\n")
    return buf.getvalue()


def test_an_imports_json_is_bounded_before_it_is_parsed(server):
    url, proc, _ = server
    source, session, stop = "127.0.0.6", uuid.uuid4().hex, threading.Event()
    _heartbeat(url, source, session, stop)   # uploads need an open page
    rnd = random.Random(0)
    big = json.dumps({"x": [rnd.randrange(10) for _ in range(6_000_000)]})   # 17 MiB of results, 8 MiB allowed
    try:
        for results, refusal in ((big, "gaplens/runs.jsonl line 1 is longer than 10 MiB"),
                                 ("[" * 100_000 + "]" * 100_000, "nests more than 64 levels deep")):
            with client(source) as http:
                def upload():
                    return http.post(url + "gradio_api/upload", files={"files": ("x.zip", _export(results))})
                wait_until(lambda: upload().status_code == 200, 30, "the heartbeat to open")
                path = upload().json()[0]
            peak = memory_kib(proc.pid)
            start = time.perf_counter()
            done = call(url, "runs_import", source, session, path={"path": path, "meta": {"_type": "gradio.FileData"}})
            assert not done["success"] and refusal in _error(done)
            assert time.perf_counter() - start < 10 and memory_kib(proc.pid) - peak < 48 * MIB_KIB
    finally:
        stop.set()


def test_open_streams_are_bounded_per_address_and_session(server):
    url, proc, _ = server

    async def attack():
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.7",
                                             limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0))
        async with httpx.AsyncClient(transport=transport, timeout=60) as http:
            async def open_one(session):
                return await http.send(http.build_request("GET", f"{url}gradio_api/heartbeat/{session}"), stream=True)
            shared = uuid.uuid4().hex
            responses = await asyncio.gather(*(open_one(uuid.uuid4().hex) for _ in range(36)),
                                             *(open_one(shared) for _ in range(2)))
            statuses = [r.status_code for r in responses]
            refusal = next(r for r in responses if r.status_code == 429)
            detail = json.loads(await refusal.aread())["detail"]
            start = time.perf_counter()
            other = httpx.get(url + "gradio_api/info", timeout=60)   # another visitor is served meanwhile
            other_s = time.perf_counter() - start
            for r in responses:
                await r.aclose()
            return statuses, detail, other.status_code, other_s

    rss = memory_kib(proc.pid, "VmRSS")
    statuses, detail, other, other_s = asyncio.run(attack())
    assert statuses.count(200) == 32 and statuses.count(429) == 6
    assert "at most 32 are accepted" in detail and other == 200 and other_s < 5
    assert memory_kib(proc.pid, "VmRSS") - rss < 32 * MIB_KIB
    with client("127.0.0.7") as http:   # closed streams are given back
        wait_until(lambda: _opens(http, url), 30, "the closed streams to be released")


def _opens(http, url) -> bool:
    with http.stream("GET", f"{url}gradio_api/heartbeat/{uuid.uuid4().hex}") as r:
        return r.status_code == 200


def test_smaller_items_heartbeat_first_sessions_numbers_and_the_database(server, tmp_path):
    import app

    url, _, _ = server
    # a heartbeat of one's own choosing does not spare a session the app's ration of new page-less sessions
    fn_index, data = endpoint(url, "runs_list", search="x")

    async def joins(heartbeat_first: bool) -> int:
        async def one(i):
            session = uuid.uuid4().hex
            transport = httpx.AsyncHTTPTransport(local_address=f"127.0.{10 + heartbeat_first}.{2 + i}")
            async with httpx.AsyncClient(transport=transport, timeout=60) as http:
                beat = (await http.send(http.build_request("GET", f"{url}gradio_api/heartbeat/{session}"), stream=True)
                        if heartbeat_first else None)
                r = await http.post(url + "gradio_api/queue/join", json={
                    "data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                    "trigger_id": None})
                if beat is not None:
                    await beat.aclose()
                return r.status_code
        return list(await asyncio.gather(*(one(i) for i in range(24)))).count(429)   # more than the burst of 16
    assert asyncio.run(joins(False)) > 0 and asyncio.run(joins(True)) > 0
    # NaN, ±Infinity: one sentence (Gradio's own components failed with a blank error); 1e308 too
    for field, value in (("n", float("nan")), ("seed", float("inf")), ("width", float("-inf"))):
        done = call(url, "single_prompt", "127.0.0.12", prompt="a photo of a cat", **{field: value})
        assert done.get("refused") == 422 and "NaN or infinite" in done["detail"]
    done = call(url, "single_prompt", "127.0.0.12", prompt="a photo of a cat", n=1e308)
    assert not done.get("success") and _error(done)
    done = call(url, "counterfactuals", "127.0.0.12", prompt="a photo of a [gender] cat", min_frequency=float("nan"))
    assert done.get("refused") == 422
    # an empty database file is refused in one sentence, unless the host says so
    (tmp_path / "gaplens.sqlite").write_bytes(b"")
    with pytest.raises(SystemExit, match="empty file.*--allow-empty-database"):
        app.main(["--data-dir", str(tmp_path), "--public"])


def test_min_frequency_and_non_finite_numbers_are_refused_by_the_engine(tmp_path):
    from engine.common.errors import InputError
    from engine.core.engine import Engine
    from engine.hosting import limits
    from engine.methods import METHODS
    from engine.methods.counterfactuals import CounterfactualsRequest

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
    for value in (float("nan"), float("inf"), -0.5, 1.5):
        request = CounterfactualsRequest(prompt="a photo of a [gender] cat", n=2, min_frequency=value)
        with pytest.raises(InputError, match=f"min frequency .* must be between 0 and 1; got {value}"):
            METHODS["counterfactuals"].run.preflight(request, engine)
    with pytest.raises(InputError, match="alpha must be a finite number; got nan"):   # any number of any request
        limits.check({"prompt": "a cat", "alpha": float("nan")}, "synthetic")


def test_fire_and_forget_generations_stop_within_seconds_of_their_join(tmp_path):
    """Four scripts each join a 64-image generation and never listen. The generator runs at a GPU's
    pace and batch (4 images a call, 0.25 s an image: 16 s for 64), so only a drop can keep an
    event from making all 64; a listener's generation of the same size is untouched."""
    per_image, grace = 0.25, 5.0
    with public_server(tmp_path, "--generator-option", f"seconds_per_image={per_image}",
                       "--generator-option", "batch_size=4") as (url, proc):
        prompts = [f"a photo of a courier number {i}" for i in range(4)]
        for i, prompt in enumerate(prompts):
            with client(f"127.0.4.{2 + i}") as http:
                assert join(http, url, *endpoint(url, "single_prompt", prompt=prompt, n=64)).status_code == 200
        # state, not time: the queue is empty and no run is left running
        wait_until(lambda: queue_size(url) == 0 and "running" not in run_statuses(tmp_path), 180,
                   "the unheard generations to be dropped")
        made = {prompt: _images_of(tmp_path, prompt) for prompt in prompts}
        assert all(count < 64 for count in made.values()), made
        # a drop comes `grace` s after the join, at the next batch: at most ~(grace + 1 s) of images,
        # with a generous margin for a loaded machine, but well under the 64 a full run makes
        assert sum(made.values()) <= (grace + 6) / per_image, made
        assert set(run_statuses(tmp_path)) <= {"stopped"}, run_statuses(tmp_path)
        done = call(url, "single_prompt", "127.0.4.9", prompt="a photo of a courier who listens", n=16)
        assert done.get("success"), _error(done)
        assert _images_of(tmp_path, "a photo of a courier who listens") == 16


def _images_of(data_dir, prompt: str) -> int:
    with sqlite3.connect(data_dir / "store" / "gaplens.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM images WHERE prompt=?", (prompt,)).fetchone()[0]
