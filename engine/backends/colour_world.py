"""The colour world: MineTheGap's synthetic colour sanity task (docs/spec/minethegap-and-biasbench.md A.6, a
reconstruction) as a deterministic generator, embedder, LLM and VQA. numpy and PIL only; CPU, instant.

It reads the 30 objects and their planted colour shares from the synthetic world's table
(assets/synthetic_world.json: apple (1,0,0), car (.5,.5,0), truck (.6,.3,.1), balloon uniform,
10 of 30 objects with a colour share of 0):

- generator: image j of prompt p is one solid colour drawn from the shares q(p) of the object
  the prompt names (a colour the prompt names wins; a prompt naming no known object gets a
  prompt-hashed distribution), with a random number seeded by (p, j);
- embedder: an image is the unit RGB vector of its colour; a text is the unit vector of the
  colour it names (uniform when it names none) plus epsilon (0.05) times a fixed Gaussian
  vector of its object, so variations of different objects never tie exactly;
- LLM: answers GapLens's MineTheGap meta-prompts (engine/common/llm_prompts.py): variations are
  "a red/green/blue {object}" cycled to N, a mutation swaps the object for another of the
  30, a random prompt is a random object in one of a few phrasings;
- VQA: names the colour of the image.

Backend names `synthetic_colour_generator`, `..._embedder`, `..._llm`, `..._vqa` (the prefix
keeps them on the CPU without importing torch); preset `colour`.
"""
from __future__ import annotations

import json
import zlib
from functools import lru_cache
from typing import Sequence

import numpy as np
from PIL import Image

from ..common import llm_prompts
from ..common.errors import InputError, ModelLoadError
from .base import GeneratedImage, GenerationSettings, ModelSpec, l2_normalise
from .synthetic.llm import TEMPLATE_TASKS, _count
from .synthetic.phrasing import article_for, with_subject
from .synthetic.world import World, _inverse_cdf, load_world, seed_int, sharpen

COLOURS = ("red", "green", "blue")
RGB = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
EPSILON = 0.05
VERSION = 1   # part of every id: bump it when images or embeddings change
OPENINGS = {task: getattr(llm_prompts, name).split("{")[0] for task, name in
            (("variations", "VARIATIONS"), ("mutations", "MUTATIONS"), ("random_prompts", "RANDOM_PROMPTS"))}
TEMPLATES = ("{a} {s}", "a photo of {a} {s}", "a close-up photo of {a} {s}", "{a} {s} on a table",
             "{a} {s} in a garden", "a drawing of {a} {s}")


class ColourWorld:
    """The objects of a synthetic-world table and their planted colour shares."""

    def __init__(self, world: World):
        if "color" not in world.axes or tuple(world.axes["color"].values) != COLOURS:
            raise ValueError(f"the colour world needs the table's 'color' axis with values {COLOURS}")
        self.world = world
        self.objects = world.subjects_of("object")
        self.hash = f"{world.hash}-c{VERSION}"

    @lru_cache(maxsize=4096)
    def parse(self, text: str) -> tuple[str | None, str | None]:
        """(object named or None, colour named or None)."""
        parsed = self.world.parse(text)
        obj = parsed.subject if parsed.subject in self.objects else None
        return obj, parsed.values.get("color")

    @lru_cache(maxsize=4096)
    def shares(self, prompt: str, guidance: float = 0.0, negative_prompt: str = "") -> dict[str, float]:
        """The colour distribution images of `prompt` are drawn from."""
        obj, colour = self.parse(prompt)
        if colour:
            return {c: float(c == colour) for c in COLOURS}
        if obj:
            dist = dict(self.world.subjects[obj].dist["color"])
        else:
            weights = np.random.default_rng(seed_int("colour-shares", prompt.strip().lower())).dirichlet(np.ones(3))
            dist = dict(zip(COLOURS, map(float, weights)))
        dist = sharpen(dist, guidance)
        _, banned = self.parse(negative_prompt) if negative_prompt else (None, None)
        if banned and sum(p for c, p in dist.items() if c != banned) > 0:
            dist = {c: (0.0 if c == banned else p) for c, p in dist.items()}
            total = sum(dist.values())
            dist = {c: p / total for c, p in dist.items()}
        return dist

    def colour_of(self, prompt: str, seed: int, settings: GenerationSettings | None = None) -> str:
        guidance, negative = (settings.guidance, settings.negative_prompt) if settings else (0.0, "")
        u = np.random.default_rng(seed_int("colour-image", prompt, int(seed))).random()
        return _inverse_cdf(self.shares(prompt, float(guidance), negative), u)

    def object_vector(self, obj: str | None) -> np.ndarray:
        """The fixed Gaussian direction of an object's name (epsilon-scaled in text embeddings)."""
        return np.random.default_rng(zlib.crc32((obj or "").encode())).normal(size=3)

    def phrase(self, obj: str) -> str:
        return self.world.subjects[obj].phrase


