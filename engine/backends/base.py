"""The four protocols every backend implements, and the small records they exchange.

Backends are plain objects; the model manager owns their lifetime. Each has an `id` that
goes into cache keys (model id + revision, or a synthetic world's table hash), so that two
different models never share a cached artefact.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

from . import adapters

# The cost model's options (engine/backends/gpu_costs.py): they change how long a synthetic call sleeps, never
# what it returns.
COST_OPTIONS = frozenset({"gpu", "seconds_per_image", "seconds_per_question", "seconds_per_caption",
                          "seconds_per_embedding", "image_share"})


@dataclass(frozen=True)
class GenerationSettings:
    """Everything besides prompt and seed that determines an image."""

    steps: int
    guidance: float
    width: int
    height: int
    negative_prompt: str = ""
    scheduler: str = "default"

    def replace(self, **changes) -> "GenerationSettings":
        from dataclasses import replace

        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass
class GeneratedImage:
    """One image from a generator call. `nsfw` is the safety checker's verdict: the image is
    kept as generated (never blacked out) and flagged so metrics can exclude it."""

    image: Image.Image | None
    seed: int
    nsfw: bool = False
    refused: str | None = None   # an API's refusal message (content policy): no image, never retried


class PartialBatch(Exception):
    """A generator call failed after some images were made (paid API calls): `outputs` holds
    those (a subset, each with its seed), `error` the failure to raise once they are stored."""

    def __init__(self, outputs: list[GeneratedImage], error: Exception):
        super().__init__(str(error))
        self.outputs = outputs
        self.error = error


@runtime_checkable
class ImageGenerator(Protocol):
    id: str               # model id (+ revision); part of every image key
    family: str           # "sd1", "sd2", "sdxl", "sdxl-turbo", "sd-turbo", "sd3", "flux", "synthetic"
    batch_size: int       # images per call that fit the device

    def defaults(self) -> GenerationSettings:
        """The family's sensible steps, guidance and size."""

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        """One batched call: one image per seed, image i depends only on (prompt, seeds[i], settings)."""


@runtime_checkable
class Embedder(Protocol):
    id: str
    # Optional: `logit_scale` and `logit_bias`, the model's image-text logits scale · cosine + bias (its learned
    # temperature; `logit_temperature` reads them, CLIP_LOGIT_SCALE and 0 when it has none).

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised."""

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised, in the same space as the images."""


@runtime_checkable
class TextGenerator(Protocol):
    id: str

    def chat(self, messages: Sequence[dict], *, temperature: float = 1.0, max_tokens: int = 1024,
             seed: int = 0) -> str:
        """The assistant's reply to an OpenAI-style message list."""


@runtime_checkable
class VQA(Protocol):
    id: str

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """One short answer per image. With `choices`, the answer is one of them (lower-case)."""

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """One short caption per image."""

    # Optional, for an evaluator that scores the classes (BLIP, VLMs, CLIP zero-shot, faces, the synthetic
    # VQA): answer_classes(images, question, choices) -> list[ClassAnswer], one per image; and, for one that
    # asks all of an image's questions at once (each image preprocessed and encoded once: BLIP, VLMs, CLIP
    # zero-shot, the synthetic VQA), answer_questions(images, asks) -> per (question, choices) of `asks`, per
    # image, a ClassAnswer (`answer_all` calls whichever it has).


def answer_all(vqa, images: Sequence[Image.Image], asks: Sequence[tuple[str, Sequence[str]]],
               **context) -> list[list[ClassAnswer]]:
    """Returns per (question, choices) of `asks`, per image, the evaluator's ClassAnswer: from one call of its
    `answer_questions` when it has one (`context`, e.g. clip_vqa's `embeddings`, is passed on), else one
    `answer_classes` call per question."""
    if callable(getattr(vqa, "answer_questions", None)):
        return vqa.answer_questions(images, list(asks), **context)
    return [vqa.answer_classes(images, question, list(choices)) for question, choices in asks]


# CLIP's trained temperature, for an embedder that states none: logit_scale is learned from ln(1/0.07) and clipped at
# ln(100), where OpenAI's and OpenCLIP's released models sit (Radford et al. 2021, §2.5); logits = 100 × cosine.
CLIP_LOGIT_SCALE = 100.0


def logit_temperature(embedder) -> tuple[float, float]:
    """Returns (scale, bias) of `embedder`'s image-text logits, scale · cosine + bias: its `logit_scale` and
    `logit_bias` (the loaded model's learned ones: SigLIP's scale is about 110-120 with a bias near -10-16),
    else CLIP_LOGIT_SCALE and 0. A softmax over choices is unchanged by the bias; a sigmoid is not."""
    return (float(getattr(embedder, "logit_scale", CLIP_LOGIT_SCALE) or CLIP_LOGIT_SCALE),
            float(getattr(embedder, "logit_bias", 0.0) or 0.0))


CANT_TELL = "can't tell"
# Below this top probability a scored answer is "can't tell" (an option: --cant-tell-below). For the two-class
# axes a calibrated answer under 0.6 is wrong at least 40% of the time, barely better than a coin; on the
# three-class axes 0.6 is nearly twice chance (1/3), so only a split answer abstains (README, issue 35).
DEFAULT_CANT_TELL_BELOW = 0.6


