"""Image sources beyond diffusers (issue 15): an OpenAI-compatible images API, Hugging Face
inference, a folder or dataset of existing images, a vision chat server and a label table as
evaluators. Remote APIs are local HTTP servers written here that speak the real protocols
(OpenAI images and chat with image parts, the HF inference route), including 429 with
Retry-After, 500, timeouts, malformed bodies, 401 and content-policy refusals."""
import base64
import csv
import hashlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from engine.backends import load_backend
from engine.backends.base import GenerationSettings, ModelSpec
from engine.backends.http_api import ApiError, ApiReplyError, AuthError
from engine.cli import main as cli_main
from engine.models import sources
from engine.core.engine import Engine
from engine.common import access
from engine.common.errors import InputError
from engine.common.events import Done, Warning
from engine.methods import generate

KEY = "sk-local-test-key-123"
GATE_WAIT = 2.0   # s a gated request waits for the others: a client sending one at a time pays it per call


def png_bytes(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buf, format="PNG")
    return buf.getvalue()


def colour_for(prompt: str, n: int) -> tuple:
    digest = hashlib.sha256(f"{prompt}|{n}".encode()).digest()
    return digest[0], digest[1], digest[2]


class FakeApi:
    """State of the local API server: requests seen, what to do per prompt, concurrency."""

    def __init__(self):
        self.requests = []             # (method, path, headers, body)
        self.lock = threading.Condition()
        self.inflight = 0
        self.max_inflight = 0
        self.max_text_chats = 0        # most text-only chat requests (an LLM's) in flight at once
        self.text_chats = 0
        self.gate = 0                  # hold each POST until this many are in flight (or GATE_WAIT passes)
        self.failures = {}             # prompt -> list of (status, headers, body) to send before succeeding
        self.require_key = None
        self.delay = 0.0

    def posts(self, path_end):
        return [r for r in self.requests if r[0] == "POST" and r[1].endswith(path_end)]


def make_handler(api: FakeApi):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, body, headers=None, content_type="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            api.requests.append(("GET", self.path, dict(self.headers), None))
            if self.path.endswith("/models"):
                return self._send(200, {"object": "list", "data": [{"id": "chat-model"}, {"id": "tiny-image-1"}]})
            self._send(404, {"error": {"message": "no such route"}})

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            api.requests.append(("POST", self.path, dict(self.headers), body))
            text = isinstance(body, dict) and isinstance((body.get("messages") or [{}])[0].get("content"), str)
            with api.lock:
                api.inflight += 1
                api.text_chats += text
                api.max_inflight = max(api.max_inflight, api.inflight)
                api.max_text_chats = max(api.max_text_chats, api.text_chats)
                api.lock.notify_all()
                api.lock.wait_for(lambda: api.inflight >= api.gate, timeout=GATE_WAIT)
            try:
                self._answer(body)
            finally:
                with api.lock:
                    api.inflight -= 1
                    api.text_chats -= text

        def _answer(self, body):
            if api.delay:
                time.sleep(api.delay)  # a slow server, so that concurrent requests overlap
            if api.require_key and self.headers.get("Authorization") != f"Bearer {api.require_key}":
                return self._send(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
            if self.path.endswith("/chat/completions"):
                return self._chat(body)
            prompt = body.get("prompt") if self.path.endswith("/images/generations") else body.get("inputs")
            plan = api.failures.get(prompt)
            if plan:
                status, headers, payload = plan.pop(0)
                if status == "sleep":
                    time.sleep(headers)
                    return self._send(200, {"data": []})
                if status == 200:
                    return self._send(200, payload if isinstance(payload, bytes) else payload, content_type="application/json")
                return self._send(status, payload, headers)
            if "refuse" in prompt:
                if self.path.endswith("/images/generations"):
                    return self._send(400, {"error": {"code": "content_policy_violation", "type": "invalid_request_error",
                                                      "message": "Your request was rejected as a result of our safety system."}})
                return self._send(400, {"error": "NSFW content detected. Try another prompt."})
            n = len([r for r in api.requests if r[3] and (r[3].get("prompt") or r[3].get("inputs")) == prompt])
            image = png_bytes(colour_for(prompt, n))
            if self.path.endswith("/images/generations"):
                return self._send(200, {"created": 1, "data": [{"b64_json": base64.b64encode(image).decode()}]})
            return self._send(200, image, content_type="image/png")  # HF inference route: raw image bytes

        def _chat(self, body):
            parts = body["messages"][0]["content"]
            if isinstance(parts, str):   # an LLM's request (an axis question): the question it writes
                reply = json.dumps({"question": f"Which fits the person best? ({len(parts)})"})
                return self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})
            text = next(p["text"] for p in parts if p["type"] == "text")
            url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
            assert url.startswith("data:image/png;base64,")
            image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
            red, _, blue = image.getpixel((0, 0))
            plan = api.failures.get(text)
            if plan:
                status, headers, payload = plan.pop(0)
                return self._send(status, payload, headers)
            if "refuse" in text:
                return self._send(400, {"error": {"code": "content_filter", "message": "filtered"}})
            reply = ("A woman, I think." if red > blue else "It is a man.") if "gender" in text else "a person"
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})

    return Handler


