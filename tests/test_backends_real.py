"""The real backends, exercised through tiny random-weight models saved to disk and loaded back
with the same from_pretrained / open_clip code path users run with hub ids.

The models produce noise; these tests check the plumbing: counts, sizes, seeds, determinism,
normalisation, choice mapping, error messages. Tiny models are built once per session.
"""
from __future__ import annotations

import json
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # must precede transformers/diffusers imports: hub misses fail at once

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from engine.backends import device as devices
from engine.backends import load_backend
from engine.backends.base import Embedder, ImageGenerator, ModelSpec, TextGenerator, VQA
from engine.backends.diffusers_generator import family_from_class_name
from engine.backends.vqa import ClipVQA, match_choice
from engine.common.errors import InputError, LLMOutputError, ModelLoadError, OutOfMemoryError
from tests import tiny_models

pytestmark = pytest.mark.real_model

PROMPT = "a photo of a doctor"


@pytest.fixture(scope="module")
def generator(tiny):
    return load_backend(tiny["generator"])


@pytest.fixture(scope="module")
def settings(generator):
    return generator.defaults().replace(steps=2, guidance=1.0)    # no CFG: half the UNet work


@pytest.fixture(scope="module")
def open_clip_embedder(tiny):
    return load_backend(tiny["open_clip"])


@pytest.fixture(scope="module")
def hf_clip_embedder(tiny):
    return load_backend(tiny["hf_clip"])


@pytest.fixture(scope="module")
def chat_llm(tiny):
    return load_backend(tiny["chat_llm"])


@pytest.fixture(scope="module")
def blip(tiny):
    return load_backend(tiny["blip_vqa"])


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    rng = np.random.RandomState(0)
    out = [Image.fromarray((rng.rand(72, 60, 3) * 255).astype("uint8")) for _ in range(4)]
    return out + [Image.new("L", (40, 40), 128)]  # a grayscale one: backends convert to RGB


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


class PipeSpy:
    """Stands in for a diffusers pipeline: records call kwargs, then delegates (or raises)."""

    def __init__(self, pipe, raise_exc: Exception | None = None):
        self._pipe, self._raise, self.calls = pipe, raise_exc, []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if self._raise is not None:
            raise self._raise
        return self._pipe(**kwargs)

    def __getattr__(self, name):
        return getattr(self._pipe, name)


# --- image generator -----------------------------------------------------------------------------

def test_generator_loads_with_family_defaults(generator, tiny):
    assert isinstance(generator, ImageGenerator)
    assert generator.family == "sd1"
    assert generator.id.startswith(tiny["generator"].model + "@local-")
    assert generator.batch_size == 8
    assert 1_000_000 < generator.memory_bytes() < 50_000_000           # ~3.3M fp32 parameters
    d = generator.defaults()
    assert (d.width, d.height, d.steps, d.guidance, d.scheduler) == (64, 64, 30, 7.5, "default")


def test_a_prompt_is_cut_at_the_tokenizer_length(generator, settings):
    tokenizer = generator.pipe.tokenizer
    long = "a photo of a doctor " + "very " * tokenizer.model_max_length
    assert len(tokenizer(long).input_ids) > tokenizer.model_max_length == 77
    cut = generator.generate(long, [1], settings)[0].image
    assert np.array_equal(pixels(generator.generate(long + "in a hospital at night", [1], settings)[0].image), pixels(cut))
    assert not np.array_equal(pixels(generator.generate(PROMPT + " in a hospital", [1], settings)[0].image),
                              pixels(generator.generate(PROMPT, [1], settings)[0].image))


def test_generate_count_size_and_seeds(generator, settings):
    seeds = [11, 3, 11, 42]
    out = generator.generate(PROMPT, seeds, settings)
    assert [g.seed for g in out] == seeds
    assert all(g.image.size == (64, 64) and g.image.mode == "RGB" and g.nsfw is False for g in out)
    assert np.array_equal(pixels(out[0].image), pixels(out[2].image))       # same seed in one batch
    assert not np.array_equal(pixels(out[0].image), pixels(out[1].image))
    assert generator.generate(PROMPT, [], settings) == []


