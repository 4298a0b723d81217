"""Images that already exist, as an image source, and their labels, as an evaluator.

Backends "folder" (`--generator folder:PATH`), "hf_dataset" (`--generator hf-dataset:REPO_OR_PATH`)
and "labels" (`--vqa labels:PATH`, PATH a folder or, with option dataset=true, a dataset).

Layout: Hugging Face's imagefolder. A folder holds the images and `metadata.csv` or
`metadata.jsonl` (at its top or in one split folder such as `train/`) with a `file_name`
column (the image's path relative to the metadata file), a prompt column (`prompt`, else
`text`; option prompt_column), optionally `seed`, `caption`, and label columns (any other
column, e.g. `gender`, `age`). A dataset is read with `datasets.load_dataset(REPO_OR_PATH,
split=option split or "train")`, its image column `image` (option image_column).

Which images a request gets: the images of prompt P in a stable order (by `seed` when that
column exists, else in file/row order); image i of that order is served for seed i, so N
images of P are the first N. Asking for image N when P has fewer raises InputError naming how
many there are. The id carries a fingerprint of the metadata (and of the files' sizes), so
an edited folder never serves stale cached images.

The "labels" evaluator answers a VQA question from the label column it names (the column
whose name, with _ and - read as spaces, occurs in the question; "What is the gender of the
person?" -> `gender`), matching images to rows by their pixels, so a published label set is
scored with no model. With answer choices a label outside them reads "other"; captions come
from a `caption` column, else the labels joined.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

from PIL import Image

from ..common.errors import InputError, ModelLoadError
from .base import GeneratedImage, GenerationSettings, ModelSpec, with_options

RESERVED = {"file_name", "seed", "image", "caption"}
METADATA_NAMES = ("metadata.jsonl", "metadata.csv")


def _find_metadata(root: Path) -> Path:
    for name in METADATA_NAMES:
        if (root / name).is_file():
            return root / name
    found = sorted(p for name in METADATA_NAMES for p in root.glob(f"*/{name}"))
    if found:
        return found[0]
    raise ModelLoadError(f"'{root}' has no metadata.csv or metadata.jsonl (imagefolder layout: one row per image "
                         f"with file_name and prompt columns)")


def _read_rows(path: Path) -> list[dict]:
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        else:
            with path.open(encoding="utf-8", newline="") as f:
                rows = list(csv.DictReader(f))
    except (OSError, ValueError, csv.Error) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ModelLoadError(f"{path}: every line must be a JSON object")
    return rows


def _seed_order(value) -> tuple:
    try:
        return (0, int(value))
    except (TypeError, ValueError):
        return (1, 0)


def pixel_key(image: Image.Image) -> str:
    """Returns a hash of an image's RGB pixels and size (how labels find an image's row)."""
    rgb = image.convert("RGB")
    return hashlib.sha1(f"{rgb.size}".encode() + rgb.tobytes()).hexdigest()


class ImageTable:
    """The rows of an imagefolder or dataset: prompt, label columns, and a way to load image i."""

    def __init__(self, where: str, options: dict, dataset: bool):
        self.where = where
        self.prompt_column = options.get("prompt_column")
        if dataset:
            self._load_dataset(where, options)
        else:
            self._load_folder(Path(where).expanduser())
        if not self.rows:
            raise ModelLoadError(f"{where} holds no image rows")
        columns = set().union(*(r.keys() for r in self.rows))
        self.prompt_column = self.prompt_column or ("prompt" if "prompt" in columns else "text" if "text" in columns
                                                    else None)
        if self.prompt_column not in columns:
            raise ModelLoadError(f"{where} has no prompt column (columns: {', '.join(sorted(columns))}); name it "
                                 f"'prompt' or pass option prompt_column=NAME")
        self.label_columns = sorted(c for c in columns if c not in RESERVED | {self.prompt_column})
        order = sorted(range(len(self.rows)), key=lambda i: (_seed_order(self.rows[i].get("seed")), i))
        self.by_prompt: dict[str, list[int]] = {}
        for i in order:
            prompt = str(self.rows[i].get(self.prompt_column) or "").strip()
            if prompt:
                self.by_prompt.setdefault(prompt, []).append(i)

    def _load_folder(self, root: Path) -> None:
        if not root.is_dir():
            raise ModelLoadError(f"no such folder: '{root}'")
        meta = _find_metadata(root)
        self.rows = _read_rows(meta)
        self.base = meta.parent
        missing = [r.get("file_name") for r in self.rows if not r.get("file_name")
                   or not (self.base / str(r["file_name"])).is_file()]
        if missing:
            raise ModelLoadError(f"{meta}: {len(missing)} row(s) name no existing image file (first: "
                                 f"{missing[0]!r})")
        digest = hashlib.sha256(meta.read_bytes())
        for r in self.rows:
            resolved = (self.base / str(r["file_name"])).resolve()
            if self.base.resolve() not in resolved.parents:
                raise ModelLoadError(f"{meta}: file_name {r['file_name']!r} points outside the folder")
            digest.update(f"{r['file_name']}:{os.path.getsize(resolved)}".encode())
        self.fingerprint = digest.hexdigest()[:16]
        self._dataset = None

    def _load_dataset(self, where: str, options: dict) -> None:
        try:
            import datasets

            ds = datasets.load_dataset(where, split=options.get("split", "train"))
        except Exception as exc:  # noqa: BLE001 - datasets raises many types for a missing or bad dataset
            raise ModelLoadError(f"cannot load dataset '{where}': {type(exc).__name__}: {exc}") from None
        self.image_column = options.get("image_column", "image")
        if self.image_column not in ds.column_names:
            raise ModelLoadError(f"dataset '{where}' has no image column '{self.image_column}' (columns: "
                                 f"{', '.join(ds.column_names)}); pass option image_column=NAME")
        self.rows = ds.remove_columns([self.image_column]).to_list()
        self._dataset = ds
        self.fingerprint = str(getattr(ds, "_fingerprint", ""))[:16]

    def image(self, row: int) -> Image.Image:
        """Returns row `row`'s image as RGB."""
        if self._dataset is not None:
            return self._dataset[row][self.image_column].convert("RGB")
        with Image.open(self.base / str(self.rows[row]["file_name"])) as im:
            return im.convert("RGB")

    def prompts_text(self, limit: int = 5) -> str:
        names = list(self.by_prompt)
        shown = ", ".join(repr(p) for p in names[:limit])
        return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class ImageSource:
    """A folder or dataset of existing images behind the ImageGenerator protocol."""

    family = "source"
    source_kind = "source"
    options_in_id = True
    batch_size = 16

    def __init__(self, backend: str, where: str, options: dict):
        self.table = ImageTable(where, options, dataset=backend == "hf_dataset")
        self.what = f"the {'dataset' if backend == 'hf_dataset' else 'folder'} {where}"
        identity = {k: v for k, v in options.items() if k in ("prompt_column", "split", "image_column")}
        self.id = with_options(f"{backend}:{where}@{self.table.fingerprint}", identity)

    def defaults(self) -> GenerationSettings:
        """Settings do not apply to existing images: all zero, scheduler "source"."""
        return GenerationSettings(steps=0, guidance=0.0, width=0, height=0, scheduler="source")

    def available(self, prompt: str) -> int:
        """Returns how many images of `prompt` the source holds."""
        return len(self.table.by_prompt.get(prompt.strip(), []))

    def check_available(self, prompt: str, n: int) -> None:
        """InputError in one sentence when the source has fewer than `n` images of `prompt`."""
        have = self.available(prompt)
        if have == 0:
            raise InputError(f"{self.what} has no images of the prompt '{prompt}'; its prompts: "
                             f"{self.table.prompts_text()}")
        if n > have:
            raise InputError(f"{self.what} has {have} image(s) of '{prompt}', fewer than the {n} asked for; "
                             f"ask for at most {have}")

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        """Returns image `seed` of the prompt's stable order for each seed."""
        self.check_available(prompt, max(seeds) + 1)
        rows = self.table.by_prompt[prompt.strip()]
        return [GeneratedImage(self.table.image(rows[int(s)]), int(s)) for s in seeds]