@pytest.fixture
def api():
    state = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def run_cli(capsys, *argv):
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- the done-check: generate through an images API, then again from the store ---------------------

@pytest.mark.slow
def test_generate_through_openai_images_api_stores_4_and_rerun_makes_no_request(api, data_dir, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    api.require_key = KEY
    args = ["generate", "--preset", "synthetic", "--data-dir", data_dir, "--generator", f"openai:{api.url}/v1",
            "--prompt", "a photo of a doctor", "-n", "4", "--json"]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    posts = api.posts("/images/generations")
    assert len(posts) == 4
    assert {p[3]["model"] for p in posts} == {"tiny-image-1"}       # an image model from GET /v1/models
    assert all(p[3]["response_format"] == "b64_json" and p[3]["n"] == 1 for p in posts)
    assert all(p[2]["Authorization"] == f"Bearer {KEY}" for p in posts)
    results = json.loads(out)
    assert len(results["images"]) == 4 and all(Path(i["path"]).exists() for i in results["images"])
    assert "4 image API call(s)" in err and "not seedable" in err
    assert KEY not in out + err

    code, out2, err2 = run_cli(capsys, *args)
    assert code == 0 and len(api.requests) == 5   # 4 images + 1 model list; the same call again: no request
    assert [i["key"] for i in json.loads(out2)["images"]] == [i["key"] for i in results["images"]]
    assert all(i["cached"] for i in json.loads(out2)["images"])
    store_bytes = b"".join(p.read_bytes() for p in Path(data_dir).glob("gaplens.sqlite*"))
    assert KEY.encode() not in store_bytes   # the key is never stored


def test_options_are_identity_and_secrets_are_refused(api, data_dir, capsys):
    base = ["generate", "--preset", "synthetic", "--data-dir", data_dir, "--generator", f"openai:{api.url}",
            "--prompt", "a nurse", "-n", "1", "--generator-option", "model=tiny-image-1"]
    assert run_cli(capsys, *base)[0] == 0
    assert run_cli(capsys, *base, "--generator-option", "quality=high")[0] == 0
    posts = api.posts("/images/generations")
    assert len(posts) == 2 and posts[1][3]["quality"] == "high"     # another option: another model identity
    assert not [r for r in api.requests if r[0] == "GET"]            # model named: no model list
    code, _, err = run_cli(capsys, *base, "--generator-option", "api_key=sk-oops")
    assert code == 2 and "secret" in err and "Traceback" not in err and "sk-oops" not in err
    code, _, err = run_cli(capsys, *base, "--generator-option", "novalue")
    assert code == 2 and "KEY=VALUE" in err


def test_backend_names_are_read_per_role(api, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1", llm=f"openai:{api.url}/v1",
                    vqa=f"openai:{api.url}/v1")
    specs = engine.preset.specs()
    assert (specs["generator"].backend, specs["llm"].backend, specs["vqa"].backend) == \
        ("openai_images", "openai", "openai_vqa")
    assert sources.source_kind(engine) == "api" and engine.default_settings().scheduler == "api"
    with pytest.raises(InputError, match="an LLM backend and cannot be the generator"):
        Engine("synthetic", data_dir=data_dir, generator="hf_chat:Qwen/Qwen2.5-0.5B-Instruct")
    engine = Engine("synthetic", data_dir=data_dir, options={"vqa": {"error": 0.3}})
    assert engine.preset.vqa.options == {"error": 0.3} and "error=0.3" in engine.model_id("vqa")


# -- retries, errors and refusals --------------------------------------------------------------------

def images_backend(api, **options):
    gen = load_backend(ModelSpec("openai_images", f"{api.url}/v1", {"model": "tiny-image-1", **options}))
    waits = []
    gen.retrier.sleep = waits.append   # see the waits without waiting
    return gen, waits


SETTINGS = GenerationSettings(steps=0, guidance=0.0, width=16, height=16, scheduler="api")


def test_429_is_retried_after_the_servers_retry_after_and_500_with_backoff(api):
    gen, waits = images_backend(api, retry_wait=0.5)
    api.failures["busy"] = [(429, {"Retry-After": "7"}, {"error": {"message": "Rate limit reached", "code": "rate_limit"}}),
                            (500, {}, {"error": {"message": "upstream exploded"}}),
                            (503, {}, {"error": {"message": "overloaded"}})]
    [out] = gen.generate("busy", [0], SETTINGS)
    assert out.refused is None and out.image.size == (16, 16)
    assert waits == [7.0, 1.0, 2.0]     # Retry-After first, then retry_wait * 2**attempt
    assert len(api.posts("/images/generations")) == 4


def test_gpt_image_models_get_no_response_format(api):
    gen, _ = images_backend(api, model="gpt-image-1")
    gen.generate("a baker", [0], SETTINGS)
    assert "response_format" not in api.posts("/images/generations")[0][3]


def test_persistent_500_gives_up_with_the_servers_message(api):
    gen, waits = images_backend(api, max_retries=2)
    api.failures["down"] = [(500, {}, {"error": {"message": "upstream exploded"}})] * 3
    with pytest.raises(ApiError, match=r"HTTP 500.*upstream exploded.*after 3 attempts"):
        gen.generate("down", [0], SETTINGS)
    assert len(waits) == 2


def test_401_names_the_key_variables_and_is_not_retried(api, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    api.require_key = KEY
    gen, waits = images_backend(api)
    with pytest.raises(AuthError, match="GAPLENS_GENERATOR_API_KEY or OPENAI_API_KEY"):
        gen.generate("a doctor", [0], SETTINGS)
    assert waits == [] and len(api.posts("/images/generations")) == 1
    api.require_key = None
    api.failures["a judge"] = [(403, {}, {"error": {"message": "Project does not have access to model tiny-image-1"}})]
    with pytest.raises(AuthError, match="HTTP 403.*does not have access.*not allowed"):
        gen.generate("a judge", [0], SETTINGS)


def test_timeouts_and_malformed_bodies_are_clear_errors(api):
    impatient, _ = images_backend(api, timeout=0.2, max_retries=0)
    api.failures["slow"] = [("sleep", 1.0, None)]
    with pytest.raises(ApiError, match="did not answer"):
        impatient.generate("slow", [0], SETTINGS)
    gen, _ = images_backend(api, max_retries=0)   # the default timeout: a loaded runner still answers in time
    api.failures["empty"] = [(200, {}, {"data": []})]
    with pytest.raises(ApiReplyError, match="without data"):
        gen.generate("empty", [0], SETTINGS)
    api.failures["not base64"] = [(200, {}, {"data": [{"b64_json": "!!not base64!!"}]})]
    with pytest.raises(ApiReplyError, match="not base64"):
        gen.generate("not base64", [0], SETTINGS)
    api.failures["not an image"] = [(200, {}, {"data": [{"b64_json": base64.b64encode(b"hello").decode()}]})]
    with pytest.raises(ApiReplyError, match="not an image"):
        gen.generate("not an image", [0], SETTINGS)
    api.failures["html"] = [(200, {}, b"<html>gateway</html>")]
    with pytest.raises(ApiReplyError):
        gen.generate("html", [0], SETTINGS)


def test_a_refused_prompt_is_recorded_counted_shown_and_never_asked_again(api, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1",
                    options={"generator": {"model": "tiny-image-1"}})
    events = list(generate.run(generate.GenerateRequest("please refuse this", n=3), engine))
    done = events[-1]
    assert isinstance(done, Done) and done.summary["refused"] == 3 and done.summary["n"] == 0
    assert all(i["refused"] and i["nsfw"] for i in done.results["images"])
    assert any(isinstance(e, Warning) and "refused 3 of 3" in e.message for e in events)
    assert len(api.posts("/images/generations")) == 3
    events = list(generate.run(generate.GenerateRequest("please refuse this", n=3), engine))
    assert len(api.posts("/images/generations")) == 3 and events[-1].summary["refused"] == 3
    assert sources.api_calls_needed(engine, [("please refuse this", [0, 1, 2], engine.default_settings())]) == 0


def test_the_api_call_budget_is_checked_before_any_call(api, data_dir, capsys):
    args = ["generate", "--preset", "synthetic", "--data-dir", data_dir, "--generator", f"openai:{api.url}/v1",
            "--generator-option", "model=tiny-image-1", "--prompt", "a pilot", "-n", "4"]
    code, _, err = run_cli(capsys, *args, "--max-api-calls", "3")
    assert code == 2 and "budget" in err and "--max-api-calls" in err
    assert api.posts("/images/generations") == []
    assert run_cli(capsys, *args, "--max-api-calls", "4")[0] == 0


def test_concurrency_is_bounded(api):
    # Each request waits at the server until two are in flight, then stays a little longer: calls sent
    # one at a time never overlap (peak 1), and a third concurrent call would be seen (peak 3).
    api.gate, api.delay = 2, 0.05
    gen, _ = images_backend(api, concurrency=2)
    outs = gen.generate("a teacher", list(range(6)), SETTINGS)
    assert len(outs) == 6 and [o.seed for o in outs] == list(range(6))
    assert api.max_inflight == 2


# -- Hugging Face inference (self-hosted route through InferenceClient) ------------------------------

def test_hf_inference_through_a_self_hosted_endpoint(api, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", "hf_local_token")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # tests run offline; this server is local
    gen = load_backend(ModelSpec("hf_inference", "tiny/text-to-image", {"base_url": api.url + "/"}))
    waits = []
    gen.retrier.sleep = waits.append
    api.failures["a chef"] = [(429, {"Retry-After": "2"}, {"error": "Rate limit reached"})]
    outs = gen.generate("a chef", [0, 1], GenerationSettings(steps=4, guidance=0.0, width=16, height=16))
    assert [o.image.size for o in outs] == [(16, 16), (16, 16)] and waits == [2.0]
    posts = api.posts("/")
    assert {p[3]["parameters"]["seed"] for p in posts} == {0, 1}
    assert all(p[3]["parameters"]["num_inference_steps"] == 4 for p in posts)
    assert all(p[2]["authorization"] == "Bearer hf_local_token" for p in posts)
    [refused] = gen.generate("refuse me", [0], GenerationSettings(steps=4, guidance=0.0, width=16, height=16))
    assert refused.image is None and "NSFW" in refused.refused
    api.failures["junk"] = [(200, {}, b"not an image at all")]
    with pytest.raises(ApiReplyError, match="not an image"):
        gen.generate("junk", [0], GenerationSettings(steps=4, guidance=0.0, width=16, height=16))
    assert gen.id.startswith("hf_inference:tiny/text-to-image?base_url=")
    api.require_key = "hf_someone_else"
    with pytest.raises(AuthError, match="HTTP 401.*HF_TOKEN"):
        gen.generate("a chef", [5], GenerationSettings(steps=4, guidance=0.0, width=16, height=16))


# -- evaluators: a vision chat server and a label table -------------------------------------------

def test_openai_vqa_sends_the_image_as_a_data_url_and_constrains_choices(api):
    vqa = load_backend(ModelSpec("openai_vqa", f"{api.url}/v1", {}))
    images = [Image.new("RGB", (8, 8), (200, 0, 10)), Image.new("RGB", (8, 8), (10, 0, 200))]
    assert vqa.answer(images, "What is the gender of the person?", ["male", "female"]) == ["female", "male"]
    chats = api.posts("/chat/completions")
    assert {c[3]["model"] for c in chats} == {"chat-model"} and all(c[3]["temperature"] == 0 for c in chats)
    assert "Answer with exactly one of: male, female." in chats[0][3]["messages"][0]["content"][0]["text"]
    assert vqa.answer(images[:1], "refuse to say the gender", ["male", "female"]) == ["other"]
    assert vqa.caption(images[:1]) == ["a person"]
    waits = []
    vqa.retrier.sleep = waits.append
    api.failures["Describe the image in one short sentence."] = [
        (429, {"Retry-After": "5"}, {"error": {"message": "slow down"}}), (502, {}, b"bad gateway"),
        (200, {}, {"choices": []})]
    with pytest.raises(ApiReplyError, match="without choices"):
        vqa.caption(images[:1])
    assert waits == [5.0, 2.0]


def synthetic_folder(tmp_path, engine, prompts: dict, fmt="csv", labels=None):
    """An imagefolder of synthetic-world images: {prompt: n}; labels(prompt, i) -> {column: value}."""
    root = tmp_path / "images"
    (root / "imgs").mkdir(parents=True)
    rows = []
    for p, (prompt, n) in enumerate(prompts.items()):
        for i, record in enumerate(engine.image_set(prompt, list(range(100 + 10 * p, 100 + 10 * p + n)))):
            name = f"imgs/p{p}_{i}.png"
            record.image.save(root / name)
            rows.append({"file_name": name, "prompt": prompt, "seed": n - i, **(labels(prompt, i) if labels else {})})
    if fmt == "csv":
        with (root / "metadata.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, rows


def test_folder_serves_the_first_n_of_a_prompt_and_says_how_many_it_has(tmp_path, data_dir, capsys):
    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    root, rows = synthetic_folder(tmp_path, maker, {"a photo of a doctor": 3, "a photo of a nurse": 2})
    args = ["generate", "--preset", "synthetic", "--data-dir", data_dir, "--generator", f"folder:{root}",
            "--prompt", "a photo of a doctor", "--json"]
    code, out, err = run_cli(capsys, *args, "-n", "2")
    assert code == 0, err
    served = json.loads(out)["images"]
    # stable order: by the seed column (3, 2, 1 for files 0, 1, 2), so the first two are files 2 and 1
    expected = [Image.open(root / f"imgs/p0_{i}.png").convert("RGB").tobytes() for i in (2, 1)]
    assert [Image.open(i["path"]).convert("RGB").tobytes() for i in served] == expected
    code, out, err = run_cli(capsys, *args, "-n", "5")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"error: the folder {root} has 3 image(s) of 'a photo of a doctor', "
                                        "fewer than the 5 asked for; ask for at most 3"]
    code, _, err = run_cli(capsys, *args[:-3], "--prompt", "a photo of a pilot", "-n", "1")
    assert code == 2 and "no images of the prompt 'a photo of a pilot'" in err and "Traceback" not in err


def test_single_prompt_on_a_folder_with_its_labels(tmp_path, data_dir):
    from engine.methods import single_prompt

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    genders = ["female", "female", "male", "female"]
    root, _ = synthetic_folder(tmp_path, maker, {"a photo of a doctor": 4}, fmt="jsonl",
                               labels=lambda prompt, i: {"gender": genders[i], "caption": f"a {genders[i]} doctor"})
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}", vqa=f"labels:{root}")
    request = single_prompt.SinglePromptRequest("a photo of a doctor", n=4, axes=["gender"], gap=False, n_boot=100)
    done = list(single_prompt.run(request, engine))[-1]
    gender = done.results["axes"]["gender"]
    # seeds order the folder 4,3,2,1 -> files 3,2,1,0
    assert sorted(gender["labels"]) == sorted(genders) and gender["counts"] == {"female": 3, "male": 1}
    assert done.results["captions"][0] == "a female doctor"
    with pytest.raises(InputError, match="has 4 image"):
        list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=5, gap=False), engine))