@dataclass(frozen=True)
class ClassAnswer:
    """An evaluator's answer within given classes: `answer` the most probable class (lower-case), or what
    it said outside them ("other", "no face found"); `probs` {class: probability} summing to 1, or None
    when it gave none; `text` its own words, when it wrote some."""

    answer: str
    probs: dict[str, float] | None = None
    text: str = ""


def class_answer(choices: Sequence[str], scores, text: str = "") -> ClassAnswer:
    """Returns the ClassAnswer of one image from a score per choice (log-likelihoods or logits): the
    softmax over the choices, and its most probable choice (lower-case; the first on a tie)."""
    values = np.asarray(scores, dtype=np.float64)
    values = np.exp(values - values.max())
    probs = values / values.sum()
    names = [str(c).lower() for c in choices]
    return ClassAnswer(names[int(np.argmax(probs))], {c: float(p) for c, p in zip(names, probs)}, text)


def label_of(answer: ClassAnswer, threshold: float) -> str:
    """Returns the answer's class, or CANT_TELL when its top probability is below `threshold`."""
    if answer.probs and max(answer.probs.values()) < threshold:
        return CANT_TELL
    return answer.answer


@dataclass(frozen=True)
class ModelSpec:
    """Names one model: which backend module loads it, the hub id or local path, options."""

    backend: str                       # e.g. "diffusers", "open_clip", "hf_clip", "hf_chat", "openai", "blip_vqa", "vlm", "clip_vqa", "synthetic"
    model: str                         # hub id, local path, or synthetic table name
    options: dict = field(default_factory=dict)

    def __hash__(self) -> int:  # options is a dict: hash its canonical JSON
        return hash((self.backend, self.model, json.dumps(self.options, sort_keys=True, default=str)))

    @property
    def label(self) -> str:
        """'backend:model', with a diffusers generator's adapters as they are typed ('+lora=REPO@0.8')."""
        return f"{self.backend}:{self.model}" + adapters.suffix(self.options)

    @property
    def full_label(self) -> str:
        """The label with its other options, 'backend:model [k=v, ...]' (runs record it)."""
        rest = {k: v for k, v in self.options.items() if k not in adapters.KEYS}
        return self.label + (f" [{options_text(rest)}]" if rest else "")


# Options that change how a backend is reached, never what it answers: left out of its identity.
TRANSPORT_OPTIONS = frozenset({"timeout", "max_retries", "retry_wait", "max_retry_wait", "concurrency",
                               "batch_size", "cache_dir", "enable_cpu_offload", "device_map"}) | COST_OPTIONS


def options_text(options: dict) -> str:
    """Returns 'k=v, k2=v2' (sorted) for display."""
    return ", ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(options.items()))


def with_options(backend_id: str, options: dict) -> str:
    """Returns the backend id with its identity options appended ('id?k=v&k2=v2'), so two
    option sets never share a cached artefact; transport options (timeouts, batch sizes) and
    options the id already names (`k=v` inside it) are left out."""
    parts = [f"{k}={json.dumps(v, sort_keys=True) if not isinstance(v, str) else v}"
             for k, v in sorted(options.items()) if k not in TRANSPORT_OPTIONS]
    parts = [p for p in parts if p not in backend_id]
    return f"{backend_id}?{'&'.join(parts)}" if parts else backend_id


# The token ids a model's generation_config may keep: everything else in it (Qwen2.5's top_k=20,
# top_p=0.8, temperature=0.7, repetition_penalty=1.1, ...) would silently change how GapLens decodes.
GENERATION_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def decoding_settings(temperature: float = 0.0, top_p: float = 1.0) -> dict:
    """Returns every decoding setting `generate()` gets, so none is inherited from the model's
    generation_config: greedy for temperature <= 0 (no repetition penalty, one beam); otherwise
    plain sampling at `temperature` with nucleus `top_p` (1.0 = off) and no top-k cut-off."""
    if temperature <= 0:
        return {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
    return {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0,
            "typical_p": 1.0, "num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}


def clear_generation_defaults(model) -> dict:
    """Replaces the generation_config of `model` and of every sub-model that generates (BLIP's text
    decoder) with one holding only its token ids (GENERATION_TOKEN_IDS), so the explicit
    `decoding_settings` are all that shapes decoding. Returns the settings dropped."""
    from transformers import GenerationConfig

    defaults = GenerationConfig().to_diff_dict()
    dropped = {}
    for module in model.modules():
        config = getattr(module, "generation_config", None)
        if not isinstance(config, GenerationConfig):
            continue
        dropped.update({k: v for k, v in config.to_diff_dict().items()
                        if k not in GENERATION_TOKEN_IDS and not k.startswith("_") and k != "transformers_version"
                        and defaults.get(k) != v})
        module.generation_config = GenerationConfig(**{k: getattr(config, k) for k in GENERATION_TOKEN_IDS
                                                       if getattr(config, k, None) is not None})
    return dropped


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