class LabelsVQA:
    """Answers from the label columns of an image table, behind the VQA protocol."""

    options_in_id = True

    def __init__(self, where: str, options: dict):
        dataset = bool(options.get("dataset")) or not Path(where).expanduser().is_dir()
        self.table = ImageTable(where, options, dataset=dataset)
        if not self.table.label_columns and "caption" not in set().union(*(r.keys() for r in self.table.rows)):
            raise ModelLoadError(f"{where} has no label columns besides file_name and the prompt")
        self.id = with_options(f"labels:{where}@{self.table.fingerprint}",
                               {k: v for k, v in options.items() if k in ("prompt_column", "split")})
        self._rows_by_pixels: dict[str, int] | None = None

    def _row_of(self, image: Image.Image) -> int:
        if self._rows_by_pixels is None:
            self._rows_by_pixels = {pixel_key(self.table.image(i)): i for i in range(len(self.table.rows))}
        row = self._rows_by_pixels.get(pixel_key(image))
        if row is None:
            raise InputError(f"an image is not in the label set {self.table.where}; labels answer only for its own "
                             "images (use the same folder as --generator folder:PATH)")
        return row

    def column_for(self, question: str) -> str:
        """Returns the label column a question asks about (longest column name found in it)."""
        text = " " + " ".join(question.lower().replace("?", " ").split()) + " "
        hits = [c for c in self.table.label_columns
                if f" {c.lower().replace('_', ' ').replace('-', ' ')} " in text]
        if not hits:
            raise InputError(f"no label column answers '{question}'; label columns: "
                             f"{', '.join(self.table.label_columns) or 'none'} (a column is found by its name in "
                             "the question, e.g. 'gender')")
        return max(hits, key=len)

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns each image's label in the column the question names; with `choices`, the
        label if it is one of them (case-insensitive), else "other"."""
        column = self.column_for(question)
        labels = [str(self.table.rows[self._row_of(im)].get(column) or "").strip().lower() for im in images]
        if choices:
            allowed = {c.lower() for c in choices}
            return [label if label in allowed else "other" for label in labels]
        return [label or "unknown" for label in labels]

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns each image's `caption` column, else its labels as 'column: value' pairs."""
        out = []
        for im in images:
            row = self.table.rows[self._row_of(im)]
            if row.get("caption"):
                out.append(str(row["caption"]))
            else:
                out.append(", ".join(f"{c}: {row.get(c)}" for c in self.table.label_columns if row.get(c)))
        return out


def load(spec: ModelSpec, device: str, **context):
    """Returns an ImageSource ("folder", "hf_dataset") or a LabelsVQA ("labels")."""
    if spec.backend in ("folder", "hf_dataset"):
        return ImageSource(spec.backend, spec.model, dict(spec.options))
    if spec.backend == "labels":
        return LabelsVQA(spec.model, dict(spec.options))
    raise ModelLoadError(f"image_source cannot load backend '{spec.backend}' ('{spec.model}')")
