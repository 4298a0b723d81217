"""What one call of a device model costs on a GPU, in seconds: the table ZeroGPU durations are asked
from (engine/hosting/space.gpu_seconds) and the synthetic world's cost model (option `gpu`, below).

Seconds are for a full H200 (an H100 SXM has as many SMs and near the same throughput for these
models): denoising is compute-bound (fp16/bf16, the family's default size, batched; FLUX.1-schnell at
1024 px about 0.3 s a step); VQA, captions and embeddings are short generations dominated by per-call
overhead, given per image.

The cost model. The synthetic backends take option `gpu` (`--generator-option gpu=sd-turbo`,
`--vqa-option gpu=blip_vqa`, `--embedder-option gpu=clip`; `gpu=1` picks the first of each table):
each call then sleeps the time the GPU would take (`call_seconds`): a generator call its images ×
(steps × the family's step + decode), a VQA call its images × the seconds of its questions (one asked
alone: QUESTION_SECONDS; several asked at once, `answer_questions`: the image's share once and the rest
per question, `questions_seconds`) or of a caption, an embedding call its images × EMBED_SECONDS (texts ×
TEXT_EMBED_SECONDS). `seconds_per_image`, `seconds_per_question`, `seconds_per_caption`,
`seconds_per_embedding` and `image_share` set a number instead. Sleeping measures the orchestration
around the models (bench/scale_out.py), not arithmetic; it changes no output, so these options are not
part of a model's id (base.COST_OPTIONS).
"""
from __future__ import annotations

import time

from ..common.errors import ModelLoadError
from .base import answer_all

H200_STEP_SECONDS = {"sd-turbo": 0.012, "sd1": 0.012, "sd2": 0.012, "sdxl": 0.09, "sdxl-turbo": 0.025,
                     "sd3": 0.09, "flux": 0.3, "flux-dev": 0.3}      # one step of one image
H200_DECODE_SECONDS = 0.02      # the VAE decode and safety check of one image
QUESTION_SECONDS = {"blip_vqa": 0.01, "vlm": 0.25, "clip_vqa": 0.002}   # one VQA question about one image, asked alone
# The share of QUESTION_SECONDS spent on the image itself, done once per image however many of its closed-set
# questions are asked at once (answer_questions); the rest is paid per question. Sources, measured by
# bench/evaluation_cost.py on a CPU (one thread, CPU seconds; the shares are assumed to hold on a GPU):
# - blip_vqa 0.91: at BlipConfig() size (blip-vqa-base, 384 px) one question asked alone costs a vision pass
#   (80% of its seconds), the question encoder (14%, of which 77% by FLOPs is projecting the 577 image tokens
#   into every layer's cross-attention keys and values: once per image now) and the ranking of its choices
#   (5%): 0.80 + 0.77 x 0.14 = 0.91.
# - vlm 0.73: a Qwen2-VL at Qwen2-VL-2B's width with 4 of its 28 decoder and 4 of its 32 vision layers, 448 px
#   (256 image tokens): the 8 questions one call each took 2.77 times as long as one call for all (the prefix
#   prefilled once), so 8 / 2.77 = 0.73 + 8 x 0.27. The per-question part is the question's tokens, its
#   options scored and a 4-token reply; at full depth the layers outweigh the 152k-token head and the FLOPs
#   put the image's share near 0.9, so 0.73 is on the safe side.
# - clip_vqa 0.95: the image embedding; a question's choices are text embeddings cached per backend, so a
#   question costs one matrix product (estimate).
IMAGE_SHARE = {"blip_vqa": 0.91, "vlm": 0.73, "clip_vqa": 0.95}
CAPTION_SECONDS = {"blip_vqa": 0.05, "vlm": 1.0}                        # one caption
EMBED_SECONDS = 0.005          # one CLIP embedding
TEXT_EMBED_SECONDS = 0.001     # one CLIP text embedding: 77 tokens through the text tower (~1/5 of ViT-B's FLOPs)


def image_seconds(family: str, steps: int) -> float:
    """Returns the seconds of one image of `family` (sdxl's for an unknown one) at `steps` steps on an H200."""
    return max(1, int(steps)) * H200_STEP_SECONDS.get(family, H200_STEP_SECONDS["sdxl"]) + H200_DECODE_SECONDS


def questions_seconds(question: float, image_share: float, questions: int) -> float:
    """Returns the seconds of `questions` closed-set questions about one image asked at once, when one asked
    alone takes `question` seconds of which `image_share` is the image's part (done once)."""
    if questions <= 0:
        return 0.0
    return question * (image_share + questions * (1.0 - image_share))


def question_seconds(backend: str) -> float:
    """Returns the seconds of one question about one image asked alone of a `backend` evaluator on an H200
    (QUESTION_SECONDS; a VLM's for an unknown one)."""
    return QUESTION_SECONDS.get(backend, QUESTION_SECONDS["vlm"])


def vqa_seconds(backend: str, questions: int) -> float:
    """Returns the seconds of `questions` closed-set questions about one image asked at once by a `backend`
    evaluator (`question_seconds` and IMAGE_SHARE) on an H200."""
    return questions_seconds(question_seconds(backend), IMAGE_SHARE.get(backend, 0.0), questions)


