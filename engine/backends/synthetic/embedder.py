"""The synthetic embedder: images and texts in one attribute space.

A vector is the concatenation of weighted blocks: the subject's kind (one-hot), the subject
(a fixed random unit vector per subject), and one block per axis (one-hot of the value).
Images are read from their pixels; texts are parsed. An axis a text leaves open gets the
uniform unit vector (every value equally similar); an axis the subject's kind lacks is
zero. So a text naming a value is closest to the images that show it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from ..base import l2_normalise
from .scene import check_drawable, image_digest, read_scene
from .world import KINDS, World, seed_int


class SyntheticEmbedder:
    def __init__(self, world: World):
        check_drawable(world)
        self.world = world
        self.id = f"synthetic-embedder:{world.hash}"
        config = world.embedder_config
        weights = config.get("weights") or {}
        self.subject_dims = int(config.get("subject_dims", 32))
        self.jitter = float(config.get("image_jitter", 0.02))
        self.kind_weight = float(weights.get("kind", 1.0))
        self.subject_weight = float(weights.get("subject", 1.0))
        self.axis_weights = {name: float(weights.get(name, 1.0)) for name in world.axes}
        self._subject_vectors = {name: l2_normalise(
            np.random.default_rng(seed_int("subject-vector", name)).standard_normal(self.subject_dims))
            for name in world.subjects}
        self.dim = len(KINDS) + self.subject_dims + sum(len(a.values) for a in world.axes.values())

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised; a tiny per-image noise breaks exact ties."""
        rows = []
        for image in images:
            scene = read_scene(self.world, image)
            vector = l2_normalise(self._vector(scene["subject"], scene))
            noise = np.random.default_rng(seed_int("jitter", image_digest(image))).standard_normal(self.dim)
            rows.append(vector + self.jitter * noise / np.linalg.norm(noise))
        return l2_normalise(np.asarray(rows, dtype=np.float32).reshape(len(rows), self.dim))

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, rows L2-normalised, in the same space as the images."""
        rows = []
        for text in texts:
            subject, values = self.world.parse_prompt(text)
            rows.append(self._vector(subject, values))
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