def test_same_seed_same_image_and_single_regeneration(generator, settings):
    cfg = settings.replace(guidance=7.5)
    batch = generator.generate(PROMPT, [0, 1, 2, 3, 4], cfg)
    again = generator.generate(PROMPT, [0, 1, 2, 3, 4], cfg)
    assert all(np.array_equal(pixels(a.image), pixels(b.image)) for a, b in zip(batch, again))
    alone = generator.generate(PROMPT, [3], cfg)[0]
    assert np.abs(pixels(alone.image) - pixels(batch[3].image)).max() <= 1


def test_negative_prompt_only_with_guidance(generator, settings):
    spy = PipeSpy(generator.pipe)
    generator.pipe = spy
    try:
        generator.generate(PROMPT, [1], settings.replace(negative_prompt="blurry", guidance=7.5))
        generator.generate(PROMPT, [1], settings.replace(negative_prompt="blurry", guidance=1.0))
    finally:
        generator.pipe = spy._pipe
    first, second = spy.calls
    assert first["negative_prompt"] == "blurry" and "negative_prompt" not in second
    assert len(first["generator"]) == 1 and first["num_images_per_prompt"] == 1
    assert (first["height"], first["width"], first["num_inference_steps"]) == (64, 64, 2)


def test_scheduler_switch_and_bad_inputs(generator, settings):
    euler = generator.generate(PROMPT, [5], settings.replace(scheduler="euler"))[0]
    default = generator.generate(PROMPT, [5], settings)[0]
    assert euler.image.size == (64, 64)
    assert not np.array_equal(pixels(euler.image), pixels(default.image))
    assert type(generator.pipe.scheduler).__name__ == "DDIMScheduler"   # "default" restores the pipeline's own
    with pytest.raises(InputError, match="scheduler 'nope'"):
        generator.generate(PROMPT, [5], settings.replace(scheduler="nope"))
    with pytest.raises(InputError, match="width 30"):
        generator.generate(PROMPT, [5], settings.replace(width=30))


def test_out_of_memory_becomes_a_clear_error(generator, settings):
    import torch

    spy = PipeSpy(generator.pipe, raise_exc=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    generator.pipe = spy
    try:
        with pytest.raises(OutOfMemoryError, match="smaller batch size .now 8"):
            generator.generate(PROMPT, [1, 2], settings)
    finally:
        generator.pipe = spy._pipe


def test_safety_checker_flags_but_never_blacks_out(tiny, settings):
    flagged = load_backend(tiny["generator_nsfw"])
    assert flagged.has_safety_checker
    out = flagged.generate(PROMPT, [1, 2, 3], settings)
    assert [g.nsfw for g in out] == [True, True, True]
    assert all(pixels(g.image).std() > 10 for g in out)              # not blacked out
    unchecked = load_backend(ModelSpec("diffusers", tiny["generator_nsfw"].model, {"safety_checker": False}))
    assert not unchecked.has_safety_checker
    plain = unchecked.generate(PROMPT, [1, 2, 3], settings)
    assert [g.nsfw for g in plain] == [False] * 3
    assert all(np.array_equal(pixels(a.image), pixels(b.image)) for a, b in zip(out, plain))


def test_options_override_defaults(tiny):
    spec = tiny["generator"]
    custom = load_backend(ModelSpec("diffusers", spec.model, {"steps": 3, "guidance": 2.0, "size": 32,
                                                              "scheduler": "euler_a", "batch_size": 2}))
    d = custom.defaults()
    assert (d.steps, d.guidance, d.width, d.height, d.scheduler, custom.batch_size) == (3, 2.0, 32, 32, "euler_a", 2)
    out = custom.generate(PROMPT, [7], d)
    assert out[0].image.size == (32, 32)


@pytest.mark.parametrize("class_name, model, family", [
    ("StableDiffusionPipeline", "stable-diffusion-v1-5/stable-diffusion-v1-5", "sd1"),
    ("StableDiffusionPipeline", "stabilityai/sd-turbo", "sd-turbo"),
    ("StableDiffusionXLPipeline", "stabilityai/stable-diffusion-xl-base-1.0", "sdxl"),
    ("StableDiffusionXLPipeline", "stabilityai/sdxl-turbo", "sdxl-turbo"),
    ("StableDiffusion3Pipeline", "stabilityai/stable-diffusion-3.5-medium", "sd3"),
    ("FluxPipeline", "black-forest-labs/FLUX.1-schnell", "flux"),
])
def test_family_from_class_name(class_name, model, family):
    assert family_from_class_name(class_name, model) == family


def test_unsupported_pipeline_is_named():
    with pytest.raises(ModelLoadError, match="KandinskyPipeline"):
        family_from_class_name("KandinskyPipeline", "kandinsky-community/kandinsky-2-1")


def test_local_model_identity_changes_with_the_files(tmp_path):
    (tmp_path / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "weights.bin").write_bytes(b"0" * 10)
    before = devices.model_identity(str(tmp_path))
    assert before == devices.model_identity(str(tmp_path))
    (tmp_path / "unet" / "weights.bin").write_bytes(b"0" * 11)
    assert devices.model_identity(str(tmp_path)) != before
    assert devices.model_identity("org/model", revision="v2") == "org/model@v2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert devices.model_identity("org/model", commit=commit) == f"org/model@{commit}"
    assert devices.hub_commit_from_path(f"/c/models--org--model/snapshots/{commit}") == commit


# --- load errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    ModelSpec("diffusers", "gaplens-test/no-such-model"),
    ModelSpec("diffusers", "/nonexistent/gaplens/tiny-sd"),
    ModelSpec("hf_clip", "gaplens-test/no-such-clip"),
    ModelSpec("hf_clip", "./nonexistent-gaplens-clip"),
    ModelSpec("open_clip", "No-Such-ViT"),
    ModelSpec("open_clip", "ViT-B-32", {"pretrained": "/nonexistent/gaplens.pt"}),
    ModelSpec("hf_chat", "gaplens-test/no-such-llm"),
    ModelSpec("blip_vqa", "/nonexistent/gaplens-blip"),
    ModelSpec("vlm", "gaplens-test/no-such-vlm"),
], ids=lambda s: f"{s.backend}:{s.model}")
def test_unknown_model_fails_naming_it(spec):
    # how fast it fails (no network wait under HF_HUB_OFFLINE): bench/metric_speed.py
    with pytest.raises(ModelLoadError) as info:
        load_backend(spec)
    assert spec.model in str(info.value) or spec.options.get("pretrained", "") in str(info.value)