@pytest.mark.slow
def test_counterfactuals_on_a_folder(tmp_path, data_dir):
    from engine.methods.counterfactuals import CounterfactualsRequest, run

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    prompts = {"a photo of a doctor": 6, "a photo of a male doctor": 6, "a photo of a female doctor": 6}
    root, _ = synthetic_folder(tmp_path, maker, prompts)
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}")
    axes = {"gender": ["a photo of a male doctor", "a photo of a female doctor"]}
    events = list(run(CounterfactualsRequest("a photo of a doctor", axes=axes, n=6, n_boot=100), engine))
    done = events[-1]
    assert isinstance(done, Done)
    cas = done.results["cas"]["gender"]
    # the synthetic world plants male doctors: the male counterfactual stays closer to the prompt
    assert cas["a photo of a male doctor"] > cas["a photo of a female doctor"]
    assert engine.stats.images_generated == 18 and engine.stats.generator_calls == 3   # all from the folder


def test_methods_that_need_new_images_say_so_and_name_what_the_source_has(tmp_path, data_dir):
    from engine.methods import mine, mitigate

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    root, _ = synthetic_folder(tmp_path, maker, {"a photo of a doctor": 2})
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}")
    with pytest.raises(InputError, match=r"Mine Prompts needs images of prompts it writes itself.*"
                                         r"'a photo of a doctor' \(2\).*Single Prompt"):
        list(mine.run(mine.MineRequest(), engine))
    with pytest.raises(InputError, match="Mitigate needs images of prompts it writes itself"):
        list(mitigate.run(mitigate.MitigateRequest("a photo of a doctor"), engine))
    assert engine.status()["generator_kind"] == "source"


