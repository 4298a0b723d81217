"""The engine's evaluator caches: image and text embeddings, VQA answers and captions, and LLM
replies, each computed once and then served from the store (a part of `Engine`)."""
from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from ..backends import question_problem
from ..backends.base import (DEFAULT_CANT_TELL_BELOW, ClassAnswer, ModelSpec, answer_all, label_of,
                             logit_temperature)
from ..common.errors import InputError
from ..store.store import CAPTION, ImageRecord, answer_key, choices_json, content_key, embedding_key


class Evaluation:
    """Engine's embeddings, answers, captions and LLM replies (a part of `Engine`)."""

    def embed_images(self, records: Sequence[ImageRecord]) -> np.ndarray:
        """(n, d) normalised image embeddings, cached per (embedder, image key)."""
        emb_id = self.model_id("embedder")
        keys = [embedding_key(emb_id, r.key) for r in records]
        return self._cached_embeddings(keys, records, emb_id, lambda e, items: e.embed_images(
            [r.image for r in items]), subject=lambda r: r.key)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) normalised text embeddings, cached per (embedder, text)."""
        emb_id = self.model_id("embedder")
        keys = [content_key("text-embedding", emb_id, t) for t in texts]
        return self._cached_embeddings(keys, list(texts), emb_id, lambda e, items: e.embed_texts(items),
                                       subject=lambda t: t)

    def logit_temperature(self) -> tuple[float, float]:
        """(scale, bias) of the embedder's image-text logits, scale · cosine + bias: the loaded model's learned
        temperature (base.logit_temperature; 100 and 0 for CLIP and for an embedder that states none)."""
        spec, context = self._spec_and_context("embedder")
        return logit_temperature(self.models.peek(spec, **context))

    def _cached_embeddings(self, keys, items, emb_id, compute: Callable, subject: Callable) -> np.ndarray:
        found = self.store.get_embeddings(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            with self._backend("embedder") as embedder:
                vectors = compute(embedder, [items[i] for i in todo])
            self.count(embeddings_computed=len(todo))
            rows = [(keys[i], subject(items[i]), emb_id, np.asarray(v, np.float32)) for i, v in zip(todo, vectors)]
            self.store.put_embeddings(rows)
            found.update({r[0]: r[3] for r in rows})
        if not keys:
            return np.zeros((0, 0), np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32)

    cant_tell_below: float = DEFAULT_CANT_TELL_BELOW   # a run's view takes its request's (`for_run`)

    def ask(self, records: Sequence[ImageRecord], question: str,
            choices: Sequence[str] | None = None) -> list[str]:
        """One VQA answer per image (`ask_scored`): with `choices`, the most probable of them, or
        CANT_TELL where that probability is below `cant_tell_below`, or what the evaluator said
        outside them ("other")."""
        return [label_of(a, self.cant_tell_below) for a in self.ask_scored(records, question, choices)]

    def ask_each(self, records: Sequence[ImageRecord],
                 asks: Sequence[tuple[str, Sequence[str] | None]]) -> list[list[str]]:
        """Per (question, choices) of `asks`, `ask`'s answers, every question at once (`ask_many`)."""
        return [[label_of(a, self.cant_tell_below) for a in column] for column in self.ask_many(records, asks)]

    def answer_probs(self, records: Sequence[ImageRecord], question: str,
                     choices: Sequence[str] | None = None) -> list[dict | None]:
        """Per image {class: probability} (summing to 1) of an evaluator that scores the classes, else None."""
        return [a.probs for a in self.ask_scored(records, question, choices)]

    def ask_scored(self, records: Sequence[ImageRecord], question: str,
                   choices: Sequence[str] | None = None) -> list[ClassAnswer]:
        """One ClassAnswer per image, cached per (VQA model, image, question, choices): with `choices`
        and an evaluator that scores them (`answer_classes`), the probability of every choice and
        the evaluator's own words; otherwise its answer alone (free text mapped onto the choices).
        `ask_many` with one question."""
        return self.ask_many(records, [(question, choices)])[0]

    def ask_many(self, records: Sequence[ImageRecord],
                 asks: Sequence[tuple[str, Sequence[str] | None]]) -> list[list[ClassAnswer]]:
        """Per (question, choices) of `asks`, one ClassAnswer per image (as `ask_scored`), every question at
        once: the scored answers the store lacks come from one call of the evaluator per group of images
        missing the same questions (base.answer_all: its `answer_questions` preprocesses and encodes each
        image once for all of them; clip_vqa over the preset's own embedder reads the stored image
        embeddings); free answers one question at a time. Each answer is still cached per (VQA model,
        image, question, choices), so a stored answer is a hit however it was asked."""
        asks = [(question, list(choices) if choices else None) for question, choices in asks]
        vqa_id = self.model_id("vqa")
        scored = [self.scores_classes(choices) for _, choices in asks]
        keys = [[answer_key(vqa_id, r.key, q, c, scored=s) for r in records] for (q, c), s in zip(asks, scored)]
        found = self.store.get_scored_answers([k for row in keys for k in row])
        missing = [[i for i, k in enumerate(row) if k not in found] for row in keys]
        if any(missing):
            fresh = self._compute_answers(records, asks, scored, missing)
            self.count(answers_computed=len(fresh))
            self.store.put_answers([(keys[a][i], records[i].key, vqa_id, asks[a][0], choices_json(asks[a][1]),
                                     got.answer, got.probs, got.text) for (a, i), got in fresh.items()])
            found.update({keys[a][i]: {"answer": got.answer, "probs": got.probs, "text": got.text}
                          for (a, i), got in fresh.items()})
        return [[ClassAnswer(found[k]["answer"], found[k]["probs"], found[k]["text"]) for k in row] for row in keys]

    def _compute_answers(self, records, asks, scored: list[bool], missing: list[list[int]]) -> dict:
        """{(ask index, image index): ClassAnswer} of the missing answers: the scored questions of the images
        that miss the same ones in one `answer_all` call, the free questions one `answer` call each."""
        groups: dict[tuple[int, ...], list[int]] = {}
        lacking = [set(rows) if scored[a] else set() for a, rows in enumerate(missing)]
        for i in range(len(records)):
            wanted = tuple(a for a, rows in enumerate(lacking) if i in rows)
            if wanted:
                groups.setdefault(wanted, []).append(i)
        spec, context = self._spec_and_context("vqa")
        if spec.backend == "distilled":   # probes on stored embeddings, taught by the teacher (engine/core/distilled.py)
            from .distilled import distilled_answers

            wanted = {a: sorted(rows) for a, rows in enumerate(lacking) if rows}
            out = distilled_answers(self, self.models.peek(spec, **context), records, asks, wanted) if wanted else {}
            with self._backend("vqa") as vqa:
                out.update(self._free_answers(vqa, records, asks, scored, missing))
            return out
        contexts = {wanted: self._stored_embeddings(self.models.peek(spec, **context), [records[i] for i in images])
                    for wanted, images in groups.items()}   # before the evaluator's lock: the embedder has its own
        out: dict[tuple[int, int], ClassAnswer] = {}
        with self._backend("vqa") as vqa:
            for wanted, images in groups.items():
                answers = answer_all(vqa, [records[i].image for i in images], [asks[a] for a in wanted],
                                     **contexts[wanted])
                out.update({(a, i): got for a, column in zip(wanted, answers) for i, got in zip(images, column)})
            out.update(self._free_answers(vqa, records, asks, scored, missing))
        return out

    @staticmethod
    def _free_answers(vqa, records, asks, scored: list[bool], missing: list[list[int]]) -> dict:
        """{(ask index, image index): ClassAnswer} of the missing free answers, one `answer` call per question."""
        out = {}
        for a, (question, choices) in enumerate(asks):
            if missing[a] and not scored[a]:
                replies = vqa.answer([records[i].image for i in missing[a]], question, choices)
                out.update({(a, i): ClassAnswer(reply) for i, reply in zip(missing[a], replies)})
        return out

    def answer_sources(self, records: Sequence[ImageRecord], question: str, choices: Sequence[str]) -> dict | None:
        """For the distilled evaluator: how many of its answers to `question` about `records` came from its probe
        and how many from its teacher, the probe's held-out agreement and a sentence when it is not used
        (engine/core/distilled.answer_sources); None for any other evaluator."""
        spec, context = self._spec_and_context("vqa")
        if spec.backend != "distilled" or not choices:
            return None
        from .distilled import answer_sources

        return answer_sources(self, self.models.peek(spec, **context), records, question, list(choices))

    def _stored_embeddings(self, vqa, records) -> dict:
        """{"embeddings": the records' stored image embeddings} when `vqa` answers from the preset's own
        embedder (clip_vqa over the same model: the embedding it needs is the one the store keeps), else {}."""
        own = getattr(vqa, "embedder", None)
        spec, context = self._spec_and_context("embedder")
        if own is None or getattr(own, "id", None) != getattr(self.models.peek(spec, **context), "id", object()):
            return {}
        return {"embeddings": self.embed_images(records)}

    def scores_classes(self, choices: Sequence[str] | None) -> bool:
        """Whether the VQA evaluator answers `choices` with a probability per class (it has
        `answer_classes`): such answers are keyed apart (`answer_key(scored=True)`)."""
        if not choices:
            return False
        spec, context = self._spec_and_context("vqa")
        return callable(getattr(self.models.peek(spec, **context), "answer_classes", None))

    def caption(self, records: Sequence[ImageRecord]) -> list[str]:
        """One caption per image, cached like answers under the pseudo-question '<caption>'."""
        vqa_id = self.model_id("vqa")
        keys = [answer_key(vqa_id, r.key, CAPTION) for r in records]
        found = self.store.get_answers(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            with self._backend("vqa") as vqa:
                captions = vqa.caption([records[i].image for i in todo])
            self.count(answers_computed=len(todo))
            rows = [(keys[i], records[i].key, vqa_id, CAPTION, "[]", c) for i, c in zip(todo, captions)]
            self.store.put_answers(rows)
            found.update({r[0]: r[5] for r in rows})
        return [found[k] for k in keys]

    @property
    def llm(self) -> "CachedLLM":
        """The preset's LLM behind the store's reply cache (same request -> same reply)."""
        return CachedLLM(self)

    def ask_json(self, messages: list[dict], validate: Callable, *, temperature: float = 1.0,
                 seed: int = 0, retries: int | None = None, max_tokens: int = 1024):
        """Ask the LLM for JSON, repair and validate it (engine.backends.llm_json): at most 1 + `retries`
        calls (default JSON_RETRIES re-asks; a request's estimate counts JSON_ATTEMPTS per question)."""
        from ..backends.llm_json import JSON_RETRIES, ask_json

        retries = JSON_RETRIES if retries is None else retries
        return ask_json(self.llm, messages, validate=validate, retries=retries,
                        temperature=temperature, seed=seed, max_tokens=max_tokens)


def axes_left_out(evaluators: Sequence[ModelSpec], questions: dict[str, str]) -> dict[str, str]:
    """{axis: why} for the axes of `questions` (axis -> question) that one of `evaluators` cannot
    answer (the faces evaluator answers only gender and age): a comparison of evaluators leaves them
    out, and says so, before any image is made."""
    left_out = {}
    for axis, question in questions.items():
        problem = next(filter(None, (question_problem(spec, [question]) for spec in evaluators)), None)
        if problem:
            left_out[axis] = problem
    return left_out


def check_comparable(evaluators: Sequence[ModelSpec], questions: dict[str, str]) -> dict[str, str]:
    """`axes_left_out`, or InputError in one sentence when no axis is left that every evaluator answers."""
    if not evaluators:
        return {}
    if not questions:
        raise InputError("other evaluators answer the axes with classes (gender, age, skin tone, ...); "
                         "none of these axes has classes to compare them on")
    left_out = axes_left_out(evaluators, questions)
    if len(left_out) == len(questions):
        raise InputError(f"no axis can be compared across these evaluators: {next(iter(left_out.values()))}")
    return left_out


class CachedLLM:
    """A TextGenerator that answers from the store when the exact request was seen before."""

    def __init__(self, engine):   # the Engine whose LLM and store it uses
        self.engine = engine
        self.id = engine.model_id("llm")
        self._settings = getattr(engine.models.peek(engine.preset.llm), "generation_settings", None)

    def chat(self, messages, *, temperature: float = 1.0, max_tokens: int = 1024, seed: int = 0) -> str:
        """Returns the reply to `messages`, from the store when this exact request was answered before.
        The request recorded with the reply (its provenance, and part of its key) carries the backend's
        effective decoding settings (`generation_settings`), not only the temperature asked for."""
        request = {"messages": list(messages), "temperature": temperature, "max_tokens": max_tokens,
                   "seed": seed}
        if callable(self._settings):
            request["decoding"] = self._settings(temperature)
        key = content_key("llm", self.id, request)
        reply = self.engine.store.get_llm_reply(key)
        if reply is not None:
            self.engine.count(llm_cache_hits=1)
            return reply
        with self.engine._backend("llm") as llm:
            self.engine.charge(llm_calls=1, what="llm")   # every call a visitor's work makes, any backend
            reply = llm.chat(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.engine.count(llm_calls=1)
        self.engine.store.put_llm_reply(key, self.id, request, reply)
        return reply


def llm_map(engine, fn: Callable, items: Sequence) -> list:
    """[fn(item) for item in items] for independent LLM calls: through an OpenAI-compatible server
    (`--llm openai:`, e.g. `vllm serve`) at most its option `concurrency` (default
    chat_llm.DEFAULT_CONCURRENCY) at once, so the server batches them; one after another for a local
    model. In order; the first error raised is raised."""
    from ..backends.chat_llm import DEFAULT_CONCURRENCY

    spec = engine.preset.llm
    width = int(spec.options.get("concurrency", DEFAULT_CONCURRENCY)) if spec.backend == "openai" else 1
    if width <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(width, len(items))) as pool:   # each call in this context (the visitor)
        return [f.result() for f in [pool.submit(contextvars.copy_context().run, fn, item) for item in items]]