def test_wrong_kind_of_model_is_refused(tiny, tmp_path):
    with pytest.raises(ModelLoadError, match="without model_index.json"):
        load_backend(ModelSpec("diffusers", str(tmp_path)))
    # transformers would fill the missing weights with noise and load "successfully"
    with pytest.raises(ModelLoadError, match="not a complete BLIP question-answering checkpoint"):
        load_backend(ModelSpec("blip_vqa", tiny["blip_vqa"].options["caption_model"]))
    with pytest.raises(ModelLoadError, match="not a CLIP-like dual encoder"):
        load_backend(ModelSpec("hf_clip", tiny["chat_llm"].model))


# --- embedders -----------------------------------------------------------------------------------

@pytest.mark.parametrize("which, dim", [("open_clip_embedder", 64), ("hf_clip_embedder", 32)])
def test_embeddings_normalised_float32(which, dim, images, request):
    embedder = request.getfixturevalue(which)
    assert isinstance(embedder, Embedder) and embedder.dim == dim and embedder.memory_bytes() > 0
    img = embedder.embed_images(images)
    txt = embedder.embed_texts([PROMPT, "a photo of a nurse", "x " * 200])
    assert img.shape == (len(images), dim) and txt.shape == (3, dim)
    # a text is cut at the 77-token context: words past it change nothing, words before it do
    assert np.allclose(embedder.embed_texts(["x " * 200 + "in a hospital"]), txt[2:], atol=1e-6)
    assert not np.allclose(embedder.embed_texts(["x " * 70 + "in a hospital"]), embedder.embed_texts(["x " * 70]),
                           atol=1e-3)
    assert img.dtype == np.float32 and txt.dtype == np.float32
    assert np.allclose(np.linalg.norm(img, axis=1), 1, atol=1e-5)
    assert np.allclose(np.linalg.norm(txt, axis=1), 1, atol=1e-5)
    assert np.allclose(embedder.embed_images(images[:2]), img[:2], atol=1e-5)   # batch-independent
    assert embedder.embed_images([]).shape == (0, dim) and embedder.embed_texts([]).shape == (0, dim)