def test_the_model_panel_switches_one_role_with_options(tmp_path, data_dir, api):
    engine = Engine("synthetic", data_dir=data_dir)
    spec = sources.use_model(engine, "generator", f"openai:{api.url}", {"model": "tiny-image-1", "quality": "low"})
    assert spec.backend == "openai_images" and engine.preset.name == "synthetic+custom"
    assert engine.model_id("generator") == f"openai_images:tiny-image-1@{api.url}/v1?quality=low"
    assert engine.status()["models"]["generator"].endswith("[model=tiny-image-1, quality=low]")
    sources.use_model(engine, "vqa", "", {"error": 0.2})          # options only: same model, new identity
    assert engine.preset.vqa.backend == "synthetic_vqa" and "error=0.2" in engine.model_id("vqa")
    with pytest.raises(InputError, match="secret"):
        sources.use_model(engine, "generator", "", {"token": "x"})


def test_intersectional_on_a_folder(tmp_path, data_dir):
    from engine.methods.intersectional import IntersectionalRequest, run

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    cfs = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
           "age": ["a photo of a young doctor", "a photo of an old doctor"]}
    root, _ = synthetic_folder(tmp_path, maker, {"a photo of a doctor": 8, **{cf: 8 for v in cfs.values() for cf in v}})
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}")
    done = list(run(IntersectionalRequest("a photo of a doctor", axes=cfs, n=8, n_boot=0), engine))[-1]
    assert isinstance(done, Done) and engine.stats.images_generated == 40


