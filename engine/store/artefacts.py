"""What the store caches, each under the key of everything that determines it: images (and an
image API's refusals), embeddings, VQA answers and LLM replies; and the image files a distributed
job's processes share."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import time
import uuid
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from ..common.errors import StoreError
from .keys import ImageRecord, answer_key, embedding_key, is_key
from .schema import in_chunks


class Artefacts:
    """Store's images, refusals, embeddings, answers and LLM replies (a part of `Store`)."""

    def _image_path(self, key: str) -> Path:
        return self.image_dir / key[:2] / f"{key}.png"

    def put_image(self, key: str, generator_id: str, prompt: str, seed: int, settings,
                  image: Image.Image, nsfw: bool = False) -> ImageRecord:
        """Write the PNG atomically, then its row. Returns the record (with the image attached)."""
        return self.put_images(generator_id, prompt, settings, [(key, seed, image, nsfw)])[0]

    def put_images(self, generator_id: str, prompt: str, settings, images: Sequence[tuple]) -> list[ImageRecord]:
        """Write each image's PNG atomically, then all their rows in one transaction (one commit per generator
        call, not per image). `images`: (key, seed, PIL image, nsfw). Returns the records (images attached)."""
        rows, records = [], []
        for key, seed, image, nsfw in images:
            path = self._image_path(key)
            buf = io.BytesIO()
            image.save(buf, format="PNG", compress_level=1)
            data = buf.getvalue()
            self._write_file(path, data)
            now = time.time()
            rows.append((key, generator_id, prompt, settings.negative_prompt, int(seed), int(settings.steps),
                         float(settings.guidance), int(settings.width), int(settings.height), settings.scheduler,
                         str(path), hashlib.sha256(data).hexdigest(), int(bool(nsfw)), now, "local", now, len(data)))
            records.append(ImageRecord(key, prompt, int(seed), str(path), bool(nsfw), False,
                                       image if image.mode == "RGB" else image.convert("RGB")))
        if rows:
            with self._write() as db:
                db.executemany("INSERT OR REPLACE INTO images VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        return records

    def _write_file(self, path: Path, data: bytes) -> None:
        """Write `data` to `path` atomically (temporary name, then rename; no leftover on failure)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with self._errors():
                tmp.write_bytes(data)
                os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def get_images(self, keys: Sequence[str], verify: bool = True, local_only: bool = False
                   ) -> dict[str, ImageRecord]:
        """The stored images among `keys` whose files exist and (with `verify`) match their hash;
        with `local_only`, only those generated here (not imported from an untrusted archive)."""
        found: dict[str, ImageRecord] = {}
        select = "SELECT key, prompt, seed, path, sha256, nsfw FROM images"
        if local_only:
            select += " WHERE provenance='local' AND"
            rows = []
            for marks, chunk in in_chunks(keys):
                rows += self._read(f"{select} key IN ({marks})", chunk)
        else:
            rows = self._read_in(select, "key", keys)
        for row in rows:
            path = Path(row["path"])
            if not path.is_absolute() or not path.exists():
                path = self._image_path(row["key"])  # data dir moved or imported elsewhere
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if verify and hashlib.sha256(data).hexdigest() != row["sha256"]:
                continue
            found[row["key"]] = ImageRecord(row["key"], row["prompt"], row["seed"], str(path),
                                            bool(row["nsfw"]), True)
        return found

    def refusal_placeholder(self) -> Path:
        """A plain grey PNG shown where a refused image would be."""
        path = self.data_dir / "refused.png"
        if not path.exists():
            tmp = path.with_name(f".refused.{uuid.uuid4().hex}.tmp")
            Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp, format="PNG")
            os.replace(tmp, path)
        return path

    def put_refusal(self, key: str, generator_id: str, prompt: str, seed: int, message: str) -> ImageRecord:
        """Record that the generator refused (prompt, seed). Returns a record flagged nsfw and
        refused, pointing at the placeholder (it is not an image: metrics exclude it)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO refusals VALUES (?,?,?,?,?,?)",
                       (key, generator_id, prompt, int(seed), str(message), time.time()))
        return ImageRecord(key, prompt, int(seed), str(self.refusal_placeholder()), True, False, refused=str(message))

    def get_refusals(self, keys: Sequence[str]) -> dict[str, ImageRecord]:
        """The recorded refusals among `keys`, as refused records."""
        rows = self._read_in("SELECT key, prompt, seed, message FROM refusals", "key", keys)
        placeholder = str(self.refusal_placeholder()) if rows else ""
        return {r["key"]: ImageRecord(r["key"], r["prompt"], r["seed"], placeholder, True, True,
                                      refused=r["message"]) for r in rows}

    def image_rows(self, keys: Sequence[str]) -> list[dict]:
        return [dict(r) for r in self._read_in("SELECT * FROM images", "key", keys)]

    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        return {row["key"]: np.frombuffer(row["vector"], dtype=np.float32).copy()
                for row in self._read_in("SELECT key, vector FROM embeddings", "key", keys)}

    def put_embeddings(self, rows: Iterable[tuple[str, str, str, np.ndarray]]) -> None:
        """rows: (key, subject, evaluator, vector)."""
        now = time.time()
        data = [(k, s, e, int(v.shape[-1]), np.asarray(v, np.float32).tobytes(), now) for k, s, e, v in rows]
        if data:
            with self._write() as db:
                db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?,?,?,?,?,?)", data)

    def get_answers(self, keys: Sequence[str]) -> dict[str, str]:
        return {row["key"]: row["answer"] for row in self._read_in("SELECT key, answer FROM answers", "key", keys)}

    def get_scored_answers(self, keys: Sequence[str]) -> dict[str, dict]:
        """{key: {"answer", "probs" (dict, or None when the evaluator gave none), "text"}} of the stored answers."""
        return {row["key"]: {"answer": row["answer"], "probs": json.loads(row["probs"]) if row["probs"] else None,
                             "text": row["text"]}
                for row in self._read_in("SELECT key, answer, probs, text FROM answers", "key", keys)}

    def put_answers(self, rows: Iterable[tuple]) -> None:
        """rows: (key, image_key, evaluator, question, choices_json, answer), optionally followed by
        (probs, text): the class probabilities (a dict, or None) and the evaluator's own words."""
        now = time.time()
        data = [(*r[:6], json.dumps(r[6]) if len(r) > 6 and r[6] else "", str(r[7] or "") if len(r) > 7 else "", now)
                for r in rows]
        if data:
            with self._write() as db:
                db.executemany("INSERT OR REPLACE INTO answers (key, image_key, evaluator, question, choices, answer, "
                               "probs, text, created) VALUES (?,?,?,?,?,?,?,?,?)", data)

    def scored_answers_to(self, evaluator: str, question: str, choices_json: str) -> dict[str, tuple[str, float]]:
        """{image key: (answer, its probability)} of every stored answer `evaluator` gave `question` with these
        choices and a probability per class (the distilled evaluator's pool of teacher answers)."""
        rows = self._read("SELECT image_key, answer, probs FROM answers WHERE evaluator=? AND question=? AND "
                          "choices=? AND probs != ''", (evaluator, question, choices_json))
        return {r["image_key"]: (r["answer"], max(json.loads(r["probs"]).values(), default=0.0)) for r in rows}

    def get_probe(self, key: str) -> dict | None:
        """The stored probe record of that key (engine/core/distilled.py), or None."""
        rows = self._read("SELECT record FROM probes WHERE key=?", (key,))
        return json.loads(rows[0]["record"]) if rows else None

    def put_probe(self, key: str, teacher: str, embedder: str, question: str, choices_json: str, record: dict) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO probes VALUES (?,?,?,?,?,?,?)",
                       (key, teacher, embedder, question, choices_json, json.dumps(record), time.time()))

    def answers_for_image(self, image_key: str) -> list[dict]:
        return [dict(r) for r in self._read(
            "SELECT evaluator, question, choices, answer, probs, text FROM answers WHERE image_key=? "
            "ORDER BY created, evaluator, question, choices",   # answers stored together share `created`
            (image_key,))]

    def get_llm_reply(self, key: str) -> str | None:
        rows = self._read("SELECT reply FROM llm_replies WHERE key=?", (key,))
        return rows[0]["reply"] if rows else None

    def put_llm_reply(self, key: str, model: str, request: dict, reply: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO llm_replies VALUES (?,?,?,?,?)",
                       (key, model, json.dumps(request, sort_keys=True, default=str), reply, time.time()))

    def image_path_for(self, key: str) -> Path:
        """Where this store keeps (or would keep) the PNG of image `key`."""
        return self._image_path(key)

    def touch(self, keys: Sequence[str]) -> None:
        """Record that these images were just used (least-recently-used clean-up keeps them longest)."""
        if keys:
            with self._write() as db:
                now = time.time()
                for marks, chunk in in_chunks(keys):
                    db.execute(f"UPDATE images SET used=? WHERE key IN ({marks})", (now, *chunk))

    def present_image_keys(self, keys: Sequence[str]) -> set[str]:
        """The keys among `keys` that have a row and a file (a stat, no hashing): a cheap check
        for planning work. `get_images` still verifies every file before it is used."""
        return {row["key"] for row in self._read_in("SELECT key, path FROM images", "key", list(dict.fromkeys(keys)))
                if Path(row["path"]).is_file() or self._image_path(row["key"]).is_file()}

    def adopt_images(self, rows: Iterable[dict]) -> int:
        """Add the `images` rows of PNGs another process already wrote to this store's canonical
        place (a shard of a distributed job). A row is added only when its file's bytes match its
        sha256; a key already stored with that sha256 is left alone; a stored row whose sha256
        differs is replaced (its file was rewritten). Returns how many rows were added."""
        rows = list(rows)
        known = {r["key"]: r["sha256"] for r in self._read_in(
            "SELECT key, sha256 FROM images", "key", list(dict.fromkeys(r["key"] for r in rows)))}
        columns = ("key", "generator", "prompt", "negative_prompt", "seed", "steps", "guidance", "width",
                   "height", "scheduler", "path", "sha256", "nsfw", "created")
        add = []
        for row in rows:
            key = str(row["key"])
            if known.get(key) == row["sha256"] or len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
                continue  # already stored, or not an image key (keys name files: no paths)
            path = self._image_path(key)
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if hashlib.sha256(data).hexdigest() != row["sha256"]:
                continue
            add.append([{**row, "path": str(path)}[c] for c in columns])
            known[key] = row["sha256"]
        if add:
            with self._write() as db:
                db.executemany(f"INSERT OR REPLACE INTO images ({','.join(columns)}) "
                               f"VALUES ({','.join('?' * len(columns))})", add)
        return len(add)

    def stored_keys(self, table: str, keys: Sequence[str]) -> set[str]:
        """The keys among `keys` that `table` ("answers" or "embeddings") holds."""
        if table not in ("answers", "embeddings"):
            raise ValueError(table)
        return {row["key"] for row in self._read_in(f"SELECT key FROM {table}", "key", list(dict.fromkeys(keys)))}

    def artefact_rows(self, table: str, keys: Sequence[str]) -> list[dict]:
        """Every column of the `table` ("answers" or "embeddings") rows of `keys`, as JSON-ready dicts
        (an embedding's vector base64-encoded): what a shard hands to `adopt_artefacts`."""
        if table not in ("answers", "embeddings"):
            raise ValueError(table)
        rows = [dict(r) for r in self._read_in(f"SELECT * FROM {table}", "key", keys)]
        for row in rows:
            if "vector" in row:
                row["vector"] = base64.b64encode(row["vector"]).decode("ascii")
        return rows

    def adopt_artefacts(self, table: str, rows: Iterable[dict]) -> int:
        """Add `table` ("answers" or "embeddings") rows another process computed (a shard of a
        distributed job), each only when its key is the key of what the row says it is (its
        evaluator, image, and question and choices) and that image is stored; an embedding's vector
        must hold `dim` float32s. A key already stored is left alone. Returns how many were added."""
        if table not in ("answers", "embeddings"):
            raise ValueError(table)
        rows = [r for r in rows if isinstance(r, dict)]
        columns = [c["name"] for c in self._read(f"PRAGMA table_info({table})")]
        subject = "image_key" if table == "answers" else "subject"
        known = self.stored_keys(table, [str(r.get("key")) for r in rows])
        images = {row["key"] for row in self._read_in("SELECT key FROM images", "key",
                                                       list(dict.fromkeys(str(r.get(subject)) for r in rows)))}
        add = []
        for row in rows:
            try:
                if row["key"] in known or row[subject] not in images:
                    continue
                if table == "answers":   # asked for class scores, an answer outside the classes ("other") has none
                    expected = {answer_key(row["evaluator"], row["image_key"], row["question"],
                                           json.loads(row["choices"]), scored=scored) for scored in (True, False)}
                    row = {**row, "answer": str(row["answer"])}
                else:
                    vector = base64.b64decode(row["vector"], validate=True)
                    if len(vector) != 4 * int(row["dim"]):
                        continue
                    expected, row = {embedding_key(row["evaluator"], row["subject"])}, {**row, "vector": vector}
            except (KeyError, TypeError, ValueError):
                continue   # a row without its fields, or with ones of the wrong kind
            if row["key"] not in expected:
                continue
            add.append({c: row[c] for c in columns if c in row})   # a column it lacks takes its default
            known.add(row["key"])
        if not add:
            return 0
        with self._write() as db:
            for names in dict.fromkeys(tuple(r) for r in add):
                db.executemany(f"INSERT OR IGNORE INTO {table} ({','.join(names)}) VALUES ({','.join('?' * len(names))})",
                               [tuple(r.values()) for r in add if tuple(r) == names])
        return len(add)

    def write_image_file(self, key: str, data: bytes) -> Path:
        """Write an image file at key's canonical place (atomically). Returns its path."""
        if not is_key(key):
            raise StoreError(f"'{key[:80]}' is not an image key")
        path = self._image_path(key)
        self._write_file(path, data)
        return path

    def remove_image_files(self, keys: Sequence[str]) -> None:
        """Remove the files of these keys (a failed import's files; their rows were never written)."""
        for key in keys:
            if is_key(key):
                self._image_path(key).unlink(missing_ok=True)
