"""Generate: N images for one prompt, streamed batch by batch and recorded as a run."""
from __future__ import annotations

from dataclasses import dataclass

from ..core import Engine, Run, recorded, stream_image_set
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

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


def settings_for(request, engine: Engine):
    """The generator's family defaults with the request's explicit fields applied."""
    return engine.settings(steps=request.steps, guidance=request.guidance, width=request.width,
                           height=request.height, negative_prompt=request.negative_prompt or "")


@recorded("generate")
def run(request: GenerateRequest, engine: Engine, run: Run):
    prompt = engine.check_prompt(request.prompt)
    engine.check_n(request.n)
    settings = settings_for(request, engine)
    if len(prompt.split()) * 1.3 > 75:
        yield Warning("this prompt is likely longer than CLIP's 77 tokens; SD 1.x/2.x/XL text "
                      "encoders will ignore the end of it")
    records = yield from stream_image_set(engine, run, prompt, request.seeds(), settings)
    flagged = [r.seed for r in records if r.nsfw]
    if flagged:
        yield Warning(f"the safety checker flagged {len(flagged)} image(s) (seeds {flagged}); they are "
                      "kept, marked, and excluded from metrics")
    results = {"prompt": prompt, "settings": settings.__dict__,
               "images": [r.to_json() for r in records]}
    yield run.finish(results, {"n": len(records), "flagged": len(flagged)})


def add_cli(sub, common_arguments) -> None:
    """`python -m engine generate --prompt ... -n 8 [--json]`"""
    p = sub.add_parser("generate", help="generate N images for a prompt and store them as a run")
    common_arguments(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.set_defaults(method=run, make_request=lambda a: GenerateRequest(
        a.prompt, a.n, a.seed, a.negative_prompt, a.steps, a.guidance, a.width, a.height))