def test_llm_and_vlm_stages_send_their_requests_to_a_vllm_style_server_at_once(api, data_dir):
    """`--llm openai:` and `--vqa openai:` against one OpenAI-compatible server (as `vllm serve` is):
    the LLM's independent calls (BiasConnect's question per new axis, cfsets.settle_questions_and_ideals)
    are in flight together, at most its `concurrency`, and so are one VQA call's images."""
    from engine.core.distributed import exhaust
    from engine.methods.cfsets import settle_questions_and_ideals
    from engine.methods.intersectional import IntersectionalRequest

    api.gate = 3   # each request waits until 3 are in flight (or GATE_WAIT): one at a time would pay it per call
    engine = Engine("synthetic", data_dir=data_dir, llm=f"openai:{api.url}", vqa=f"openai:{api.url}",
                    options={"llm": {"concurrency": 3}, "vqa": {"concurrency": 3}}, public=True)
    axes = {a: [f"a photo of a doctor with {v} {a}" for v in ("little", "much")] for a in ("hat", "mood", "light", "noise", "scarf", "desk")}
    values = {a: ["little", "much"] for a in axes}
    with access.acting_as(access.Visitor("session:v")):   # a public GapLens's visitor: charged in every thread
        questions, _ = exhaust(settle_questions_and_ideals(IntersectionalRequest("a photo of a doctor", axes=axes),
                                                         engine, axes, values))
    asked = [r[3]["messages"][0]["content"] for r in api.posts("/chat/completions")]
    assert len(asked) == 6 and api.max_text_chats == api.max_inflight == 3   # 6 axis questions, 3 at once: bounded
    charged = engine.store._read("SELECT visitor, llm_calls FROM charges")
    assert [(r["visitor"], r["llm_calls"]) for r in charged] == [("session:v", 1)] * 6
    assert sorted(questions.values()) == sorted(f"Which fits the person best? ({len(text)})" for text in asked)
    records = engine.image_set("a photo of a doctor", range(3))
    assert engine.ask(records, questions["hat"], values["hat"]) == ["other"] * 3   # "a person" names no choice
    assert len(api.posts("/chat/completions")) == 6 + 3 and api.max_inflight == 3 and api.max_text_chats == 3


