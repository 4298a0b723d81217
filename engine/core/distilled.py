"""The distilled evaluator's probes (`--vqa distilled`, engine/backends/distilled.py): per closed-set question
a logistic-regression probe (scikit-learn) on the image embeddings the store keeps, trained on the teacher
evaluator's answers; where the probe is unsure or not good enough, the teacher answers.

For a question asked of some images (`distilled_answers`):

1. The probe stored for (teacher, embedder, question, choices) is reused. Without one, a calibration sample
   of the images (`calibration_sample`: the share `sample`, at least `min_sample`, stratified by prompt,
   seeded) is asked of the teacher, every such question at once. The probe is trained on every image whose
   teacher answer and embedding the store holds (the sample, and the teacher's earlier answers: image sets
   asked one after another build the pool up), once they are `min_sample` or more.
2. Its agreement with the teacher is measured on a seeded `held_out` share of them kept out of training
   (accuracy and Cohen's κ with their intervals, metrics.agreement); a probe under `min_agreement` is stored
   but not used (`probe_note` says so in one sentence). A probe is trained again once its pool has doubled
   (the teacher's answers to images the probe was unsure of join it).
3. An image the teacher has answered keeps the teacher's answer; any other image gets the probe's
   probabilities, unless their top is under `teacher_below`: then the teacher answers it.

The teacher's "can't tell" (its top probability under the engine's threshold) is a class the probe learns
too: where the teacher cannot tell (a question about what it does not see), the probe says so as well, with
no class above another, instead of sending every such image back to the teacher. A probe whose pool is
"can't tell" alone always says so (its held-out agreement still measured); one real class alone is no probe.

A probe is stored with its provenance (teacher id, embedder id, the sample's image keys, the held-out
figures, scikit-learn's version) and reused across runs of the same embedder and teacher. Which answers
came from the probe and which from the teacher (`answer_sources`) is read back from the store: an answer
is the teacher's exactly when the teacher's own answer to that image is stored.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from ..backends.base import CANT_TELL, ClassAnswer, ModelSpec, class_answer
from ..common.errors import ModelLoadError
from ..metrics.agreement import agreement
from ..store.store import choices_json, content_key, embedding_key

PROBE_FORMAT = 1


def teacher_spec(spec: ModelSpec) -> ModelSpec:
    """The teacher the distilled evaluator `spec` names (option teacher, "backend:model" as `--vqa` takes it,
    with option teacher_options, a JSON object, as its options);
    ModelLoadError (one sentence) when there is none or it is distilled itself."""
    from ..models.presets import parse_model_override

    text = str(spec.options.get("teacher") or "").strip()
    if not text:
        raise ModelLoadError("the distilled evaluator needs a teacher: --vqa-option teacher=BACKEND:MODEL "
                             "(e.g. teacher=blip_vqa:Salesforce/blip-vqa-base)")
    teacher = parse_model_override(text, "vqa")
    if teacher.backend == "distilled":
        raise ModelLoadError("the distilled evaluator's teacher cannot be distilled itself")
    options = spec.options.get("teacher_options") or {}
    if not isinstance(options, dict):
        raise ModelLoadError("the distilled evaluator's teacher_options are a JSON object, e.g. "
                             "teacher_options='{\"max_new_tokens\": 8}'")
    return ModelSpec(teacher.backend, teacher.model, dict(options))


def probe_key(teacher_id: str, embedder_id: str, question: str, choices) -> str:
    return content_key("probe", teacher_id, embedder_id, question, choices_json(choices))


def calibration_sample(records: Sequence, share: float, minimum: int, seed: int) -> list[int]:
    """Indices of a seeded sample of `records`: `share` of them and at least `minimum` (all when fewer),
    stratified by prompt (each prompt's images in proportion, largest remainders rounded up)."""
    n = len(records)
    size = min(n, max(math.ceil(share * n), minimum))
    by_prompt: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_prompt.setdefault(r.prompt, []).append(i)
    quotas = {p: size * len(ix) / n for p, ix in by_prompt.items()} if n else {}
    counts = {p: int(q) for p, q in quotas.items()}
    for p in sorted(quotas, key=lambda p: (counts[p] - quotas[p], p))[:size - sum(counts.values())]:
        counts[p] += 1
    rng = np.random.default_rng([seed, n])
    chosen = []
    for p in sorted(by_prompt):
        ix = sorted(by_prompt[p], key=lambda i: records[i].key)
        chosen += [ix[j] for j in sorted(rng.permutation(len(ix))[:counts[p]])]
    return sorted(chosen)


def probe_columns(record: dict) -> list[str]:
    """What a probe's probabilities are of: its record's choices (lower-case), then CANT_TELL when the teacher
    said it in training."""
    return list(record["choices"]) + ([CANT_TELL] if CANT_TELL in record["classes"] else [])


def probe_probabilities(record: dict, vectors: np.ndarray) -> np.ndarray:
    """(n, len(probe_columns)) the probe's probability of each choice and of "can't tell" (0 for what the
    teacher never gave in training): scikit-learn's LogisticRegression.predict_proba from its stored
    weights (a sigmoid for two classes, else a softmax); 1 for its one class when it has one."""
    from scipy.special import expit, softmax

    columns = probe_columns(record)
    out = np.zeros((len(vectors), len(columns)))
    if record.get("constant"):
        out[:, columns.index(record["constant"])] = 1.0
        return out
    coef, intercept = np.asarray(record["coef"], float), np.asarray(record["intercept"], float)
    logits = np.asarray(vectors, float) @ coef.T + intercept
    fitted = np.column_stack([1 - expit(logits[:, 0]), expit(logits[:, 0])]) if coef.shape[0] == 1 \
        else softmax(logits, axis=1)
    for j, c in enumerate(record["classes"]):
        out[:, columns.index(c)] = fitted[:, j]
    return out


def fit_probe(keys: list[str], vectors: np.ndarray, labels: list[str], choices: list[str], settings) -> dict:
    """Returns a probe record trained on (vectors, labels: choices or CANT_TELL) with `settings.held_out` of
    them (seeded) kept out to measure its agreement with the labels (metrics.agreement: accuracy, Cohen's κ,
    their intervals)."""
    import sklearn
    from sklearn.linear_model import LogisticRegression

    order = np.argsort(keys)
    rng = np.random.default_rng([settings.seed, len(keys)])
    shuffled = order[rng.permutation(len(order))]
    cut = max(1, int(round(settings.held_out * len(keys))))
    test, train = shuffled[:cut], shuffled[cut:]
    record = {"format": PROBE_FORMAT, "choices": list(choices), "n_pool": len(keys), "n_train": int(len(train)),
              "n_held_out": int(len(test)), "sample": sorted(keys), "min_agreement": settings.min_agreement,
              "sklearn": sklearn.__version__, "created": time.time()}
    universe = list(choices) + [CANT_TELL]
    present = sorted({labels[i] for i in train}, key=universe.index)
    if present == [CANT_TELL]:   # the teacher could not tell any image it was shown: nor can the probe
        record.update(classes=present, constant=CANT_TELL)
    elif len(present) < 2:
        return {**record, "classes": present, "usable": False, "held_out": None,
                "why": f"the teacher gave one answer ({present[0] if present else 'none'}) to every calibration image"}
    else:
        model = LogisticRegression(max_iter=2000).fit(vectors[train], [labels[i] for i in train])
        record.update(classes=[str(c) for c in model.classes_], coef=model.coef_.tolist(),
                      intercept=model.intercept_.tolist())
    columns = probe_columns(record)
    predicted = [columns[j] for j in probe_probabilities(record, vectors[test]).argmax(axis=1)]
    held_out = agreement([labels[i] for i in test], predicted, universe if CANT_TELL in labels else list(choices),
                         seed=settings.seed)
    record["held_out"] = {k: held_out[k] for k in ("n", "accuracy", "accuracy_ci", "kappa", "kappa_ci")}
    record["usable"] = held_out["accuracy"] is not None and held_out["accuracy"] >= settings.min_agreement
    if not record["usable"]:
        record["why"] = (f"its held-out agreement with the teacher is {held_out['accuracy']:.2f}, under "
                         f"{settings.min_agreement:g}")
    return record


def probe_note(question: str, record: dict | None, teacher_label: str) -> str:
    """One sentence when the probe of `question` is not used (the teacher answers it), else ""."""
    if record is None:
        return (f"no probe for '{question}' yet (fewer calibration answers than it needs): {teacher_label} "
                "answered every image")
    if not record.get("usable"):
        return f"the probe for '{question}' is not used, {record.get('why', '')}: {teacher_label} answered every image"
    return ""


class Distiller:
    """One engine's distilled answers (`distilled_answers`): its evaluator, the teacher's view of the engine
    (answers cached under the teacher's own id), the embedder's id."""

    def __init__(self, engine, vqa):
        self.engine, self.vqa, self.settings = engine, vqa, vqa.settings
        self.teacher = engine.with_vqa(vqa.teacher_spec)
        self.teacher_id = self.teacher.model_id("vqa")
        self.embedder_id = engine.model_id("embedder")

    def probe(self, question: str, choices: list[str]) -> dict | None:
        return self.engine.store.get_probe(probe_key(self.teacher_id, self.embedder_id, question, choices))

    def _train(self, question: str, asked_choices: list, choices: list[str], stored: dict | None) -> dict | None:
        """Trains (and stores) the probe of a question on the store's pool of teacher answers with embeddings,
        when it has `min_sample` or more and, beside a stored probe, twice that one's pool; else `stored`."""
        pool = self.engine.store.scored_answers_to(self.teacher_id, question, choices_json(asked_choices))
        if stored is not None and len(pool) < 2 * stored.get("n_pool", 0):
            return stored
        threshold = self.engine.cant_tell_below   # the teacher's unsure answers: its "can't tell"
        pool = {k: (CANT_TELL if p < threshold else a) for k, (a, p) in pool.items() if a in choices}
        vectors = self.engine.store.get_embeddings([embedding_key(self.embedder_id, k) for k in pool])
        keys = [k for k in sorted(pool) if embedding_key(self.embedder_id, k) in vectors]
        if len(keys) < self.settings.min_sample or (stored is not None and len(keys) < 2 * stored.get("n_pool", 0)):
            return stored
        record = fit_probe(keys, np.stack([vectors[embedding_key(self.embedder_id, k)] for k in keys]),
                           [pool[k] for k in keys], choices, self.settings)
        record.update(teacher=self.teacher_id, embedder=self.embedder_id, question=question)
        self.engine.store.put_probe(probe_key(self.teacher_id, self.embedder_id, question, choices), self.teacher_id,
                                    self.embedder_id, question, choices_json(choices), record)
        return record

    def answers(self, records: Sequence, asks: list, wanted: dict[int, list[int]]) -> dict:
        """{(ask index, image index): ClassAnswer} for the images `wanted[a]` of each scored ask `asks[a]`."""
        choices = {a: [str(c).lower() for c in asks[a][1]] for a in wanted}
        probes = {a: self.probe(asks[a][0], choices[a]) for a in wanted}
        calibrating = [a for a in wanted if not (probes[a] or {}).get("usable")]
        if calibrating:   # a calibration sample asked of the teacher, every such question at once
            sample = calibration_sample(records, self.settings.sample, self.settings.min_sample, self.settings.seed)
            self.engine.embed_images([records[i] for i in sample])
            self.teacher.ask_many([records[i] for i in sample], [asks[a] for a in calibrating])
            for a in calibrating:
                probes[a] = self._train(asks[a][0], asks[a][1], choices[a], probes[a])
        usable = [a for a in wanted if (probes[a] or {}).get("usable")]
        vectors = self.engine.embed_images(records) if usable else None
        out: dict[tuple[int, int], ClassAnswer] = {}
        to_teacher: dict[int, list[int]] = {a: list(wanted[a]) for a in wanted if a not in usable}
        for a in usable:
            known = self._teacher_answered(records, asks[a], wanted[a])
            probs, k = probe_probabilities(probes[a], vectors[wanted[a]]), len(choices[a])
            for i, row in zip(wanted[a], probs):
                if i in known or row.max() < self.settings.teacher_below:
                    to_teacher.setdefault(a, []).append(i)
                elif row.argmax() >= k:   # the teacher's "can't tell": no class above another
                    out[(a, i)] = class_answer(asks[a][1], np.zeros(k))
                else:   # softmax(log p) = p over the choices
                    out[(a, i)] = class_answer(asks[a][1], np.log(np.clip(row[:k], 1e-300, None)))
        out.update(self._ask_teacher(records, asks, to_teacher))
        for a in usable:   # the teacher's answers to the probe's unsure images grow its pool: twice as large, train again
            if to_teacher.get(a):
                self._train(asks[a][0], asks[a][1], choices[a], probes[a])
        return out

    def _teacher_answered(self, records, ask, images: list[int]) -> set[int]:
        """The images of `images` whose teacher answer to `ask` the store holds."""
        from ..store.store import answer_key

        keys = {answer_key(self.teacher_id, records[i].key, ask[0], ask[1], scored=True): i for i in images}
        return {keys[k] for k in self.engine.store.get_scored_answers(list(keys))}

    def _ask_teacher(self, records, asks, to_teacher: dict[int, list[int]]) -> dict:
        """The teacher's answers for `to_teacher` (ask -> images), one call per group of images missing the
        same questions (each image encoded once for its questions)."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in sorted({i for images in to_teacher.values() for i in images}):
            groups.setdefault(tuple(a for a, images in to_teacher.items() if i in images), []).append(i)
        out = {}
        for group, images in groups.items():
            got = self.teacher.ask_many([records[i] for i in images], [asks[a] for a in group])
            out.update({(a, i): answer for a, column in zip(group, got) for i, answer in zip(images, column)})
        return out


def distilled_answers(engine, vqa, records: Sequence, asks: list, wanted: dict[int, list[int]]) -> dict:
    """{(ask index, image index): ClassAnswer} of the distilled evaluator `vqa` for the images `wanted[a]` of
    each closed-set ask (module docstring)."""
    return Distiller(engine, vqa).answers(records, asks, wanted)


def answer_sources(engine, vqa, records: Sequence, question: str, choices: list[str]) -> dict:
    """{"probe": images answered by the probe, "teacher": by the teacher, "teacher_id", "held_out": the
    probe's held-out agreement (None without a probe), "note": `probe_note`} for the distilled evaluator's
    answers to `question` about `records`."""
    distiller = Distiller(engine, vqa)
    names = [str(c).lower() for c in choices]
    teacher = len(distiller._teacher_answered(records, (question, choices), list(range(len(records)))))
    record = distiller.probe(question, names)
    return {"probe": len(records) - teacher, "teacher": teacher, "teacher_id": distiller.teacher_id,
            "held_out": (record or {}).get("held_out"),
            "note": probe_note(question, record, vqa.teacher_spec.label)}
