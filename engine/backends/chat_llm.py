"""Text generators (LLMs) behind the TextGenerator protocol: backends "hf_chat" and "openai".

"hf_chat": `spec.model` is a transformers causal-LM hub id or local directory (AutoTokenizer +
AutoModelForCausalLM). Messages are formatted with the tokenizer's chat template and
`add_generation_prompt=True`. A tokenizer without a chat template gets FALLBACK_TEMPLATE:
one "role: content" line per message, then "assistant:". temperature 0 means greedy decoding;
otherwise sampling with temperature and top_p, seeded so that the same seed gives the same
reply. Every decoding setting is passed explicitly (base.decoding_settings: no top-k, no repetition
penalty) and the model's own generation_config keeps only its token ids, so a checkpoint's defaults
(Qwen2.5: top_k=20, top_p=0.8, repetition_penalty=1.1) never change a reply unseen;
`generation_settings` says what a call uses and the engine stores it with each cached reply.
Options: revision, dtype, top_p (default 1.0), device_map (e.g. "auto" for models larger
than one GPU, needs accelerate), token, cache_dir.

"openai": any OpenAI-compatible server, POST {base_url}/v1/chat/completions through httpx.
  - `spec.model` is either the server URL (then option `model_name` names the model, or the
    first model listed by GET /v1/models is used) or the model name (then the URL comes from
    option `base_url`, else env OPENAI_BASE_URL, else https://api.openai.com/v1).
  - API key: option `api_key`, else env GAPLENS_LLM_API_KEY, else env OPENAI_API_KEY (none is
    fine for local servers).
  - Options: timeout (s, default 120), max_retries (on 429/5xx/connection errors, default 2),
    concurrency (requests a method's independent calls may have in flight at once, default 8: a
    vLLM server batches them continuously; engine.core.evaluators.llm_map),
    retry_wait (s, doubled per retry, default 1.0), top_p, extra_body (dict merged into the request),
    max_tokens_key ("max_tokens", or "max_completion_tokens" for OpenAI reasoning models).
  - `seed` is sent with every request; servers that honour it reply reproducibly.
Failures raise ModelLoadError (unreachable server, HTTP status, with the server's message)
or LLMOutputError (a 200 reply without a message).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Sequence

from ..common.errors import LLMOutputError, ModelLoadError
from . import device as devices
from .base import ModelSpec, clear_generation_defaults, decoding_settings

logger = logging.getLogger(__name__)

FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_CONCURRENCY = 8   # an OpenAI-compatible server's requests in flight at once (option concurrency)


def _merge_system_into_user(messages: list[dict]) -> list[dict]:
    """Some chat templates (Gemma, Mistral v1) reject a system role: prepend it to the first user turn."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    elif system:
        rest.insert(0, {"role": "user", "content": system})
    return rest


class HFChatLLM:
    """A transformers causal LM behind the TextGenerator protocol."""

    def __init__(self, model, tokenizer, *, model_id: str, device: str, top_p: float = 1.0):
        self.model = model
        self.tokenizer = tokenizer
        self.id = model_id
        self.device = device
        self.top_p = top_p
        self.uses_fallback_template = not getattr(tokenizer, "chat_template", None)
        config = model.config
        self.context_length = int(getattr(config, "max_position_embeddings", None)
                                  or getattr(config, "n_positions", None) or 4096)

    def memory_bytes(self) -> int:
        """Returns the bytes of the model's weights."""
        return devices.module_bytes(self.model)

    def format(self, messages: Sequence[dict]) -> str:
        """Returns the prompt text the model sees for `messages` (chat template + generation prompt)."""
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        template = FALLBACK_TEMPLATE if self.uses_fallback_template else None
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as exc:  # jinja raises TemplateError from the template's own raise_exception
            if not any(m["role"] == "system" for m in messages):
                raise
            logger.info("%s: chat template rejected the system role (%s); merged it into the first user turn",
                        self.id, exc)
            return self.tokenizer.apply_chat_template(_merge_system_into_user(messages), chat_template=template,
                                                      tokenize=False, add_generation_prompt=True)

    def generation_settings(self, temperature: float, top_p: float | None = None) -> dict:
        """Returns the decoding settings a `chat` call with this temperature passes to generate()."""
        return decoding_settings(temperature, top_p if top_p is not None else self.top_p)

    def move_to(self, device: str) -> bool:
        """Moves the weights to `device` ("cpu" parks them in host RAM); False for a device_map model."""
        if getattr(self.model, "hf_device_map", None):
            return False
        self.model.to(device)
        self.device = device
        return True

    def chat(self, messages: Sequence[dict], *, temperature: float = 1.0, max_tokens: int = 1024,
             seed: int = 0, top_p: float | None = None) -> str:
        """Returns the assistant's reply (special tokens removed, whitespace stripped).

        temperature <= 0 decodes greedily; otherwise samples with the given seed."""
        import torch

        prompt = self.format(messages)
        inputs = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=self.uses_fallback_template)
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        max_new_tokens = int(max_tokens)
        if input_ids.shape[1] + max_new_tokens > self.context_length:
            # Keep the end of the conversation (the newest turn and the generation prompt).
            keep = max(self.context_length - max_new_tokens, self.context_length // 2)
            logger.warning("%s: prompt of %d tokens + %d new exceeds the context of %d; keeping the last %d",
                           self.id, input_ids.shape[1], max_new_tokens, self.context_length, keep)
            input_ids, attention_mask = input_ids[:, -keep:], attention_mask[:, -keep:]
            max_new_tokens = min(max_new_tokens, self.context_length - input_ids.shape[1])
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        sampling = self.generation_settings(temperature, top_p)
        device = self.model.device
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda_devices), torch.inference_mode():
            torch.manual_seed(int(seed))
            output = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens, pad_token_id=pad_id, **sampling)
        new_tokens = output[0, input_ids.shape[1]:]
        return self.tokenizer.decode(new_tokens, skip_special_tokens=True).strip()


