"""Public mode (issue 26): visitors choose prompts, not servers, paths or anyone else's data.
Through gradio_client and plain HTTP against the app as `python app.py --public` builds it."""
import hashlib
import io
import json
import re
import socketserver
import threading
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from apphelpers import http_get as _get, running_app
from engine.common import access
from engine.core.engine import Engine
from engine.common.events import Done
from engine.hosting.limits import Budget
from engine.methods import generate
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.slow

HOST_TOKEN = "test-host-token-0123456789"
# what a parameter that names a backend, server, path or backend option is labelled with
NAMES_A_BACKEND = re.compile(r"backend|model|generator|evaluator|preset|option|path|url|server|endpoint|folder|dataset",
                             re.IGNORECASE)
FREE_TEXT = {"str", "Literal[]", "list[Literal[]]", "list[str]"}
OFFERS = "this public GapLens offers these"
HOST_ONLY = "for the host of this public GapLens only"
NOT_A_CHOICE = "is not in the list of choices"
PNG = b"\x89PNG\r\n\x1a\n"


class _Recorder(socketserver.BaseRequestHandler):
    def handle(self):
        self.server.hits.append(self.request.recv(200))
        self.request.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


@pytest.fixture
def listener():
    """A local server that records every connection made to it (it answers 404)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Recorder)
    server.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _public_engine(tmp_path, **options) -> Engine:
    options.setdefault("budget", Budget(images=64, hourly_images=10**6))
    return Engine("synthetic", data_dir=str(tmp_path / "store"), public=True, max_images=256, **options)


def _clients(url):
    from gradio_client import Client

    host = Client(url, headers={"x-gaplens-host-token": HOST_TOKEN}, verbose=False, download_files=False)
    return host, Client(url, verbose=False, download_files=False), Client(url, verbose=False, download_files=False)


def _file(url: str, path) -> tuple[int, bytes]:
    """GET /gradio_api/file=<path> with no session; the path echoed in a refusal is masked."""
    status, body = _get(f"{url}gradio_api/file={urllib.parse.quote(str(path))}")
    return status, body.replace(str(path).encode(), b"<path>")


def _refusal(call) -> str:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        call()
    return str(info.value)


def _measure(client, prompt: str, n: int = 4) -> tuple[str, list[str]]:
    """(run id, the gallery's image URLs) of a Single Prompt run."""
    out = _call(client, "/single_prompt", prompt=prompt, n=n)
    return re.search(r"run `([^`]+)`", out[1]).group(1), [item["image"]["url"] for item in out[0]]


def _default(param: dict):
    if param["parameter_has_default"]:
        return param["parameter_default"]
    return "" if param["python_type"]["type"] == "str" else None   # an empty box


def _arguments(client, name: str, **given) -> dict:
    """The arguments of endpoint `name`: `given`, and every other parameter left as on the page."""
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"][name]["parameters"]
    return {p["parameter_name"]: given.get(p["parameter_name"], _default(p)) for p in params}


def _call(client, name: str, **given):
    return client.predict(**_arguments(client, name, **given), api_name=name)


def _names_a_backend(param: dict) -> bool:
    return bool(NAMES_A_BACKEND.search(param.get("label") or ""))


def _attacks(endpoint: dict, hostile: str, picks: dict):
    """The calls the walk makes to one endpoint, as (arguments, the parameter given `hostile`): one
    per free-text parameter and per parameter naming a backend, `hostile` there alone. Every other
    parameter holds what the page would send (`picks`: a prompt, the visitor's own run; else its
    default or, naming a backend, a choice offered), so `hostile` reaches the handler unless its
    own parameter is refused. Parameters taking a file get none (Gradio takes uploads only)."""
    def offered(p):
        if p["parameter_name"] in picks:
            return picks[p["parameter_name"]]
        if "filepath" in p["python_type"]["type"]:
            return None
        return p["example_input"] if _names_a_backend(p) else _default(p)

    base = {p["parameter_name"]: offered(p) for p in endpoint["parameters"]}
    for p in endpoint["parameters"]:
        if p["python_type"]["type"] in FREE_TEXT or _names_a_backend(p):
            value = [hostile] if p["python_type"]["type"].startswith("list") else hostile
            yield {**base, p["parameter_name"]: value}, p["parameter_name"]


def test_no_endpoint_lets_a_visitor_name_a_server_path_or_backend(tmp_path, listener, monkeypatch):
    """Walk every endpoint of the API (view_api) with a server URL, a backend spec or an option in
    each free-text parameter and in each parameter naming a backend: the local listener receives no
    request, each parameter naming a backend is refused in the engine's (or Gradio's) own sentence,
    and no answer names the data directory. The host, as a control, does reach the listener."""
    from gradio_client.exceptions import AppError

    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    engine = _public_engine(tmp_path, budget=Budget(images=24, hourly_images=10**6))   # the walk runs small sets
    port = listener.server_address[1]
    hostile_texts = [f"openai:http://127.0.0.1:{port}/v1", f"hf-inference:http://127.0.0.1:{port}/model",
                     "folder:/etc"]
    with running_app(engine) as url:
        host, a, _ = _clients(url)
        run_id, _ = _measure(a, "a photo of a nurse")   # a run of A's own for the spot-check panels
        info = a.view_api(print_info=False, return_format="dict", all_endpoints=True)
        endpoints = info["named_endpoints"]
        assert not info["unnamed_endpoints"]
        naming = {(name, p["parameter_name"]) for name, ep in endpoints.items() for p in ep["parameters"]
                  if _names_a_backend(p)}
        picks = {"selected": [run_id], "run_value": [run_id], "prompt": "a photo of a cat",
                 "prompt_text": "a photo of a cat", "n": 2}
        answers = []   # (endpoint, the parameter given the hostile text, outcome, answer)
        for hostile in hostile_texts:
            for name, endpoint in endpoints.items():
                for kwargs, attacked in _attacks(endpoint, hostile, picks):
                    try:
                        answers.append((name, attacked, "ok", str(a.predict(**kwargs, api_name=name))))
                    except AppError as exc:
                        answers.append((name, attacked, "refused", str(exc)))
        assert listener.hits == [], listener.hits
        for name, _, _, text in answers:
            assert str(engine.store.data_dir) not in text and str(tmp_path) not in text, (name, text)
        for name, param in sorted(naming):   # each parameter naming a backend: refused whenever it was hostile
            outcomes = [(outcome, text) for endpoint, attacked, outcome, text in answers
                        if endpoint == name and param == attacked]
            assert len(outcomes) == len(hostile_texts), (name, param)
            assert all(outcome == "refused" and (OFFERS in t or HOST_ONLY in t or NOT_A_CHOICE in t)
                       for outcome, t in outcomes), (name, param, outcomes)
        # the parameters the walk found naming a backend (the closing note of issue 26 lists them)
        assert {name for name, _ in naming} >= {"/compare_models", "/sp_spot_compare", "/cf_spot_compare",
                                                "/runs_spot_compare", "/use_model", "/use_preset"}
        # Control: the same text from the host (who may name any backend) does reach the listener.
        with pytest.raises(AppError):
            _call(host, "/compare_models", presets=["synthetic"], more=hostile_texts[0], prompt="a photo of a cat", n=2)
        assert listener.hits


def test_refusals_read_the_same_whether_the_path_or_run_exists(tmp_path, monkeypatch):
    """folder: with an existing and a missing path, another visitor's run and a missing run: one
    sentence each, the same for both, naming no host path; the host's offers still work."""
    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "metadata.csv").write_text("file_name,prompt\n")
    world = tmp_path / "offered" / "world.json"   # a model at a host path, offered under a label
    world.parent.mkdir()
    world.write_text(Path(SYNTHETIC_TABLE).read_text())
    engine = _public_engine(tmp_path, public_generators=f"world-copy=synthetic_generator:{world}")
    data_dir = str(engine.store.data_dir)
    with running_app(engine) as url:
        _, a, b = _clients(url)
        a_run, _ = _measure(a, "a photo of a nurse")
        b_run, _ = _measure(b, "a photo of a doctor")
        other, missing = a_run, "20000101-000000-abcdef"

        def compare(more):
            return _refusal(lambda: _call(b, "/compare_models", presets=["synthetic"], more=more,
                                          prompt="a photo of a cat", n=2))

        def same(texts: list[str], *variable: str) -> str:
            masked = set()
            for text in texts:
                for v in sorted(variable, key=len, reverse=True):
                    text = text.replace(v, "<named>")
                masked.add(text)
            assert len(masked) == 1, masked
            text = masked.pop()
            assert data_dir not in text and str(tmp_path) not in text, text
            return text

        paths = [f"folder:{tmp_path / 'existing'}", f"folder:{tmp_path / 'no' / 'such'}", "folder:/etc",
                 f"diffusers:{tmp_path}", f"diffusers:{tmp_path / 'no'}"]
        assert OFFERS in same([compare(p) for p in paths])   # the engine's refusal: nothing named is echoed
        # the evaluator is a dropdown of the offered ones: Gradio refuses anything else (echoing it) first
        assert NOT_A_CHOICE in same([_refusal(lambda p=p: b.predict(p, api_name="/sp_spot_compare")) for p in paths],
                                    *paths)
        assert NOT_A_CHOICE in same([_refusal(lambda p=p: b.predict(run_value=[b_run], other_spec=p,
                                                                     api_name="/runs_spot_compare")) for p in paths],
                                    *paths)
        # another visitor's run and a missing one
        for endpoint, kwargs in (("/mine_resume", lambda r: {"run_id": r, "iterations": 3}),
                                 ("/runs_spot_compare", lambda r: {"run_value": [r], "other_spec": "synthetic_vqa:synthetic_world.json"}),
                                 ("/runs_spot_start", lambda r: {"run_value": [r], "axis_name": None, "n": 5, "name": ""}),
                                 ("/runs_open", lambda r: {"selected": [r]}),
                                 ("/runs_export_zip", lambda r: {"selected": [r]})):
            same([_refusal(lambda r=r: b.predict(**kwargs(r), api_name=endpoint)) for r in (other, missing)],
                 other, missing)
        deleted = [b.predict(selected=[r], confirmed=True, keep=False, api_name="/runs_delete")[2] for r in (other, missing)]
        assert "Not found" in same(deleted, other, missing)
        assert a.predict(selected=[a_run], api_name="/runs_open")   # A's run is still there

        # What the host offers works for visitors, by its label only: the page shows no host path.
        out = _call(b, "/compare_models", presets=["synthetic", "world-copy"], prompt="a photo of a cat", n=2)
        assert "world-copy" in out[1] and str(world.parent) not in out[1]
        evaluated = b.predict("synthetic_vqa:synthetic_world.json", api_name="/sp_spot_compare")
        assert "synthetic_vqa" in evaluated and data_dir not in evaluated


