"""Generate: N images for one prompt (or for each of a list of prompts), streamed batch by batch
and recorded as one run. Under a launcher the images are made across all processes first
(engine/distributed.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..core import Engine, Run, recorded, stream_image_set
from ..distributed import distributed_image_sets
from ..errors import InputError
from ..events import Warning


@dataclass
class GenerateRequest:
    prompt: str
    n: int = 8
    seed: int = 0                 # images use seeds seed, seed+1, ..., seed+n-1
    negative_prompt: str = ""
    steps: int | None = None      # None: the generator family's default
    guidance: float | None = None
    width: int | None = None
    height: int | None = None
    prompts: list[str] = field(default_factory=list)  # several prompts in one run (then `prompt` is unused)

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


def settings_for(request, engine: Engine):
    """The generator's family defaults with the request's explicit fields applied."""
    return engine.settings(steps=request.steps, guidance=request.guidance, width=request.width,
                           height=request.height, negative_prompt=request.negative_prompt or "")


def check(request, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    [engine.check_prompt(p) for p in request.prompts] or [engine.check_prompt(request.prompt)]
    engine.check_n(request.n)


@recorded("generate", check)
def run(request: GenerateRequest, engine: Engine, run: Run):
    prompts = [engine.check_prompt(p) for p in request.prompts] or [engine.check_prompt(request.prompt)]
    unique = list(dict.fromkeys(prompts))
    engine.check_n(request.n)
    settings = settings_for(request, engine)
    if len(unique) < len(prompts):
        yield Warning(f"{len(prompts) - len(unique)} repeated prompt(s) left out")
    long = [p for p in unique if len(p.split()) * 1.3 > 75]
    if long:
        yield Warning(("this prompt is" if len(unique) == 1 else f"{len(long)} prompt(s) are") + " likely longer "
                      "than CLIP's 77 tokens; SD 1.x/2.x/XL text encoders will ignore the end of it")
    seeds = request.seeds()
    started = time.perf_counter()
    job = yield from distributed_image_sets(engine, [(p, seeds, settings) for p in unique])
    records = []
    for i, prompt in enumerate(unique):
        records += yield from stream_image_set(engine, run, prompt, seeds, settings, prompt if len(unique) > 1 else "",
                                               i * len(seeds), len(unique) * len(seeds))
    image_seconds = round(time.perf_counter() - started, 3)  # the models are loaded by now: images only
    flagged = [r.seed for r in records if r.nsfw]
    if flagged:
        yield Warning(f"the safety checker flagged {len(flagged)} image(s) (seeds {flagged}); they are "
                      "kept, marked, and excluded from metrics")
    results = {"prompt": unique[0], "settings": settings.__dict__,
               "images": [r.to_json() for r in records]}
    if len(unique) > 1:
        results.update(prompt=f"{unique[0]} (+{len(unique) - 1} more)", prompts=unique)
    summary = {"n": len(records), "flagged": len(flagged), "image_seconds": image_seconds}
    yield run.finish(results, {**summary, "distributed": job} if job else summary)


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


def add_generation_arguments(p) -> None:
    """The CLI options every method shares to override the generator's family defaults."""
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)


def add_cli(sub, common_arguments) -> None:
    """`python -m engine generate --prompt ... -n 8 [--json]` (or --prompts-file FILE: N images per line)"""
    p = sub.add_parser("generate", help="generate N images for a prompt and store them as a run")
    common_arguments(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--prompt")
    which.add_argument("--prompts-file", metavar="FILE", help="one prompt per line: N images of each, one run")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    add_generation_arguments(p)
    p.set_defaults(method=run, make_request=lambda a: GenerateRequest(
        a.prompt or "", a.n, a.seed, a.negative_prompt, a.steps, a.guidance, a.width, a.height,
        read_prompts_file(a.prompts_file) if a.prompts_file else []))
