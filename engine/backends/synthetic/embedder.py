"""The synthetic embedder: images and texts in one attribute space, with CLIP's spread.

A vector's attribute part is the concatenation of weighted blocks: the subject's kind (one-hot),
the subject (a fixed random unit vector per subject), and one block per axis (one-hot of the
value). Images are read from their pixels; texts are parsed. An axis a text leaves open gets the
uniform unit vector (every value equally similar); an axis the subject's kind lacks is zero. So a
text naming a value is closest to the images that show it.

Three further parts give image-text cosines CLIP's spread (issue 42): on the attribute part alone
a man's image is 0.22 more similar to "a photo of a man" than to "a photo of a woman", which CLIP's
logit scale of 100 turns into a zero-shot probability of 1 − 1e-9 for every image. CLIP's
probabilities are rarely that sure, because

- texts and images sit in separate cones (CLIP's "modality gap", Liang et al. 2022): every text
  vector is `text_scale` × its attribute part plus a text-only direction, so every image-text
  cosine is `text_scale` × the attribute cosine (0.2: the 0.22 becomes 0.044, a probability near
  0.99);
- no two images look alike: each image's attribute part carries a noise of norm `image_variation`
  (besides `image_jitter`, which only breaks ties), so probabilities vary from image to image;
- some images are ambiguous: a share `ambiguous_share` of the images carry their own random
  direction in `detail_dims` image-only dimensions, of norm up to `image_detail`, which shrinks
  their cosines with every text by up to 1/√(1 + image_detail²) (0.93 rather than 0.99).

The modality gap and the detail scale an image's cosines with every text by one positive factor,
and the variation is far smaller than the attribute blocks' differences, so which text is nearest
to an image (every lean, every zero-shot answer's argmax, every planted share) is what the
attribute part says; how sure the probabilities are is what changes. With the defaults, images of
a doctor score 0.93-0.99 for their gender (median 0.98) and 0.64-0.9 for their age among three.
Each number may be set in the world table's "embedder" section.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from ..base import l2_normalise
from .scene import check_drawable, image_digest, read_scene
from .world import KINDS, World, seed_int

VERSION = 2   # of the geometry: 2 added the modality gap and the images' detail (issue 42)


class SyntheticEmbedder:
    def __init__(self, world: World):
        check_drawable(world)
        self.world = world
        self.id = f"synthetic-embedder:{world.hash}:v{VERSION}"
        config = world.embedder_config
        weights = config.get("weights") or {}
        self.subject_dims = int(config.get("subject_dims", 32))
        self.jitter = float(config.get("image_jitter", 0.02))
        self.text_scale = float(config.get("text_scale", 0.2))
        self.variation = float(config.get("image_variation", 0.2))
        self.detail = float(config.get("image_detail", 1.2))
        self.ambiguous = float(config.get("ambiguous_share", 0.2))
        self.detail_dims = int(config.get("detail_dims", 16))
        if not (0 < self.text_scale <= 1 and self.detail >= 0 and self.variation >= 0 and 0 < self.ambiguous <= 1
                and self.detail_dims >= 1):
            raise ValueError("the synthetic embedder needs 0 < text_scale ≤ 1, image_detail ≥ 0, image_variation ≥ 0, "
                             "0 < ambiguous_share ≤ 1 and detail_dims ≥ 1")
        self.kind_weight = float(weights.get("kind", 1.0))
        self.subject_weight = float(weights.get("subject", 1.0))
        self.axis_weights = {name: float(weights.get(name, 1.0)) for name in world.axes}
        self._subject_vectors = {name: l2_normalise(
            np.random.default_rng(seed_int("subject-vector", name)).standard_normal(self.subject_dims))
            for name in world.subjects}
        self.attribute_dim = len(KINDS) + self.subject_dims + sum(len(a.values) for a in world.axes.values())
        # [attribute part | the text-only direction | the images' detail]
        self.dim = self.attribute_dim + 1 + self.detail_dims

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised: the attribute part with the image's own variation, then its
        detail (module docstring); all of it from the image's bytes."""
        rows = []
        for image in images:
            scene = read_scene(self.world, image)
            rng = np.random.default_rng(seed_int("jitter", image_digest(image)))
            vector = l2_normalise(self._vector(scene["subject"], scene))
            noise = rng.standard_normal(self.attribute_dim)
            vector = l2_normalise(vector + (self.jitter + self.variation) * noise / np.linalg.norm(noise))
            detail = rng.standard_normal(self.detail_dims)
            gamma = self.detail * max(0.0, 1 - (1 - rng.uniform()) / self.ambiguous)   # 0 for 1 − ambiguous_share
            rows.append(np.concatenate([vector, [0.0], gamma * detail / np.linalg.norm(detail)]))
        return l2_normalise(np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim))

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised, in the same space as the images (`text_scale` of the
        attribute part, the rest on the text-only direction)."""
        rows = []
        for text in texts:
            subject, values = self.world.parse_prompt(text)
            vector = l2_normalise(self._vector(subject, values))
            rows.append(np.concatenate([self.text_scale * vector, [np.sqrt(1 - self.text_scale ** 2)],
                                        np.zeros(self.detail_dims)]))
        return l2_normalise(np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim))

    def _vector(self, subject: str, values: dict) -> np.ndarray:
        kind = self.world.subjects[subject].kind
        blocks = [self.kind_weight * np.eye(len(KINDS))[KINDS.index(kind)],
                  self.subject_weight * self._subject_vectors[subject]]
        for axis in self.world.axes.values():
            k = len(axis.values)
            if kind not in axis.applies_to:
                block = np.zeros(k)
            elif values.get(axis.name) in axis.values:
                block = np.eye(k)[axis.values.index(values[axis.name])]
            else:
                block = np.full(k, 1.0 / np.sqrt(k))
            blocks.append(self.axis_weights[axis.name] * block)
        return np.concatenate(blocks)