class OpenAIChat:
    """An OpenAI-compatible chat completions endpoint behind the TextGenerator protocol."""

    thread_safe = True   # one httpx client: a method's independent calls may overlap (llm_map)

    def __init__(self, base_url: str, model_name: str, *, api_key: str | None = None, timeout: float = 120.0,
                 max_retries: int = 2, retry_wait: float = 1.0, top_p: float | None = None,
                 extra_body: dict | None = None, max_tokens_key: str = "max_tokens"):
        import httpx

        self.base_url = base_url
        self.model_name = model_name
        self.id = f"openai:{model_name}@{base_url}"
        self.max_retries = max_retries
        self.retry_wait = retry_wait
        self.top_p = top_p
        self.extra_body = dict(extra_body or {})
        self.max_tokens_key = max_tokens_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def generation_settings(self, temperature: float, top_p: float | None = None) -> dict:
        """Returns the sampling fields a `chat` call sends (the server may add its own defaults)."""
        top_p = top_p if top_p is not None else self.top_p
        return {"temperature": float(temperature), **({"top_p": float(top_p)} if top_p is not None else {}),
                **self.extra_body}

    def chat(self, messages: Sequence[dict], *, temperature: float = 1.0, max_tokens: int = 1024,
             seed: int = 0, top_p: float | None = None) -> str:
        """Returns the first choice's message content.

        Raises ModelLoadError when the server cannot be reached or answers with an error
        status, LLMOutputError when a 200 reply carries no message."""
        body = {"model": self.model_name, "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                "temperature": float(temperature), self.max_tokens_key: int(max_tokens), "seed": int(seed)}
        if (top_p if top_p is not None else self.top_p) is not None:
            body["top_p"] = float(top_p if top_p is not None else self.top_p)
        body.update(self.extra_body)
        data = self._request("POST", "/chat/completions", json=body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMOutputError(f"{self.id} returned no message: {str(data)[:200]}") from exc
        return (content or "").strip()

    def list_models(self) -> list[str]:
        """Returns the model ids the server lists at GET /v1/models."""
        data = self._request("GET", "/models")
        return [m["id"] for m in data.get("data", []) if "id" in m]

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kwargs) -> dict:
        import httpx

        url = self.base_url + path
        attempt = 0
        while True:
            try:
                response = self._client.request(method, url, **kwargs)
            except httpx.TimeoutException as exc:
                error = ModelLoadError(f"LLM server {self.base_url} did not answer within "
                                       f"{self._client.timeout.read} s ({type(exc).__name__}); "
                                       f"raise option timeout or check the server")
            except httpx.TransportError as exc:
                error = ModelLoadError(f"cannot connect to LLM server {self.base_url}: {type(exc).__name__}: {exc}. "
                                       f"Is it running, and is the URL right (option base_url / OPENAI_BASE_URL)?")
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise LLMOutputError(f"{self.id} replied with non-JSON: {response.text[:200]!r}") from exc
                error = ModelLoadError(self._status_message(response))
                if response.status_code not in (408, 409, 429) and response.status_code < 500:
                    raise error
            if attempt >= self.max_retries:
                raise error
            wait = self.retry_wait * 2 ** attempt
            logger.warning("%s: %s; retrying in %.1f s", self.id, error, wait)
            time.sleep(wait)
            attempt += 1

    def _status_message(self, response) -> str:
        detail = response.text[:300]
        try:
            error = response.json().get("error")
            detail = error.get("message", detail) if isinstance(error, dict) else (error or detail)
        except (ValueError, AttributeError):
            pass
        hint = {401: " Check the API key (option api_key, GAPLENS_LLM_API_KEY or OPENAI_API_KEY).",
                403: " The key is not allowed to use this model.",
                404: f" Check the URL and the model name ('{self.model_name}').",
                429: " Rate limited or out of quota."}.get(response.status_code, "")
        return (f"LLM server {self.base_url} answered HTTP {response.status_code} "
                f"for model '{self.model_name}': {detail}.{hint}")


def _normalise_base_url(url: str) -> str:
    """Returns the URL ending in /v1 (both "http://host:8000" and "http://host:8000/v1/" are accepted)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _load_openai(spec: ModelSpec) -> OpenAIChat:
    options = spec.options
    if spec.model.startswith(("http://", "https://")):
        base_url, model_name = spec.model, options.get("model_name")
    else:
        base_url = options.get("base_url") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_URL
        model_name = options.get("model_name") or spec.model
    api_key = options.get("api_key") or os.environ.get("GAPLENS_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    llm = OpenAIChat(_normalise_base_url(base_url), model_name or "", api_key=api_key,
                     timeout=float(options.get("timeout", 120.0)), max_retries=int(options.get("max_retries", 2)),
                     retry_wait=float(options.get("retry_wait", 1.0)), top_p=options.get("top_p"),
                     extra_body=options.get("extra_body"),
                     max_tokens_key=options.get("max_tokens_key", "max_tokens"))
    if not model_name:
        names = llm.list_models()
        if not names:
            raise ModelLoadError(f"LLM server {llm.base_url} lists no models; pass option model_name")
        llm.model_name = names[0]
        llm.id = f"openai:{names[0]}@{llm.base_url}"
    return llm


def _load_hf_chat(spec: ModelSpec, device: str) -> HFChatLLM:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = spec.options
    if devices.looks_like_local_path(spec.model) and not Path(spec.model).expanduser().exists():
        raise ModelLoadError(f"no such model directory: '{spec.model}'")
    hub = {k: options[k] for k in ("revision", "token", "cache_dir") if options.get(k)}
    dtype = devices.default_dtype(device, prefer_bf16=True, override=options.get("dtype"))
    tokenizer = AutoTokenizer.from_pretrained(spec.model, **hub)
    placement = {"device_map": options["device_map"]} if options.get("device_map") else {}
    model, info = AutoModelForCausalLM.from_pretrained(spec.model, dtype=dtype, output_loading_info=True,
                                                       **placement, **hub)
    devices.require_complete_weights(spec.model, info, "causal language model")
    dropped = clear_generation_defaults(model)
    if dropped:
        logger.info("%s: decoding ignores the checkpoint's generation_config %s (every setting is passed "
                    "explicitly)", spec.model, dropped)
    if not placement:
        model = model.to(device)
    model.eval()
    commit = devices.hub_commit(spec.model, revision=options.get("revision"), cache_dir=options.get("cache_dir"))
    model_id = f"hf_chat:{devices.model_identity(spec.model, revision=options.get('revision'), commit=commit)}"
    llm = HFChatLLM(model, tokenizer, model_id=model_id, device=device, top_p=float(options.get("top_p", 1.0)))
    if llm.uses_fallback_template:
        logger.warning("%s has no chat template; using the plain 'role: content' fallback", spec.model)
    return llm


def load(spec: ModelSpec, device: str, **context):
    """Loads a chat LLM: "hf_chat" onto `device`, or an "openai" HTTP client (device unused).
    Returns an HFChatLLM or OpenAIChat."""
    if spec.backend == "hf_chat":
        return _load_hf_chat(spec, device)
    if spec.backend == "openai":
        return _load_openai(spec)
    raise ModelLoadError(f"chat_llm cannot load backend '{spec.backend}' ('{spec.model}')")