def test_siglip_texts_padded_to_full_length(tiny, images):
    siglip = load_backend(tiny["siglip"])
    assert siglip.dim == 32 and siglip.embed_images(images).shape == (len(images), 32)
    alone = siglip.embed_texts([PROMPT])
    with_longer = siglip.embed_texts([PROMPT, "a portrait of a nurse in a busy hospital at night, photorealistic"])
    assert np.allclose(alone[0], with_longer[0], atol=1e-5)          # padding="max_length": batch-independent


def test_embedder_ids_name_the_weights(open_clip_embedder, hf_clip_embedder, tiny):
    assert open_clip_embedder.id.startswith(f"open_clip:{tiny_models.TINY_OPEN_CLIP_NAME}@tiny-open-clip.pt-")
    assert hf_clip_embedder.id.startswith(f"hf_clip:{tiny['hf_clip'].model}@local-")


def test_embedder_batches(tiny, images, open_clip_embedder):
    small = load_backend(ModelSpec("open_clip", tiny["open_clip"].model, dict(tiny["open_clip"].options, batch_size=2)))
    assert np.allclose(small.embed_images(images), open_clip_embedder.embed_images(images), atol=1e-5)


# --- chat LLM ------------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "List the bias axes of: a photo of a doctor"}]


def test_chat_reply_and_seeds(chat_llm):
    assert isinstance(chat_llm, TextGenerator) and chat_llm.memory_bytes() > 0
    reply = chat_llm.chat(MESSAGES, temperature=1.0, max_tokens=16, seed=3)
    assert isinstance(reply, str)
    assert chat_llm.chat(MESSAGES, temperature=1.0, max_tokens=16, seed=3) == reply
    others = {chat_llm.chat(MESSAGES, temperature=1.0, max_tokens=16, seed=s) for s in (4, 5, 6)}
    assert len(others | {reply}) > 1
    greedy = {chat_llm.chat(MESSAGES, temperature=0, max_tokens=8, seed=s) for s in (1, 2)}
    assert len(greedy) == 1


def test_chat_template_and_fallback(chat_llm, tiny, tmp_path):
    assert chat_llm.format(MESSAGES).endswith("<|im_start|>assistant\n")
    bare = load_backend(tiny_models.build_tiny_chat_llm(tmp_path, name="no-template", chat_template=False))
    assert bare.uses_fallback_template
    assert bare.format(MESSAGES) == ("system: You are a helpful assistant.\n"
                                     "user: List the bias axes of: a photo of a doctor\nassistant:")
    assert isinstance(bare.chat(MESSAGES, max_tokens=4), str)


