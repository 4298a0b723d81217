"""The engine's images: served from the store when an identical one is stored, generated (and
stored) batch by batch otherwise, within the run's image API budget (a part of `Engine`)."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..backends.base import GenerationSettings, PartialBatch
from ..common.errors import InputError, OutOfMemoryError
from ..models import sources
from ..store.store import ImageRecord, image_key


class ImageMaking:
    """Engine's images (a part of `Engine`)."""

    def images(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings | None = None
               ) -> Iterator[list[ImageRecord]]:
        """Yield the images for (prompt, seed) pairs batch by batch: stored ones at once, then each
        generated batch as soon as it is finished (and stored). Order within the stream is
        cached-first; every record carries its seed.

        For an images API (not seedable) a seed is the image's index: the key is prompt +
        index + settings + model, a refusal is recorded like an image and never asked again,
        and the calls a run makes are bounded by `max_api_calls`. A folder or dataset source
        serves image i of the prompt for seed i and says how many it has when asked for more."""
        settings = settings or self.default_settings()
        gen_id = self.model_id("generator")
        generator = self.models.peek(self.generator_spec)   # loaded by model_id above
        if seeds and hasattr(generator, "check_available"):
            generator.check_available(prompt, max(seeds) + 1)   # before any image: one clear sentence
        keys = [image_key(gen_id, prompt, s, settings) for s in seeds]
        # Imported images are not cache hits: an archive's bytes are not proof of what this
        # generator makes for this key (an archive can swap images and rewrite its checksums).
        found = self.store.get_images(keys, local_only=True)
        found.update({k: r for k, r in self.store.get_refusals([k for k in keys if k not in found]).items()})
        cached = [found[k] for k in keys if k in found]
        if cached:
            self.count(image_cache_hits=len(cached))
            self.store.touch([r.key for r in cached])
            yield cached
        missing = [(s, k) for s, k in zip(seeds, keys) if k not in found]
        if missing and getattr(generator, "source_kind", "model") == "api":
            used = self.run.api_calls if self.run else 0   # outside a run: each call on its own budget
            if used + len(missing) > self.max_api_calls:
                raise InputError(f"this needs {len(missing)} more image API call(s) but the budget allows "
                                 f"{max(0, self.max_api_calls - used)} more in this run (at most "
                                 f"{self.max_api_calls}); lower N or raise the budget (--max-api-calls)")
            if self.run:
                self.run.api_calls += len(missing)
        batch_size = max(1, int(getattr(generator, "batch_size", 4)))
        start, retried = 0, False
        while start < len(missing):
            batch = missing[start:start + batch_size]
            failure = None
            try:
                with self._backend("generator") as gen:
                    try:
                        outputs = gen.generate(prompt, [s for s, _ in batch], settings)
                    except PartialBatch as partial:   # keep what was made (and paid for) before the failure
                        outputs, failure = partial.outputs, partial.error
            except OutOfMemoryError:
                if retried or batch_size == 1:
                    raise  # its message says what to change
                # One retry with half the batch; the generator keeps the smaller size from now on.
                # Each image depends only on its own seed, so the images do not change.
                retried, batch_size = True, max(1, batch_size // 2)
                generator.batch_size = batch_size
                self.models.memory.empty_cache(self.models.device)
                continue
            self.count(generator_calls=1, images_generated=sum(out.refused is None for out in outputs))
            start += len(batch)
            key_of = dict(batch)
            made = iter(self.store.put_images(gen_id, prompt, settings, [   # one transaction for the call's images
                (key_of[out.seed], out.seed, out.image, out.nsfw) for out in outputs if out.refused is None]))
            records = [self.store.put_refusal(key_of[out.seed], gen_id, prompt, out.seed, out.refused)
                       if out.refused is not None else next(made) for out in outputs]
            if records:
                yield records
            if failure is not None:
                raise failure

    def prompt_note(self, prompt: str) -> str | None:
        """A sentence when the generator cannot draw what `prompt` names (the synthetic world: a
        subject or language it does not know), else None; generators without `prompt_note` have none."""
        self.model_id("generator")   # loads it
        note = getattr(self.models.peek(self.generator_spec), "prompt_note", None)
        return note(prompt) if callable(note) else None

    def image_set(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings | None = None
                  ) -> list[ImageRecord]:
        """All images of a set, in seed order (no streaming)."""
        by_seed = {r.seed: r for batch in self.images(prompt, seeds, settings) for r in batch}
        return [by_seed[s] for s in seeds]

    def regenerate_check(self, prompt: str, seed: int, settings: GenerationSettings, key: str
                         ) -> tuple[bool, int | None]:
        """Generate one image alone (bypassing the store) and compare it with the stored one:
        (pixel-identical?, largest per-channel difference in grey levels). (False, None), without
        generating, when the stored image is gone (deleted with a run, or its file is missing):
        there is nothing to compare, which says nothing about reproducibility."""
        kind = sources.source_kind(self)
        if kind != "model":
            raise InputError("images from an API are not seedable: regenerating one gives a different image, "
                             "so there is nothing to check" if kind == "api" else
                             "these images come from a folder or dataset, not from a model: there is nothing to regenerate")
        stored = self.store.get_images([key]).get(key)
        if stored is None:
            return False, None
        self.charge(images=1, what="regenerate")
        with self._backend("generator") as gen:
            fresh = gen.generate(prompt, [int(seed)], settings)[0].image.convert("RGB")
        self.count(generator_calls=1)
        if stored.image.size != fresh.size:
            return False, 255
        diff = int(np.abs(np.asarray(stored.image, np.int16) - np.asarray(fresh, np.int16)).max())
        return diff == 0, diff
