"""VQA through an OpenAI-compatible vision chat server (backend "openai_vqa", `--vqa openai:BASE_URL`):
a vLLM-served Qwen2.5-VL, GPT-4o, llama.cpp with a vision model, ...

Each image is one POST {base_url}/chat/completions with a user message of two content parts,
the question as text and the image as a PNG data URL (`{"type": "image_url", "image_url":
{"url": "data:image/png;base64,..."}}`), temperature 0. With answer choices the question ends
"Answer with exactly one of: a, b, c." and the reply is mapped onto them with
`vqa.match_choice` ("other" when it names none); without, the reply's first line is the answer.

- `spec.model` is the server URL (then option `model`, else the first model GET /models lists,
  remembered per server in the data dir)
  or a model name (then option base_url, env OPENAI_BASE_URL, else https://api.openai.com/v1).
- key: env GAPLENS_VQA_API_KEY, else OPENAI_API_KEY.
- options: model, max_tokens (20), concurrency (4), timeout (120 s), max_retries (4),
  retry_wait, max_retry_wait, caption_prompt, detail ("low" | "high" | "auto": sent with the image).
Retries and messages as every API backend (engine.backends.http_api); a refused question
answers "refused".
"""
from __future__ import annotations

import base64
import io
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from PIL import Image

from .base import ModelSpec, with_options
from .http_api import ApiReplyError, Refused, Retrier, api_key, httpx_attempt, listed_models, remembered_model

VQA_KEYS = ("GAPLENS_VQA_API_KEY", "OPENAI_API_KEY")
CAPTION_PROMPT = "Describe the image in one short sentence."
TRANSPORT = {"model", "base_url", "concurrency", "timeout", "max_retries", "retry_wait", "max_retry_wait"}


def data_url(image: Image.Image) -> str:
    """Returns the image as a PNG data URL."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class OpenAIVisionVQA:
    """A vision-language chat model behind the VQA protocol."""

    options_in_id = True

    def __init__(self, base_url: str, options: dict, data_dir: str | None = None):
        import httpx

        self.base_url = base_url
        self.options = dict(options)
        self.timeout = float(options.get("timeout", 120.0))
        self.batch_size = max(1, int(options.get("concurrency", 4)))
        self.retrier = Retrier(f"vision chat server {base_url}", max_retries=int(options.get("max_retries", 4)),
                               retry_wait=float(options.get("retry_wait", 1.0)),
                               max_retry_wait=float(options.get("max_retry_wait", 60.0)), key_names=VQA_KEYS)
        key = api_key(*VQA_KEYS)
        self._client = httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {key}"} if key else {})
        self.model_name = options.get("model") or remembered_model(data_dir, base_url, self._list_models,
                                                                   lambda names: names[0])
        self.id = with_options(f"openai_vqa:{self.model_name}@{base_url}",
                               {k: v for k, v in options.items() if k not in TRANSPORT})
        self.calls = 0

    def _list_models(self) -> list[str]:
        return listed_models(self.retrier, self._client, self.base_url, self.timeout)

    def ask(self, image: Image.Image, text: str) -> str:
        """Returns the model's reply (stripped) to `text` about one image; "refused" when declined."""
        part = {"url": data_url(image)}
        if self.options.get("detail"):
            part["detail"] = self.options["detail"]
        body = {"model": self.model_name, "temperature": 0, "max_tokens": int(self.options.get("max_tokens", 20)),
                "messages": [{"role": "user", "content": [{"type": "text", "text": text},
                                                          {"type": "image_url", "image_url": part}]}]}
        self.calls += 1
        try:
            _, _, raw, data = self.retrier.run(lambda: httpx_attempt(self._client, "POST", self.base_url + "/chat/completions", json=body),
                                               f"'{text[:60]}'", self.timeout)
        except Refused:
            return "refused"
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ApiReplyError(f"vision chat server {self.base_url} replied without choices[0].message: "
                                f"{raw[:200]!r}") from None
        if isinstance(content, list):  # some servers answer in content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content or "").strip()

    def _many(self, images: Sequence[Image.Image], text: str) -> list[str]:
        with ThreadPoolExecutor(max_workers=min(self.batch_size, max(1, len(images)))) as pool:
            return list(pool.map(lambda im: self.ask(im, text), images))

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns one short answer per image; with `choices`, one of them (lower-case) or "other"."""
        from .vqa import match_choice

        if not choices:
            return [(r.splitlines() or [""])[0].rstrip(".").strip() for r in self._many(images, question)]
        text = f"{question} Answer with exactly one of: {', '.join(choices)}."
        return [match_choice(r, choices) for r in self._many(images, text)]

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns one short caption per image (the reply to option caption_prompt)."""
        return self._many(images, self.options.get("caption_prompt", CAPTION_PROMPT))

    def close(self) -> None:
        self._client.close()


def load(spec: ModelSpec, device: str, **context) -> OpenAIVisionVQA:
    """Returns an OpenAIVisionVQA client (device unused)."""
    options = dict(spec.options)
    if spec.model.startswith(("http://", "https://")):
        base_url = spec.model
    else:
        base_url = options.get("base_url") or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        options.setdefault("model", spec.model)
    base_url = base_url.rstrip("/")
    return OpenAIVisionVQA(base_url if base_url.endswith("/v1") else base_url + "/v1", options, context.get("data_dir"))