@pytest.mark.slow
def test_hf_dataset_source_and_labels_through_the_datasets_library(tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    genders = ["male", "male", "female"]
    root, rows = synthetic_folder(tmp_path, maker, {"a photo of a judge": 3}, fmt="jsonl",
                                  labels=lambda prompt, i: {"gender": genders[i]})
    engine = Engine("synthetic", data_dir=data_dir, generator=f"hf-dataset:{root}", vqa="labels:" + str(root),
                    options={"vqa": {"dataset": True}})
    assert engine.preset.generator.backend == "hf_dataset"
    records = engine.image_set("a photo of a judge", [0, 1, 2])
    # seeds 3, 2, 1 order the rows 2, 1, 0
    assert [r.image.tobytes() for r in records] == \
        [Image.open(root / f"imgs/p0_{i}.png").convert("RGB").tobytes() for i in (2, 1, 0)]
    assert engine.ask(records, "What is the gender of the person?", ["male", "female"]) == ["female", "male", "male"]
    with pytest.raises(InputError, match="no label column answers"):
        engine.ask(records, "What is the age of the person?")
    with pytest.raises(InputError, match="has 3 image"):
        engine.image_set("a photo of a judge", [0, 1, 2, 3])


def test_a_multi_prompt_run_announces_and_checks_its_total_api_calls_first(api, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1",
                    options={"generator": {"model": "tiny-image-1"}}, max_api_calls=5)
    request = generate.GenerateRequest("", n=2, prompts=["a cook", "a pilot", "a nurse"])
    with pytest.raises(InputError, match="needs 6 image API calls but the budget allows 5"):
        list(generate.run(request, engine))
    assert api.posts("/images/generations") == []          # nothing was asked before the check
    engine.max_api_calls = 6
    events = list(generate.run(request, engine))
    warnings = [e.message for e in events if isinstance(e, Warning)]
    assert sum("API call" in w for w in warnings) == 1 and "6 image API call(s)" in warnings[0]
    assert len(api.posts("/images/generations")) == 6


@pytest.mark.slow
def test_mine_ranks_the_prompts_a_source_holds(tmp_path, data_dir):
    from engine.methods import mine

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    prompts = {"a photo of a doctor": 6, "a photo of a nurse": 6, "a photo of a person": 6, "a photo of a cat": 2}
    root, _ = synthetic_folder(tmp_path, maker, prompts)
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}")
    with pytest.raises(InputError, match="strategy 'source'"):
        list(mine.run(mine.MineRequest(n=6), engine))
    request = mine.MineRequest(strategy="source", n=6, n_variations=6, population=2, select=1, iterations=10)
    done = list(mine.run(request, engine))[-1]
    scored = {node["prompt"] for node in done.results["nodes"] if node.get("score") is not None}
    assert scored == {"a photo of a doctor", "a photo of a nurse", "a photo of a person"}   # the cat has 2 images
    assert done.results["params"]["T"] == 2 and engine.stats.images_generated == 18
    assert [a["prompt"] for a in done.results["archive"]][0] in scored


