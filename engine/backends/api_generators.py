"""Image generators behind an HTTP API (backends "openai_images" and "hf_inference").

Neither is seedable: the engine keys an image by prompt + index + settings + model (the
"seed" of an API image is its index), so a second identical request is served from the store
and regenerating is not reproducible. Calls run `concurrency` at a time (the engine's batch),
each retried on 429/5xx/timeouts with backoff honouring Retry-After (engine.backends.http_api).
A content-policy refusal becomes a GeneratedImage with `refused` set (recorded, shown, never
retried, never counted as an image).

"openai_images" (`--generator openai:BASE_URL`): any OpenAI-compatible images endpoint,
POST {base_url}/images/generations with {"model", "prompt", "n": 1, "size", "response_format":
"b64_json"}; replies {"data": [{"b64_json": ...}]} (a `url` instead is fetched).
  - `spec.model` is the server URL (with or without /v1) or a model name (then the URL is
    option base_url, else env OPENAI_BASE_URL, else https://api.openai.com/v1).
  - model: option `model`, else the first image model GET {base_url}/models lists (remembered
    per server in the data dir's api_models.json, so a repeated request makes no HTTP request).
  - key: env GAPLENS_GENERATOR_API_KEY, else OPENAI_API_KEY (none is fine for local servers).
  - options: size ("1024x1024"; or the settings' width x height), response_format
    ("b64_json", left out for gpt-image models, which reject it; null to leave it out), concurrency (4), timeout
    (120 s), max_retries (4), retry_wait (1 s), max_retry_wait (60 s); any other option
    (quality, style, background, ...) is sent in the request body.
  - the images API has no negative prompt, steps or guidance: they are not sent (leave them
    at their defaults; changing them only changes the cache key).

"hf_inference" (`--generator hf-inference:MODEL_ID`): huggingface_hub's
`InferenceClient.text_to_image` through Inference Providers (option provider, default
"auto"), or a self-hosted endpoint (option base_url: POST {base_url} with {"inputs": prompt,
"parameters": {...}}, image bytes back). Key: env HF_TOKEN (or GAPLENS_GENERATOR_API_KEY).
Steps, guidance, size and negative prompt are sent when set; the image index is sent as
`seed`, which providers may or may not honour.
"""
from __future__ import annotations

import base64
import io
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from PIL import Image, UnidentifiedImageError

from ..common.errors import ModelLoadError
from .base import GeneratedImage, GenerationSettings, ModelSpec, PartialBatch, with_options
from .http_api import ApiReplyError, Refused, Retrier, api_key, httpx_attempt, listed_models, remembered_model

logger = logging.getLogger(__name__)

DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
GENERATOR_KEYS = ("GAPLENS_GENERATOR_API_KEY", "OPENAI_API_KEY")
HF_KEYS = ("HF_TOKEN", "GAPLENS_GENERATOR_API_KEY")
# options that configure the client rather than the request body
CLIENT_OPTIONS = {"model", "base_url", "size", "response_format", "concurrency", "timeout", "max_retries",
                  "retry_wait", "max_retry_wait", "provider"}