def test_chat_prompt_longer_than_context_keeps_its_end(chat_llm, monkeypatch, caplog):
    long = [{"role": "user", "content": "a photo of a doctor " * 300}]
    full = chat_llm.tokenizer(chat_llm.format(long), add_special_tokens=chat_llm.uses_fallback_template)["input_ids"]
    context = chat_llm.context_length
    assert len(full) > context
    given, generate = [], chat_llm.model.generate
    monkeypatch.setattr(chat_llm.model, "generate", lambda **kw: given.append(kw["input_ids"]) or generate(**kw))
    with caplog.at_level(logging.WARNING, logger="engine.backends.chat_llm"):
        assert isinstance(chat_llm.chat(long, max_tokens=8, seed=1), str)
    keep = max(context - 8, context // 2)        # the newest tokens, room left for the 8 new ones
    assert given[0][0].tolist() == full[-keep:]
    assert f"exceeds the context of {context}; keeping the last {keep}" in caplog.text


# --- OpenAI-compatible HTTP ----------------------------------------------------------------------

class _CannedHandler(BaseHTTPRequestHandler):
    requests: list = []

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.requests.append(("GET", self.path, dict(self.headers), None))
        if self.path == "/ok/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "canned-model"}, {"id": "other"}]})
        self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(("POST", self.path, dict(self.headers), body))
        mode = self.path.split("/")[1]
        if mode == "fail":
            return self._send(500, {"error": {"message": "the GPU caught fire"}})
        if mode == "auth":
            return self._send(401, {"error": {"message": "Incorrect API key provided"}})
        if mode == "empty":
            return self._send(200, {"choices": []})
        content = f'["reply for seed {body.get("seed")}", "{body["model"]}"]'
        self._send(200, {"id": "x", "object": "chat.completion",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


@pytest.fixture(scope="module")
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CannedHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def requests_seen():
    _CannedHandler.requests.clear()
    return _CannedHandler.requests


def test_openai_backend_round_trip(http_server, requests_seen, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("GAPLENS_LLM_API_KEY", raising=False)
    llm = load_backend(ModelSpec("openai", f"{http_server}/ok", {"api_key": "sk-test"}))
    assert isinstance(llm, TextGenerator)
    assert llm.model_name == "canned-model" and llm.id == f"openai:canned-model@{http_server}/ok/v1"
    reply = llm.chat(MESSAGES, temperature=0.3, max_tokens=50, seed=9)
    assert reply == '["reply for seed 9", "canned-model"]'
    method, path, headers, body = requests_seen[-1]
    assert (method, path) == ("POST", "/ok/v1/chat/completions")
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["messages"] == MESSAGES and body["seed"] == 9 and body["max_tokens"] == 50
    assert body["temperature"] == 0.3 and body["model"] == "canned-model"


def test_openai_url_and_key_from_environment(http_server, requests_seen, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", f"{http_server}/ok/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("GAPLENS_LLM_API_KEY", "sk-gaplens")
    llm = load_backend(ModelSpec("openai", "gpt-test"))
    assert llm.chat(MESSAGES, seed=1) == '["reply for seed 1", "gpt-test"]'
    assert requests_seen[-1][2]["Authorization"] == "Bearer sk-gaplens"


def test_openai_http_errors_are_clear(http_server, requests_seen):
    failing = load_backend(ModelSpec("openai", "m", {"base_url": f"{http_server}/fail", "max_retries": 1,
                                                     "retry_wait": 0}))
    with pytest.raises(ModelLoadError, match="HTTP 500 for model 'm': the GPU caught fire"):
        failing.chat(MESSAGES)
    assert len(requests_seen) == 2                                   # one retry on a server error
    requests_seen.clear()
    unauthorised = load_backend(ModelSpec("openai", "m", {"base_url": f"{http_server}/auth", "retry_wait": 0}))
    with pytest.raises(ModelLoadError, match="HTTP 401.*Incorrect API key.*OPENAI_API_KEY"):
        unauthorised.chat(MESSAGES)
    assert len(requests_seen) == 1                                   # no retry on a client error
    empty = load_backend(ModelSpec("openai", "m", {"base_url": f"{http_server}/empty"}))
    with pytest.raises(LLMOutputError, match="returned no message"):
        empty.chat(MESSAGES)


def test_openai_connection_refused(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                                    # closed again: nothing listens there
    llm = load_backend(ModelSpec("openai", "m", {"base_url": f"http://127.0.0.1:{port}", "max_retries": 0}))
    with pytest.raises(ModelLoadError, match=f"cannot connect to LLM server http://127.0.0.1:{port}/v1"):
        llm.chat(MESSAGES)
    with pytest.raises(ModelLoadError, match="cannot connect"):
        load_backend(ModelSpec("openai", f"http://127.0.0.1:{port}", {"max_retries": 0}))   # lists models at load


# --- VQA -----------------------------------------------------------------------------------------

QUESTION = "What is the gender (male, female, other) of the person in the image?"


def test_blip_vqa_answers_and_captions(blip, images):
    assert isinstance(blip, VQA) and "|caption:" in blip.id and blip.memory_bytes() > 0
    answers = blip.answer(images, QUESTION)
    assert len(answers) == len(images) and all(isinstance(a, str) for a in answers)
    chosen = blip.answer(images, QUESTION, choices=["Male", "Female"])
    assert len(chosen) == len(images) and set(chosen) <= {"male", "female", "other"}
    captions = blip.caption(images)
    assert len(captions) == len(images) and all(isinstance(c, str) for c in captions)


def test_blip_without_captioner_answers_a_question(tiny, images):
    spec = tiny["blip_vqa"]
    plain = load_backend(ModelSpec("blip_vqa", spec.model, {"batch_size": 2}))
    assert "|caption:" not in plain.id
    assert plain.caption(images[:3]) == plain.answer(images[:3], "what is in the image?")


def test_vlm_answers_with_prefix(tiny, images):
    vlm = load_backend(tiny["vlm"])
    assert isinstance(vlm, VQA) and vlm.id.endswith("+prefix:[vqa]")
    answers = vlm.answer(images, QUESTION)
    assert len(answers) == len(images) and all(isinstance(a, str) for a in answers)
    assert vlm.answer(images[:2], QUESTION) == answers[:2]                       # greedy: deterministic
    assert set(vlm.answer(images, QUESTION, ["male", "female"])) <= {"male", "female", "other"}
    assert len(vlm.caption(images)) == len(images)


def test_clip_vqa_over_choices(open_clip_embedder, images, tiny):
    vqa = load_backend(ModelSpec("clip_vqa", ""), embedder=open_clip_embedder)
    assert isinstance(vqa, VQA) and vqa.id == f"clip_vqa:{open_clip_embedder.id}"
    assert vqa.memory_bytes() == 0                                   # the shared embedder is counted once, by itself
    chosen = vqa.answer(images, QUESTION, ["Male", "Female", "Other"])
    assert len(chosen) == len(images) and set(chosen) <= {"male", "female", "other"}
    assert vqa.answer(images, QUESTION, ["Male", "Female", "Other"]) == chosen
    assert set(vqa.answer(images, "What is the setting?")) <= {v.lower() for v in vqa.vocabulary}
    assert all(c.startswith("a photo of ") for c in vqa.caption(images))
    own = load_backend(ModelSpec("clip_vqa", tiny["hf_clip"].model, {"embedder_backend": "hf_clip",
                                                                      "templates": ["{}"]}))
    assert own.id.startswith("clip_vqa:hf_clip:") and len(own.answer(images, "q?", ["a", "b"])) == len(images)
    assert own.memory_bytes() > 0


class _ColourEmbedder:
    """Images -> their mean colour; texts -> the colour they name. Lets the argmax be checked."""

    id = "colour"
    COLOURS = {"red": [1, 0, 0], "green": [0, 1, 0], "blue": [0, 0, 1]}

    def embed_images(self, images):
        means = np.array([np.asarray(img.convert("RGB"), dtype=np.float32).mean(axis=(0, 1)) for img in images])
        return means / np.linalg.norm(means, axis=1, keepdims=True)

    def embed_texts(self, texts):
        rows = [next((v for k, v in self.COLOURS.items() if k in t.lower()), [1, 1, 1]) for t in texts]
        rows = np.array(rows, dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_clip_vqa_picks_the_best_choice():
    vqa = ClipVQA(_ColourEmbedder())
    imgs = [Image.new("RGB", (8, 8), c) for c in ((250, 10, 10), (10, 10, 240), (20, 230, 20))]
    assert vqa.answer(imgs, "What colour is the image?", ["Green", "Red", "Blue"]) == ["red", "blue", "green"]


@pytest.mark.parametrize("answer, choices, expected", [
    ("female", ["male", "female"], "female"),
    ("Male.", ["male", "female"], "male"),
    ("a young woman", ["male", "female"], "female"),
    ("boy", ["male", "female"], "male"),
    ("boy", ["young", "middle", "old"], "young"),
    ("middle-aged", ["young", "middle", "old"], "middle"),
    ("elderly", ["young", "middle", "old"], "old"),
    ("35", ["young", "middle", "old"], "middle"),
    ("20 years old", ["young", "middle", "old"], "young"),
    ("doctors", ["doctor", "nurse"], "doctor"),
    ("a robot", ["male", "female"], "other"),
    ("", ["male", "female"], "other"),
])
def test_match_choice(answer, choices, expected):
    assert match_choice(answer, choices) == expected


def test_match_choice_custom_synonyms():
    assert match_choice("crimson", ["Red", "Blue"], {"red": ["crimson"]}) == "red"


# --- device helpers ------------------------------------------------------------------------------

def test_device_helpers():
    import torch

    assert devices.pick_device("cpu") == "cpu" and devices.pick_device("auto") in ("cpu", "cuda", "mps")
    assert devices.default_dtype("cpu") == torch.float32
    assert devices.default_dtype("cuda") == torch.float16
    assert devices.default_dtype("cpu", override="bf16") == torch.bfloat16
    assert devices.parse_dtype("fp16") == torch.float16
    with pytest.raises(ValueError):
        devices.parse_dtype("int3")
    assert devices.is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert devices.is_oom(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not devices.is_oom(RuntimeError("shape mismatch"))
    assert devices.memory_info("cpu") is None
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            devices.pick_device("cuda")