def call_seconds(role: str, options: dict) -> dict[str, float]:
    """Returns the simulated seconds per image of each kind of call ('step' and 'decode' for a generator,
    'question', 'image_share' and 'caption' for a VQA, 'embedding' and 'text' for an embedder) that
    `options` ask for; {} when they ask for none. ModelLoadError for an unknown table entry or a number that
    is not one."""
    entry = options.get("gpu")
    if entry is not None and str(entry).lower() in ("", "0", "false", "no", "off"):
        entry = None
    named = {"seconds_per_image": "image", "seconds_per_question": "question", "seconds_per_caption": "caption",
             "seconds_per_embedding": "embedding", "image_share": "image_share"}
    costs: dict[str, float] = {}
    if entry is not None:
        pick = None if str(entry).lower() in ("1", "true", "yes", "on", "default") else str(entry)
        tables = {"generator": H200_STEP_SECONDS, "vqa": QUESTION_SECONDS, "embedder": {"clip": EMBED_SECONDS}}[role]
        name = pick or next(iter(tables))
        if name not in tables:
            raise ModelLoadError(f"option gpu={entry}: the {role}'s GPU cost table knows {', '.join(tables)}")
        if role == "generator":
            costs.update(step=H200_STEP_SECONDS[name], decode=H200_DECODE_SECONDS)
        elif role == "vqa":
            costs.update(question=QUESTION_SECONDS[name], image_share=IMAGE_SHARE.get(name, 0.0),
                         caption=CAPTION_SECONDS.get(name, 0.0))
        else:
            costs.update(embedding=EMBED_SECONDS, text=TEXT_EMBED_SECONDS)
    for option, kind in named.items():
        if option in options:
            try:
                costs[kind] = float(options[option])
            except (TypeError, ValueError):
                raise ModelLoadError(f"option {option} must be a number, not {options[option]!r}") from None
            if costs[kind] < 0 or (kind == "image_share" and costs[kind] > 1):
                raise ModelLoadError(f"option {option} must be at least 0{' and at most 1' * (kind == 'image_share')}, "
                                     f"not {costs[kind]:g}")
    return costs


class GpuTimed:
    """A synthetic backend whose calls take the time `costs` (from `call_seconds`) says a GPU would: every
    attribute is the wrapped backend's; each method of the four protocols it has (TIMED) sleeps first. A
    method of the wrapped backend that is neither timed nor in UNTIMED (no GPU work: settings, parsing, the
    manager's bookkeeping) is refused, so a protocol method added later cannot run untimed
    (tests/test_gpu_costs.py enumerates them)."""

    TIMED = ("generate", "answer", "answer_classes", "answer_questions", "caption", "embed_images", "embed_texts")
    UNTIMED = frozenset({"defaults", "render_attributes", "parse_prompt", "interpret", "memory_bytes", "move_to",
                         "prompt_note"})

    def __init__(self, backend, costs: dict[str, float]):
        self._backend, self._costs = backend, costs
        for name in self.TIMED:   # a method the wrapped backend lacks stays missing (callers test for it)
            if not callable(getattr(backend, "answer_classes" if name == "answer_questions" else name, None)):
                setattr(self, name, None)

    def __getattr__(self, name):
        value = getattr(self._backend, name)
        if callable(value) and not name.startswith("_") and name not in self.UNTIMED:
            raise AttributeError(f"GpuTimed does not time {type(self._backend).__name__}.{name}: add it to "
                                 "GpuTimed.TIMED (a GPU call) or GpuTimed.UNTIMED (none)")
        return value

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def _question(self, images, questions: int = 1) -> None:
        self._sleep(len(images) * questions_seconds(self._costs.get("question", 0.0),
                                                    self._costs.get("image_share", 0.0), questions))

    def generate(self, prompt, seeds, settings):
        per_image = self._costs.get("image")
        if per_image is None:
            per_image = max(1, int(settings.steps)) * self._costs.get("step", 0.0) + self._costs.get("decode", 0.0)
        self._sleep(len(seeds) * per_image)
        return self._backend.generate(prompt, seeds, settings)

    def answer(self, images, *args, **kwargs):
        self._question(images)
        return self._backend.answer(images, *args, **kwargs)

    def answer_classes(self, images, *args, **kwargs):
        self._question(images)
        return self._backend.answer_classes(images, *args, **kwargs)

    def answer_questions(self, images, asks, **context):
        self._question(images, len(asks))
        return answer_all(self._backend, images, asks, **context)

    def caption(self, images, *args, **kwargs):
        self._sleep(len(images) * self._costs.get("caption", 0.0))
        return self._backend.caption(images, *args, **kwargs)

    def embed_images(self, images, *args, **kwargs):
        self._sleep(len(images) * self._costs.get("embedding", 0.0))
        return self._backend.embed_images(images, *args, **kwargs)

    def embed_texts(self, texts, *args, **kwargs):
        self._sleep(len(texts) * self._costs.get("text", 0.0))
        return self._backend.embed_texts(texts, *args, **kwargs)