def test_store_images_reach_their_visitor_or_everyone_once_published(tmp_path, monkeypatch):
    """A sees their images, and everyone sees a published run's; nobody fetches an image by its
    store path or its key, and a guessed key answers like a missing one."""
    from gradio_client.exceptions import AppError

    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    # the server's own cache: on this machine test clients download files into the default one,
    # under the plain sha256 of their bytes, which a guess below would find
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio-cache"))
    engine = _public_engine(tmp_path)
    with access.acting_as(access.HOST):   # the host's run, published to every visitor
        shown = [e for e in generate.run(generate.GenerateRequest("a photo of a chef", n=2), engine)
                 if isinstance(e, Done)][0].run_id
        engine.store.set_published([shown])
    with running_app(engine) as url:
        _, a, b = _clients(url)
        a_run, a_urls = _measure(a, "a photo of a nurse")
        with access.acting_as(access.HOST):
            keys = [link["image_key"] for link in engine.store.get_run(a_run)["images"]]
            records = engine.store.get_images(keys)
        assert len(a_urls) == len(keys) == 4

        # A sees their images, from the run and when opening it again; the bytes are the store's
        opened = [item["image"]["url"] for item in a.predict(selected=[a_run], api_name="/runs_open")[1]]
        stored = {Path(r.path).read_bytes() for r in records.values()}
        for image_url in a_urls + opened:
            status, body = _get(image_url)
            assert status == 200 and body in stored
        # ... and the counterfactual sets' thumbnails (an HTML grid of <img> from Gradio's cache)
        job = a.submit(**_arguments(a, "/counterfactuals", prompt="a photo of a doctor", n=2), api_name="/counterfactuals")
        job.result()
        thumbnails = {src for out in job.outputs() for src in re.findall(r'<img src="([^"]+)"', str(out[4]))}
        assert thumbnails and all(src.startswith("gradio_api/file=") for src in thumbnails)
        for src in thumbnails:
            status, body = _get(url + src)
            assert status == 200 and body.startswith(PNG)
        # Everyone sees the published run's images, B included.
        published = b.predict(selected=[shown], api_name="/runs_open")[1]
        assert len(published) == 2 and all(_get(item["image"]["url"])[0] == 200 for item in published)
        # B can neither open A's run nor reach A's images by store path or key (no session at all here)
        with pytest.raises(AppError, match="no run"):
            b.predict(selected=[a_run], api_name="/runs_open")
        missing_key = hashlib.sha256(b"nobody generated this").hexdigest()
        store_dir, cache = engine.store.image_dir, Path(a_urls[0].split("file=", 1)[1]).parent.parent
        for key, record in records.items():
            data = Path(record.path).read_bytes()
            for guess in (record.path, store_dir / key[:2] / f"{key}.png", cache / f"{key}.png",
                          cache / key / f"{key}.png", cache / hashlib.sha256(data).hexdigest() / f"{key}.png"):
                status, body = _file(url, guess)
                assert status in (403, 404) and PNG not in body, guess
                missing = str(guess).replace(key, missing_key)
                assert (status, body) == _file(url, missing), guess   # a guessed key answers like a missing one


