"""The engine's evaluator caches: image and text embeddings, VQA answers and captions, and LLM
replies, each computed once and then served from the store (a part of `Engine`)."""
from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from ..backends.base import DEFAULT_CANT_TELL_BELOW, ClassAnswer, label_of, logit_temperature
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

    def answer_probs(self, records: Sequence[ImageRecord], question: str,
                     choices: Sequence[str] | None = None) -> list[dict | None]:
        """Per image {class: probability} (summing to 1) of an evaluator that scores the classes, else None."""
        return [a.probs for a in self.ask_scored(records, question, choices)]

    def ask_scored(self, records: Sequence[ImageRecord], question: str,
                   choices: Sequence[str] | None = None) -> list[ClassAnswer]:
        """One ClassAnswer per image, cached per (VQA model, image, question, choices): with `choices`
        and an evaluator that scores them (`answer_classes`), the probability of every choice and
        the evaluator's own words; otherwise its answer alone (free text mapped onto the choices)."""
        vqa_id = self.model_id("vqa")
        scored = self.scores_classes(choices)
        keys = [answer_key(vqa_id, r.key, question, choices, scored=scored) for r in records]
        found = self.store.get_scored_answers(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            images = [records[i].image for i in todo]
            with self._backend("vqa") as vqa:
                answers = (vqa.answer_classes(images, question, list(choices)) if scored else
                           [ClassAnswer(a) for a in vqa.answer(images, question, list(choices) if choices else None)])
            self.count(answers_computed=len(todo))
            self.store.put_answers([(keys[i], records[i].key, vqa_id, question, choices_json(choices), a.answer,
                                     a.probs, a.text) for i, a in zip(todo, answers)])
            found.update({keys[i]: {"answer": a.answer, "probs": a.probs, "text": a.text} for i, a in zip(todo, answers)})
        return [ClassAnswer(found[k]["answer"], found[k]["probs"], found[k]["text"]) for k in keys]

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
                 seed: int = 0, retries: int = 2, max_tokens: int = 1024):
        """Ask the LLM for JSON, repair and validate it (engine.backends.llm_json)."""
        from ..backends.llm_json import ask_json

        return ask_json(self.llm, messages, validate=validate, retries=retries,
                        temperature=temperature, seed=seed, max_tokens=max_tokens)


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
