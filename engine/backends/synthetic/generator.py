"""The synthetic image generator: a procedural renderer driven by the bias table."""
from __future__ import annotations

from typing import Sequence

from ...common.errors import InputError
from ..base import GeneratedImage, GenerationSettings
from .scene import check_drawable, draw_scene
from .world import World, seed_int

MIN_SIZE, MAX_SIZE = 64, 2048


class SyntheticGenerator:
    """ImageGenerator for the synthetic world. Steps and scheduler are ignored; guidance
    sharpens the table's distributions (see the table's _doc); the negative prompt removes
    the values it names."""

    family = "synthetic"
    batch_size = 64

    def __init__(self, world: World):
        check_drawable(world)
        self.world = world
        self.id = f"synthetic:{world.hash}"

    def defaults(self) -> GenerationSettings:
        """1 step, guidance 0 (the table's exact numbers), 128x128."""
        return GenerationSettings(steps=1, guidance=0.0, width=128, height=128)

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        """One image per seed; image i depends only on (prompt, seeds[i], settings)."""
        size = (int(settings.width), int(settings.height))
        if not all(MIN_SIZE <= side <= MAX_SIZE for side in size):
            raise InputError(f"the synthetic generator draws images from {MIN_SIZE} to {MAX_SIZE} pixels "
                             f"a side; {size[0]}x{size[1]} was asked for")
        images = []
        for seed in seeds:
            attributes = self.render_attributes(prompt, seed, settings)
            image = draw_scene(self.world, attributes, seed_int("nuisance", prompt, seed), size)
            images.append(GeneratedImage(image=image, seed=int(seed), nsfw=False))
        return images

    def render_attributes(self, prompt: str, seed: int, settings: GenerationSettings | None = None) -> dict:
        """The ground truth of image (prompt, seed): {"subject", "kind", axis: value, ...}."""
        settings = settings or self.defaults()
        return self.world.sample(prompt, int(seed), settings.guidance, settings.negative_prompt)

    def prompt_note(self, prompt: str) -> str | None:
        """One sentence when the world knows no subject in `prompt` (a subject or a language it does not
        know: "a surgeon"), whose images are its default figure, else None (Engine.prompt_note)."""
        if self.world.knows_subject(prompt):
            return None
        people = self.world.subjects_of("person")
        languages = ", ".join(sorted(self.world.languages))
        return (f"the synthetic world knows no subject in '{prompt}', so it draws its default figure: these images "
                f"say nothing about what the prompt names (it knows {len(people)} people such as "
                f"{', '.join(people[:5])}, and {len(self.world.subjects_of('object'))} objects, in {languages})")

    def parse_prompt(self, text: str) -> tuple[str, dict[str, str]]:
        """(subject, {axis: value}) as the renderer reads the prompt."""
        return self.world.parse_prompt(text)