def test_an_export_holds_nothing_a_crafted_import_names(tmp_path, monkeypatch):
    """B imports an archive whose results name A's image key and one of A's texts: B's export of
    it holds none of A's embeddings, and B's spot-check of it never reaches A's image."""
    from gradio_client import handle_file

    from engine.methods import validate

    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    engine = _public_engine(tmp_path)
    with running_app(engine) as url:
        _, a, b = _clients(url)
        a_run, _ = _measure(a, "a photo of a nurse")
        b_run, _ = _measure(b, "a photo of a doctor")
        with access.acting_as(access.HOST):
            a_key = engine.store.get_run(a_run)["images"][0]["image_key"]
            a_text = engine.store.get_run(a_run)["results"]["gap"]["variations"][0]
            b_strings = json.dumps(engine.store.get_run(b_run)["results"])
        a_embeddings = {r["key"] for r in engine.store.embedding_rows([a_key, a_text])}
        assert len(a_embeddings) == 2 and a_text not in b_strings   # A's: an image's and a text's embedding

        exported = b.predict(selected=[b_run], api_name="/runs_export_zip")[0][0]["url"]
        status, archive = _get(exported)
        assert status == 200
        crafted = tmp_path / "crafted.zip"
        with zipfile.ZipFile(io.BytesIO(archive)) as zin, zipfile.ZipFile(crafted, "w") as zout:
            for item in zin.infolist():
                data = zin.read(item)
                data = data.replace(b_run.encode(), b"crafted-run")   # not B's run: imported, not skipped
                if item.filename == "gaplens/runs.jsonl":
                    row = json.loads(data)
                    results = json.loads(row["results"])
                    results["images"].append({**results["images"][0], "key": a_key})
                    for axis in results["axes"].values():
                        axis["labels"].append(axis["labels"][0])
                    results["planted"] = [a_key, a_text]
                    data = (json.dumps({**row, "results": json.dumps(results)}) + "\n").encode()
                zout.writestr(item, data)
        (new_id,) = b.predict(handle_file(str(crafted)), api_name="/runs_import")[0]["value"]
        assert new_id != b_run

        files = b.predict(selected=[new_id], api_name="/runs_export_zip")[0]
        with zipfile.ZipFile(io.BytesIO(_get(files[0]["url"])[1])) as zf:
            rows = [json.loads(line) for line in zf.read("gaplens/embeddings.jsonl").decode().splitlines()]
        assert rows, "the export carries the imported run's own image embeddings"
        assert not {r["subject"] for r in rows} & {a_key, a_text} and not {r["key"] for r in rows} & a_embeddings
        # B's spot-check of the imported run reads only the images it holds, never A's
        with access.acting_as(access.Visitor(f"session:{b.session_hash}")):
            run = engine.store.get_run(new_id)
            assert a_key in json.dumps(run["results"])
            items = validate.checkable_axes(run)
            assert items and all(a_key not in item.keys for item in items.values())
