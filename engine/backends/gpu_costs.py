"""What one call of a device model costs on a GPU, in seconds: the table ZeroGPU durations are asked
from (engine/hosting/space.gpu_seconds) and the synthetic world's cost model (option `gpu`, below).

Seconds are for a full H200 (an H100 SXM has as many SMs and near the same throughput for these
models): denoising is compute-bound (fp16/bf16, the family's default size, batched; FLUX.1-schnell at
1024 px about 0.3 s a step); VQA, captions and embeddings are short generations dominated by per-call
overhead, given per image.

The cost model. The synthetic backends take option `gpu` (`--generator-option gpu=sd-turbo`,
`--vqa-option gpu=blip_vqa`, `--embedder-option gpu=clip`; `gpu=1` picks the first of each table):
each call then sleeps the time the GPU would take (`call_seconds`): a generator call its images ×
(steps × the family's step + decode), a VQA call its images × the backend's seconds per question or
caption, an embedding call its images × EMBED_SECONDS. `seconds_per_image`, `seconds_per_question`,
`seconds_per_caption` and `seconds_per_embedding` set a number instead. Sleeping measures the
orchestration around the models (bench/scale_out.py), not arithmetic; it changes no output, so these
options are not part of a model's id.
"""
from __future__ import annotations

import time

from ..common.errors import ModelLoadError

H200_STEP_SECONDS = {"sd-turbo": 0.012, "sd1": 0.012, "sd2": 0.012, "sdxl": 0.09, "sdxl-turbo": 0.025,
                     "sd3": 0.09, "flux": 0.3, "flux-dev": 0.3}      # one step of one image
H200_DECODE_SECONDS = 0.02      # the VAE decode and safety check of one image
QUESTION_SECONDS = {"blip_vqa": 0.01, "vlm": 0.25, "clip_vqa": 0.002}   # one VQA question about one image
CAPTION_SECONDS = {"blip_vqa": 0.05, "vlm": 1.0}                        # one caption
EMBED_SECONDS = 0.005          # one CLIP embedding
COST_OPTIONS = frozenset({"gpu", "seconds_per_image", "seconds_per_question", "seconds_per_caption",
                          "seconds_per_embedding"})


def image_seconds(family: str, steps: int) -> float:
    """Returns the seconds of one image of `family` (sdxl's for an unknown one) at `steps` steps on an H200."""
    return max(1, int(steps)) * H200_STEP_SECONDS.get(family, H200_STEP_SECONDS["sdxl"]) + H200_DECODE_SECONDS


def call_seconds(role: str, options: dict) -> dict[str, float]:
    """Returns the simulated seconds per image of each kind of call ('step' and 'decode' for a generator,
    'question' and 'caption' for a VQA, 'embedding' for an embedder) that `options` ask for; {} when
    they ask for none. ModelLoadError for an unknown table entry or a number that is not one."""
    entry = options.get("gpu")
    if entry is not None and str(entry).lower() in ("", "0", "false", "no", "off"):
        entry = None
    named = {"seconds_per_image": "image", "seconds_per_question": "question", "seconds_per_caption": "caption",
             "seconds_per_embedding": "embedding"}
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
            costs.update(question=QUESTION_SECONDS[name], caption=CAPTION_SECONDS.get(name, 0.0))
        else:
            costs["embedding"] = EMBED_SECONDS
    for option, kind in named.items():
        if option in options:
            try:
                costs[kind] = float(options[option])
            except (TypeError, ValueError):
                raise ModelLoadError(f"option {option} must be a number of seconds, not {options[option]!r}") from None
            if costs[kind] < 0:
                raise ModelLoadError(f"option {option} must be at least 0, not {costs[kind]:g}")
    return costs


class GpuTimed:
    """A synthetic backend whose calls take the time `costs` (from `call_seconds`) says a GPU would:
    every attribute is the wrapped backend's; generate, answer, caption and embed_images sleep first."""

    def __init__(self, backend, costs: dict[str, float]):
        self._backend, self._costs = backend, costs

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def generate(self, prompt, seeds, settings):
        per_image = self._costs.get("image")
        if per_image is None:
            per_image = max(1, int(settings.steps)) * self._costs.get("step", 0.0) + self._costs.get("decode", 0.0)
        self._sleep(len(seeds) * per_image)
        return self._backend.generate(prompt, seeds, settings)

    def answer(self, images, *args, **kwargs):
        self._sleep(len(images) * self._costs.get("question", 0.0))
        return self._backend.answer(images, *args, **kwargs)

    def caption(self, images, *args, **kwargs):
        self._sleep(len(images) * self._costs.get("caption", 0.0))
        return self._backend.caption(images, *args, **kwargs)

    def embed_images(self, images, *args, **kwargs):
        self._sleep(len(images) * self._costs.get("embedding", 0.0))
        return self._backend.embed_images(images, *args, **kwargs)
