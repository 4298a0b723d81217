"""The store's keys and records: `content_key`, the one key function (sha256 of everything that
determines an artefact), the key of an image, what a key and a run id may look like, and the
`ImageRecord` methods and tabs see."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from PIL import Image

RUN_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def content_key(*parts) -> str:
    """sha256 over a canonical JSON rendering of `parts`: the store's one key function."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def image_key(generator_id: str, prompt: str, seed: int, settings) -> str:
    """Key of one image: everything that determines its pixels (DESIGN.md)."""
    return content_key("image", generator_id, settings.scheduler, int(settings.steps),
                       float(settings.guidance), int(settings.width), int(settings.height),
                       prompt, settings.negative_prompt, int(seed))


CAPTION = "<caption>"   # a caption is stored as the answer to this pseudo-question, without choices


def choices_json(choices) -> str:
    """The answer choices as they are stored and keyed: a JSON list ("[]" for a free answer)."""
    return json.dumps(list(choices) if choices else [])


def answer_key(evaluator: str, image: str, question: str, choices=None, scored: bool = False) -> str:
    """Key of one VQA answer (a caption: question CAPTION): evaluator id, image key, question, choices;
    `scored`: an answer with a probability per class, keyed apart from the same evaluator's free
    answer (that one was matched to the classes, not ranked)."""
    return content_key("answer", evaluator, image, question, choices_json(choices), *(("class-probs",) if scored else ()))


def embedding_key(evaluator: str, image: str) -> str:
    """Key of one image embedding: embedder id and image key."""
    return content_key("embedding", evaluator, image)


@dataclass
class ImageRecord:
    """One stored image, as methods and tabs see it. `image` is loaded on demand."""

    key: str
    prompt: str
    seed: int
    path: str
    nsfw: bool = False
    cached: bool = False
    _image: Image.Image | None = None
    refused: str | None = None   # an image API refused the prompt (message); nsfw is set too

    @property
    def image(self) -> Image.Image:
        if self._image is None:
            with Image.open(self.path) as im:
                self._image = im.convert("RGB")
        return self._image

    def to_json(self) -> dict:
        out = {"key": self.key, "prompt": self.prompt, "seed": self.seed, "path": self.path,
               "nsfw": self.nsfw, "cached": self.cached}
        if self.refused:
            out["refused"] = self.refused
        return out


def is_key(text: str) -> bool:
    """Whether `text` is a store key (64 lower-case hex digits): safe as a file name."""
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def is_run_id(text: str) -> bool:
    """Whether `text` can be a run id: 1-80 letters, digits, '-', '_' or '.', not starting with
    '.' (run ids become export file names, so no path characters)."""
    return (isinstance(text, str) and 0 < len(text) <= 80 and not text.startswith(".")
            and all(c in RUN_ID_CHARS for c in text))