def test_images_made_before_a_failure_are_kept(api, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1",
                    options={"generator": {"model": "tiny-image-1", "max_retries": 0, "concurrency": 4}})
    api.failures["a welder"] = [(200, {}, {"data": [{"b64_json": base64.b64encode(png_bytes((1, 2, 3))).decode()}]}),
                                (503, {}, {"error": {"message": "overloaded"}})]
    api.delay = 0.05   # the four calls overlap; which one meets which reply does not matter
    with pytest.raises(ApiError, match="overloaded"):
        list(generate.run(generate.GenerateRequest("a welder", n=4), engine))
    assert engine.store.count("images") == 3          # the three images that arrived are stored
    list(generate.run(generate.GenerateRequest("a welder", n=4), engine))
    assert len(api.posts("/images/generations")) == 5   # only the failed one is asked again


def test_a_503_mid_run_is_titled_an_api_error_not_a_model_load_error(api, data_dir):
    import gradio as gr

    from engine.common.errors import ModelLoadError
    from tabs.common import user_errors

    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1",
                    options={"generator": {"model": "tiny-image-1", "max_retries": 0}})
    api.failures["a welder"] = [(503, {}, {"error": {"message": "overloaded"}})]
    with pytest.raises(gr.Error) as shown:     # what a tab shows: the handler's error, titled
        user_errors(lambda: list(generate.run(generate.GenerateRequest("a welder", n=1), engine)))()
    assert shown.value.title == "API error" and "HTTP 503" in shown.value.message and "overloaded" in shown.value.message
    assert isinstance(shown.value.__cause__, ApiError) and not isinstance(shown.value.__cause__, ModelLoadError)