class ColourGenerator:
    family = "synthetic"
    batch_size = 256

    def __init__(self, cw: ColourWorld):
        self.cw = cw
        self.id = f"colour:{cw.hash}"

    def defaults(self) -> GenerationSettings:
        return GenerationSettings(steps=1, guidance=0.0, width=32, height=32)

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        size = (int(settings.width), int(settings.height))
        if not all(1 <= side <= 2048 for side in size):
            raise InputError(f"the colour world draws images from 1 to 2048 pixels a side; {size[0]}x{size[1]} was asked for")
        return [GeneratedImage(Image.new("RGB", size, RGB[self.cw.colour_of(prompt, s, settings)]), int(s))
                for s in seeds]


class ColourEmbedder:
    def __init__(self, cw: ColourWorld):
        self.cw = cw
        self.id = f"colour-embedder:{cw.hash}"

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        rows = [np.asarray(im.convert("RGB").resize((1, 1), Image.BOX), np.float32).reshape(3) + 1e-6 for im in images]
        return l2_normalise(np.asarray(rows, np.float32).reshape(len(rows), 3))

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            obj, colour = self.cw.parse(text)
            base = np.eye(3)[COLOURS.index(colour)] if colour else np.full(3, 1 / np.sqrt(3))
            rows.append(base + EPSILON * self.cw.object_vector(obj))
        return l2_normalise(np.asarray(rows, np.float32).reshape(len(rows), 3))


class ColourLLM:
    """Answers the MineTheGap variation, mutation and random-prompt meta-prompts."""

    def __init__(self, cw: ColourWorld):
        self.cw = cw
        self.id = f"colour-llm:{cw.hash}"

    def chat(self, messages: Sequence[dict], *, temperature: float = 1.0, max_tokens: int = 1024,
             seed: int = 0) -> str:
        users = [m for m in messages if m.get("role") == "user"]
        last = str(users[-1].get("content", "")).strip() if users else ""
        rng = np.random.default_rng(seed_int("colour-llm", last, seed if temperature > 0 else 0))
        for task, opening in OPENINGS.items():
            match = TEMPLATE_TASKS[task].fullmatch(last) if last.startswith(opening) else None
            if match:
                return json.dumps(getattr(self, task)(match.groupdict(), rng))
        return ("I am the colour world's model: I write colour variations, object mutations and random "
                f"object prompts about {', '.join(self.cw.objects[:8])}, ...")

    def variations(self, fields: dict, rng: np.random.Generator) -> list[str]:
        obj, _ = self.cw.parse(fields["prompt"])
        noun = self.cw.phrase(obj) if obj else "object"
        return [f"{article_for(c)} {c} {noun}" for c in (COLOURS * _count(fields["n"]))[:_count(fields["n"])]]

    def mutations(self, fields: dict, rng: np.random.Generator) -> list[str]:
        prompt = fields["prompt"].strip()
        obj, _ = self.cw.parse(prompt)
        others = [o for o in self.cw.objects if o != obj]
        out = []
        for i in rng.permutation(len(others)):
            mutated = with_subject(self.cw.world, prompt, others[int(i)])
            if mutated not in out:
                out.append(mutated)
            if len(out) == _count(fields["m"]):
                break
        return out

    def random_prompts(self, fields: dict, rng: np.random.Generator) -> list[str]:
        avoid = {p.strip().lower() for p in fields.get("avoid", "").split(";")}
        out: list[str] = []
        for _ in range(50 * max(1, _count(fields["r"]))):
            if len(out) == _count(fields["r"]):
                break
            phrase = self.cw.phrase(self.cw.objects[int(rng.integers(len(self.cw.objects)))])
            prompt = TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(a=article_for(phrase), s=phrase)
            if prompt.lower() not in avoid and prompt not in out:
                out.append(prompt)
        return out


class ColourVQA:
    def __init__(self, cw: ColourWorld):
        self.cw = cw
        self.id = f"colour-vqa:{cw.hash}"

    def _colour(self, image: Image.Image) -> str:
        return COLOURS[int(np.argmax(np.asarray(image.convert("RGB"), np.float32).reshape(-1, 3).mean(axis=0)))]

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        wanted = [c.lower() for c in choices] if choices else None
        return [c if wanted is None or c in wanted else "other" for c in map(self._colour, images)]

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        return [f"a {self._colour(im)} object" for im in images]


COMPONENTS = {"synthetic_colour_generator": ColourGenerator, "synthetic_colour_embedder": ColourEmbedder,
              "synthetic_colour_llm": ColourLLM, "synthetic_colour_vqa": ColourVQA}


def load(spec: ModelSpec, device: str = "cpu", **context):
    """The colour-world component `spec.backend` names, on the synthetic table `spec.model` names."""
    if spec.backend not in COMPONENTS:
        raise ModelLoadError(f"unknown colour-world backend '{spec.backend}'; expected one of {', '.join(COMPONENTS)}")
    return COMPONENTS[spec.backend](ColourWorld(load_world(spec.options.get("table") or spec.model)))