def _decode_image(data: bytes, where: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - PIL raises several types for bad bytes
        raise ApiReplyError(f"{where} sent bytes that are not an image ({type(exc).__name__}: {exc})") from None


def _size(text) -> tuple[int, int]:
    try:
        w, _, h = str(text).lower().partition("x")
        return int(w), int(h)
    except ValueError:
        raise ModelLoadError(f"option size must look like 1024x1024, not {text!r}") from None


class ApiImageGenerator:
    """What both API generators share: the protocol attributes and concurrent calls."""

    family = "api"
    source_kind = "api"
    options_in_id = True

    def __init__(self, name: str, options: dict):
        self.options = dict(options)
        self.batch_size = max(1, int(options.get("concurrency", 4)))
        self.timeout = float(options.get("timeout", 120.0))
        self.retrier = Retrier(name, max_retries=int(options.get("max_retries", 4)),
                               retry_wait=float(options.get("retry_wait", 1.0)),
                               max_retry_wait=float(options.get("max_retry_wait", 60.0)), key_names=self.key_names)
        self.width, self.height = _size(options.get("size", "1024x1024"))
        self.calls = 0   # HTTP image requests sent (tests, status)

    def defaults(self) -> GenerationSettings:
        """Size from option `size`; steps/guidance 0 mean 'the API's own'."""
        return GenerationSettings(steps=0, guidance=0.0, width=self.width, height=self.height, scheduler="api")

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        """One API call per seed (the seed is the image's index), `batch_size` at a time.
        Returns one GeneratedImage per seed; a refused prompt has `refused` set and no image.
        When a call fails after others succeeded, raises PartialBatch with the images made, so
        the engine stores them before reporting the error."""
        def one(index: int) -> GeneratedImage:
            try:
                return GeneratedImage(self._one(prompt, int(index), settings), int(index))
            except Refused as refusal:
                return GeneratedImage(None, int(index), nsfw=True, refused=refusal.message)

        with ThreadPoolExecutor(max_workers=min(self.batch_size, max(1, len(seeds)))) as pool:
            futures = [pool.submit(one, s) for s in seeds]
        done, errors = [], []
        for future in futures:
            try:
                done.append(future.result())
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the made images are handed over
                errors.append(exc)
        if errors:
            raise PartialBatch(done, errors[0]) if done else errors[0]
        return done

    def _one(self, prompt: str, index: int, settings: GenerationSettings) -> Image.Image:
        raise NotImplementedError


class OpenAIImages(ApiImageGenerator):
    """An OpenAI-compatible images endpoint behind the ImageGenerator protocol."""

    key_names = GENERATOR_KEYS

    def __init__(self, base_url: str, options: dict, data_dir: str | None = None):
        import httpx

        self.base_url = base_url
        super().__init__(f"images API {base_url}", options)
        key = api_key(*GENERATOR_KEYS)
        self._client = httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {key}"} if key else {})
        self.model_name = options.get("model") or remembered_model(
            data_dir, base_url, self._list_models,
            lambda names: next((n for n in names if "image" in n.lower() or "dall" in n.lower()), names[0]))
        extra = {k: v for k, v in options.items() if k not in CLIENT_OPTIONS}
        self.id = with_options(f"openai_images:{self.model_name}@{base_url}", extra)

    def _list_models(self) -> list[str]:
        return listed_models(self.retrier, self._client, self.base_url, self.timeout)

    def _one(self, prompt: str, index: int, settings: GenerationSettings) -> Image.Image:
        body = {"model": self.model_name, "prompt": prompt, "n": 1,
                "size": f"{settings.width or self.width}x{settings.height or self.height}"}
        # gpt-image models always answer b64_json and reject the parameter; DALL-E and others want it
        default_format = None if self.model_name.lower().startswith("gpt-image") else "b64_json"
        response_format = self.options.get("response_format", default_format)
        if response_format:
            body["response_format"] = response_format
        body.update({k: v for k, v in self.options.items() if k not in CLIENT_OPTIONS})
        self.calls += 1
        _, _, text, data = self.retrier.run(
            lambda: httpx_attempt(self._client, "POST", self.base_url + "/images/generations", json=body),
            f"'{prompt[:60]}' (image {index})", self.timeout)
        try:
            item = data["data"][0]
        except (KeyError, IndexError, TypeError):
            raise ApiReplyError(f"images API {self.base_url} replied without data[0]: {text[:200]!r}") from None
        if isinstance(item, dict) and item.get("b64_json"):
            try:
                raw = base64.b64decode(item["b64_json"], validate=True)
            except ValueError:
                raise ApiReplyError(f"images API {self.base_url} sent b64_json that is not base64") from None
            return _decode_image(raw, f"images API {self.base_url}")
        if isinstance(item, dict) and item.get("url"):
            response = self._client.get(item["url"])
            if response.status_code >= 400:
                raise ApiReplyError(f"images API {self.base_url}: the image URL answered HTTP {response.status_code}")
            return _decode_image(response.content, f"images API {self.base_url}")
        raise ApiReplyError(f"images API {self.base_url} replied with neither b64_json nor url: {text[:200]!r}")

    def close(self) -> None:
        self._client.close()


class HFInference(ApiImageGenerator):
    """huggingface_hub's InferenceClient.text_to_image behind the ImageGenerator protocol."""

    key_names = HF_KEYS

    def __init__(self, model: str, options: dict):
        from huggingface_hub import InferenceClient

        self.model_name = model
        self.base_url = options.get("base_url")
        super().__init__(f"Hugging Face inference ({self.base_url or model})", options)
        token = api_key(*HF_KEYS)
        if self.base_url:
            self._client = InferenceClient(base_url=self.base_url, token=token, timeout=self.timeout)
        else:
            self._client = InferenceClient(provider=options.get("provider") or "auto", token=token,
                                           timeout=self.timeout)
        extra = {k: v for k, v in options.items() if k not in CLIENT_OPTIONS or k in ("provider", "base_url")}
        self.id = with_options(f"hf_inference:{model}", extra)

    def _attempt(self, prompt: str, index: int, settings: GenerationSettings):
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

        kwargs = dict(seed=index, width=settings.width or None, height=settings.height or None,
                      num_inference_steps=settings.steps or None, guidance_scale=settings.guidance or None,
                      negative_prompt=settings.negative_prompt or None)
        extra = {k: v for k, v in self.options.items() if k not in CLIENT_OPTIONS}
        try:
            image = self._client.text_to_image(prompt, model=None if self.base_url else self.model_name,
                                               extra_body=extra or None, **kwargs)
        except HfHubHTTPError as exc:
            response = exc.response
            if response is None:
                raise
            try:
                data = response.json()
            except Exception:  # noqa: BLE001
                data = None
            return response.status_code, dict(response.headers), response.text, data
        except OfflineModeIsEnabled:
            raise ModelLoadError("HF_HUB_OFFLINE is set, so huggingface_hub sends no request at all (not even to "
                                 "a self-hosted base_url); unset it to use hf-inference") from None
        except UnidentifiedImageError as exc:
            raise ApiReplyError(f"{self.retrier.name} sent bytes that are not an image ({exc})") from None
        return 200, {}, "", image

    def _one(self, prompt: str, index: int, settings: GenerationSettings) -> Image.Image:
        self.calls += 1
        _, _, _, image = self.retrier.run(lambda: self._attempt(prompt, index, settings),
                                          f"'{prompt[:60]}' (image {index})", self.timeout)
        return image.convert("RGB")

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if callable(close):
            close()


def _normalise_base_url(url: str) -> str:
    """Returns the URL ending in /v1 ("http://host:8000" and "http://host:8000/v1/" both work)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def load(spec: ModelSpec, device: str, **context):
    """Returns an OpenAIImages or HFInference client (device unused; nothing is downloaded)."""
    options = dict(spec.options)
    if spec.backend == "openai_images":
        if spec.model.startswith(("http://", "https://")):
            base_url = spec.model
        else:
            import os

            base_url = options.get("base_url") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_URL
            options.setdefault("model", spec.model)
        return OpenAIImages(_normalise_base_url(base_url), options, context.get("data_dir"))
    if spec.backend == "hf_inference":
        return HFInference(spec.model, options)
    raise ModelLoadError(f"api_generators cannot load backend '{spec.backend}' ('{spec.model}')")