def test_two_runs_at_once_keep_their_own_api_call_budgets_and_counts(api, data_dir):
    """Two visitors' runs on one engine: each run counts its own image API calls against its own
    budget (4 per run here) and its own images, however their steps interleave."""
    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1", max_api_calls=4,
                    options={"generator": {"model": "tiny-image-1", "max_retries": 0}})
    first = generate.run(generate.GenerateRequest("a welder", n=3), engine)
    announced = next(e for e in first if isinstance(e, Warning) and "image API call" in e.message)
    assert "3 image API call(s)" in announced.message          # the first run has announced its 3 calls ...
    second = list(generate.run(generate.GenerateRequest("a nurse", n=3), engine))     # ... when another runs
    first = [announced, *first]
    for events in (first, second):
        done = events[-1]
        assert isinstance(done, Done) and done.summary["n"] == 3
    assert engine.stats.images_generated == 6 and len(api.posts("/images/generations")) == 6


def test_single_prompt_on_an_api_that_refuses_everything_says_so(api, data_dir):
    from engine.methods import single_prompt

    engine = Engine("synthetic", data_dir=data_dir, generator=f"openai:{api.url}/v1",
                    options={"generator": {"model": "tiny-image-1"}})
    events = list(single_prompt.run(single_prompt.SinglePromptRequest("please refuse", n=2, gap=False), engine))
    assert any(isinstance(e, Warning) and "refused 2 of 2" in e.message for e in events)
    done = events[-1]
    assert isinstance(done, Done) and done.results["all_flagged"] and done.summary["n"] == 0
    assert "refused by the API" in done.results["message"]
    assert all(i["refused"] for i in done.results["images"])
