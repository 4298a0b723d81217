"""Generate: N images for one prompt (or for each of a list of prompts), streamed batch by batch
and recorded as one run. Under a launcher the images are made across all processes first
(engine/core/distributed.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypedDict

from ..common.errors import InputError
from ..common.events import Warning
from ..common.scores import Score, number
from ..core.distributed import distributed_image_sets
from ..core.engine import Engine, Run, recorded, stream_image_set
from ..hosting.limits import Estimate
from .options import GenerationOptions, settle_settings


@dataclass
class GenerateRequest(GenerationOptions):
    prompt: str
    n: int = field(default=8, metadata={"flag": "-n", "help": "images per prompt"})
    seed: int = field(default=0, metadata={"help": "images use the seeds seed, seed+1, ..., seed+n-1"})
    prompts: list[str] = field(default_factory=list)  # several prompts in one run (then `prompt` is unused)

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


class GenerateResults(TypedDict, total=False):
    """What a Generate run stores (`Done.results`)."""

    prompt: str          # the prompt (with several: the first and how many more)
    prompts: list[str]   # with several prompts: each, without repeats
    settings: dict       # the generator settings used
    images: list[dict]   # ImageRecord.to_json of every image, in prompt then seed order


def check(request, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    [engine.check_prompt(p) for p in request.prompts] or [engine.check_prompt(request.prompt)]
    engine.check_n(request.n)


def estimate(request: GenerateRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images per prompt; no LLM call."""
    return Estimate(int(request.n) * max(1, len(request.prompts)))


@recorded("generate", check, estimate)
def run(request: GenerateRequest, engine: Engine, run_record: Run):
    """N images of one prompt (or of each of `request.prompts`), recorded as one run.

    Request: GenerateRequest (prompt or prompts, N, first seed, generator settings).
    Yields: Warning for repeated or over-long prompts, unexpected
    settings (settings_notes) and flagged images; Images and Progress
    batch by batch; one Done.
    Results: GenerateResults.
    """
    # 1. Check the prompts and N; settle the generator settings.
    prompts = [engine.check_prompt(p) for p in request.prompts] or [engine.check_prompt(request.prompt)]
    unique = list(dict.fromkeys(prompts))
    settings = yield from settle_settings(request, engine)
    if len(unique) < len(prompts):
        yield Warning(f"{len(prompts) - len(unique)} repeated prompt(s) left out")
    long = [p for p in unique if len(p.split()) * 1.3 > 75]
    if long:
        yield Warning(("this prompt is" if len(unique) == 1 else f"{len(long)} prompt(s) are") + " likely longer "
                      "than CLIP's 77 tokens; SD 1.x/2.x/XL text encoders will ignore the end of it")
    # 2. Generate every prompt's images through the store (across processes when launched).
    seeds = request.seeds()
    started = time.perf_counter()
    job = yield from distributed_image_sets(engine, [(p, seeds, settings) for p in unique], final=True)
    records = []
    for i, prompt in enumerate(unique):
        records += yield from stream_image_set(engine, run_record, prompt, seeds, settings, prompt if len(unique) > 1 else "",
                                               i * len(seeds), len(unique) * len(seeds))
    image_seconds = round(time.perf_counter() - started, 3)  # the models are loaded by now: images only
    flagged = [r.seed for r in records if r.nsfw and not r.refused]
    refused = sum(bool(r.refused) for r in records)
    if flagged:
        yield Warning(f"the safety checker flagged {len(flagged)} image(s) (seeds {flagged}); they are "
                      "kept, marked, and excluded from metrics")
    # 3. Record the images.
    results: GenerateResults = {"prompt": unique[0], "settings": settings.__dict__,
               "images": [r.to_json() for r in records]}
    if len(unique) > 1:
        results.update(prompt=f"{unique[0]} (+{len(unique) - 1} more)", prompts=unique)
    summary = {"n": len(records) - refused, "flagged": len(flagged), "image_seconds": image_seconds}
    if refused:
        summary["refused"] = refused
    yield run_record.finish(results, {**summary, "distributed": job} if job else summary)


def read_prompts_file(path: str) -> list[str]:
    """One prompt per line; blank lines and lines starting with '#' are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.strip() for line in f]
    except OSError as exc:
        raise InputError(f"cannot read the prompts file: {exc}") from None
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise InputError(f"the prompts file {path} holds no prompt (one per line)")
    return prompts


def scores(results: dict, summary: dict) -> list[Score]:
    """The number of images and how many the safety checker flagged."""
    return [Score("images", k, float(summary[k])) for k in ("n", "flagged") if number(summary.get(k)) is not None]


def headline(record: dict) -> tuple[str, float | None]:
    """("8 images", 8) of a stored run."""
    n = (record.get("summary") or {}).get("n")
    return (f"{n} images" if n is not None else ""), number(n)
