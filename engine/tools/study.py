"""User-study packs: validate automatic bias scores against human judgements.

TIBET (thesis App. B, spec §2.12) and MineTheGap validated their scores with crowd studies run
on ad-hoc tooling; this module prepares such a study from runs in the store and analyses it.

Design
- Conditions are image sets: one per (run, set label) of the chosen runs. Each is shown as the
  same `images_per_set` images (sampled with the seed) to every rater, behind an opaque id.
- Question types: `rating` (one set per item, "how strongly does this set show a {axis} bias",
  1–5, as TIBET's US2) and `pair` (two sets per item, "which set is more diverse in {axis}").
- Counterbalancing: the trials (each set for `rating`; every ordered pair of sets for `pair`,
  so each set is on the left exactly as often as on the right in every form) are put in a
  seeded random base order, then each form (rater) takes one row of a Williams balanced Latin
  square over them: every trial, hence every set, appears equally often at every serial
  position once the number of forms is a multiple of the square's rows (n trials: n rows when n
  is even, 2n when odd; the default number of forms), and first-order carry-over is balanced.
- Attention checks: instructed-response items ("select 3 for this item") at seeded random
  positions (never first), showing real sets so they look like the others.
- Participants get one static HTML file (`participant/study.html`, images inlined as JPEG, no
  network, no server) that records answers and response times and saves a CSV through a Blob
  download link. The answer key (`researcher/answer_key.json`) maps the opaque ids back to runs,
  prompts, models and automatic scores, and lists every form's items and the expected answers
  of the checks; it is never given to participants.

Analysis (`load_key`, `read_answers`, `analyse`): packs are bounded like imports and keys to
MAX_KEY_BYTES before anything is inflated, answers by bytes, rows and raters, and every step is
linear in the answers, so an upload a stranger crafted cannot exhaust a public server.
Raters failing any attention check are excluded (optional); agreement
between raters is Krippendorff's alpha (interval for ratings, nominal for pair choices, units =
sets or set pairs; it handles any number of raters and missing answers); each set's human score
(mean rating, or share of comparisons won) is correlated with its automatic score by Spearman's
rho (scipy), as TIBET correlated median ratings with MAD.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import time
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from .. import __version__
from ..common.encoding import parse_json
from ..common.errors import InputError
from ..common.scores import is_finite, is_missing
from ..common.texts import MAX_TEXT_CHARS
from ..runs.history import get_run, run_prompt, run_records, short_model
from ..runs.imports import ArchiveLimits, check_archive

KEY_FORMAT = "gaplens-study-key"
ANSWER_COLUMNS = ["participant", "form", "position", "item", "set_a", "set_b", "answer", "rt_ms"]
RATING_OPTIONS = [("1", "1 · no bias"), ("2", "2"), ("3", "3"), ("4", "4"), ("5", "5 · very strong bias")]
PAIR_OPTIONS = [("left", "Left set"), ("right", "Right set")]
ID_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def question_text(kind: str, axis: str) -> str:
    overall = axis.strip().lower() in ("", "overall", "any")
    if kind == "rating":
        about = ("a social bias (for example in gender, age or skin tone)" if overall else f"a bias in {axis}")
        return f"How strongly does this set of images show {about}? (1 = no bias at all, 5 = a very strong bias)"
    if kind == "pair":
        return ("Which set of images is more diverse overall in the people it shows?" if overall
                else f"Which set of images is more diverse in {axis}?")
    raise InputError(f"unknown question type '{kind}'; choose rating or pair")


# -- design ----------------------------------------------------------------------------------
def williams_rows(n: int) -> list[list[int]]:
    """A Williams (balanced Latin) square over n treatments: n rows for even n, 2n for odd n
    (the square and its mirror). Every treatment is once at every position per n rows, and
    each ordered pair of neighbours occurs equally often."""
    if n < 1:
        return []
    first, lo, hi = [0], 1, n - 1
    for j in range(1, n):
        if j % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [list(reversed(r)) for r in rows]
    return rows


def _token(rng: np.random.Generator, used: set, length: int) -> str:
    while True:
        t = "".join(ID_ALPHABET[i] for i in rng.integers(0, len(ID_ALPHABET), length))
        if t not in used:
            used.add(t)
            return t


def _conditions(engine, run_ids: list[str]) -> list[dict]:
    conditions = []
    for run_id in run_ids:
        run = get_run(engine.store, run_id)
        groups: dict[str, list] = {}
        for record, label in run_records(engine.store, run):
            groups.setdefault(label, []).append(record)
        for label, records in groups.items():
            usable = [r for r in records if not r.nsfw]
            if usable:
                conditions.append({"run": run, "label": label, "records": usable})
    return conditions


def automatic_score(engine, run: dict, label: str, records: list, kind: str, axis: str) -> tuple[float | None, str, str]:
    """(score, what it is, where it came from) of one image set for the question: the stored
    result when the run has it (Single Prompt), else computed from the images with the
    engine's evaluators (cached VQA answers / embeddings) when they are the ones the run was
    made with; None otherwise."""
    overall = axis.strip().lower() in ("", "overall", "any")
    results = run.get("results") or {}
    stored_axes = results.get("axes", {}) if run["method"] == "single_prompt" and not label else {}
    if kind == "rating":
        name = "mean composite bias score over axes" if overall else f"composite bias score ({axis})"
        if overall and stored_axes:
            vals = [m["composite_bias_score"] for m in stored_axes.values() if is_finite(m.get("composite_bias_score"))]
            if vals:
                return float(np.mean(vals)), name, "stored"
        elif axis in stored_axes and is_finite(stored_axes[axis].get("composite_bias_score")):
            return float(stored_axes[axis]["composite_bias_score"]), name, "stored"
    else:
        name = "normalised Vendi score" if overall else f"normalised entropy ({axis})"
        if overall and is_finite((results.get("diversity") or {}).get("vendi_normalised")) and not label:
            return float(results["diversity"]["vendi_normalised"]), name, "stored"
        if axis in stored_axes and is_finite(stored_axes[axis].get("normalised_entropy")):
            return float(stored_axes[axis]["normalised_entropy"]), name, "stored"
    if engine is None:
        return None, name, "unavailable"
    role = "embedder" if kind == "pair" and overall else "vqa"
    ours, theirs = engine.preset.specs()[role].label, (run.get("models") or {}).get(role)
    if theirs and theirs != ours:  # score with the evaluator the run was made with, or not at all
        return None, name, f"unavailable (the run's {role} is {short_model(theirs)}; this engine has {short_model(ours)})"
    try:
        from ..methods.axes import axis_for, normalise_free_answer
        from ..methods.measure import axis_metrics
        from ..methods.single_prompt import DEFAULT_AXES

        if kind == "pair" and overall:
            from ..metrics.diversity import normalised_vendi

            return float(normalised_vendi(engine.embed_images(records))), name, "computed"
        values = []
        axes = [axis_for(a) for a in (DEFAULT_AXES if overall else (axis,))]
        for ax, answers in zip(axes, engine.ask_each(records, [(ax.question, list(ax.values) or None) for ax in axes])):
            labels = answers if ax.values else [normalise_free_answer(x) for x in answers]
            m = axis_metrics(labels, ax, None, "paper")
            values.append(m["composite_bias_score"] if kind == "rating" else m["normalised_entropy"])
        values = [v for v in values if is_finite(v)]
        return (float(np.mean(values)) if values else None), name, "computed"
    except Exception as exc:  # noqa: BLE001 - a missing evaluator must not block building the pack
        return None, name, f"unavailable ({type(exc).__name__}: {exc})"


# A form longer than this tires raters (and invites careless answers): larger designs are split
# into blocks, one block per form. SECONDS_PER_ITEM is a rough reading+answering time per item.
MAX_ITEMS_PER_FORM = 40
SECONDS_PER_ITEM = {"rating": 12, "pair": 15}
# What a study needs, and no more (a request may ask for anything): forms are handed out in turn, so
# 200 serve any number of raters; the key of the largest pack stays under MAX_KEY_BYTES, so its
# answers can be analysed.
MAX_FORMS = 200
MAX_SETS = 40
MAX_IMAGES_PER_SET = 32
MAX_ATTENTION_CHECKS = 6
MAX_THUMBNAIL = 512


def check_design(*, images_per_set, n_raters, n_attention, thumbnail_size=256, max_items=MAX_ITEMS_PER_FORM) -> None:
    """InputError (one sentence) when a study's numbers are outside what a study needs (MAX_FORMS,
    MAX_IMAGES_PER_SET, MAX_ATTENTION_CHECKS, MAX_ITEMS_PER_FORM, MAX_THUMBNAIL); checked before
    anything is read. Returns None."""
    for what, value, low, high in (("raters (forms)", n_raters or 0, 0, MAX_FORMS),
                                   ("images shown per set", images_per_set, 1, MAX_IMAGES_PER_SET),
                                   ("attention checks per form", n_attention, 0, MAX_ATTENTION_CHECKS),
                                   ("items per form", max_items, 1, MAX_ITEMS_PER_FORM),
                                   ("the thumbnail size", thumbnail_size, 32, MAX_THUMBNAIL)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{what} must be a whole number, not {str(value)[:40]!r}") from None
        if not (low <= number <= high and number.is_integer()):
            raise InputError(f"{what} must be a whole number from {low} to {high}; got {str(value)[:40]}"
                             + (": a form can be given to several raters" if what.startswith("raters") else ""))


def build_pack(engine, run_ids, *, question: str = "rating", axis: str = "gender", images_per_set: int = 10,
               seed: int = 0, n_raters: int | None = None, n_attention: int = 2, thumbnail_size: int = 256,
               max_items: int = MAX_ITEMS_PER_FORM) -> dict:
    """Build a study pack from the image sets of `run_ids` (module docstring). Returns
    {"key": answer key, "participant": data embedded in the form (its "sets" filled in by
    the form page), "images": {set id: paths of the images shown}, "thumbnail_size": int};
    `engine.report.study.form_page(pack)` makes the participant's form from it.

    When there are more trials than `max_items` (19 sets make 342 ordered pairs), each form
    shows one block of about `max_items` consecutive trials of a Williams row, and the default
    number of forms is the number of blocks (every trial answered once); the key's design says
    so, with the minutes a form takes."""
    question_text(question, axis)  # validates the question type
    check_design(images_per_set=images_per_set, n_raters=n_raters, n_attention=n_attention,
                 thumbnail_size=thumbnail_size, max_items=max_items)
    run_ids = [r for r in dict.fromkeys(x.strip() for x in run_ids if x and x.strip())]
    if len(run_ids) > MAX_SETS:
        raise InputError(f"a study compares at most {MAX_SETS} image sets; {len(run_ids)} runs are selected")
    conditions = _conditions(engine, run_ids)
    if len(conditions) < 2:
        raise InputError(f"a study needs at least two image sets; the chosen runs have {len(conditions)} "
                         "(pick more runs, or runs with images)")
    if len(conditions) > MAX_SETS:
        raise InputError(f"a study compares at most {MAX_SETS} image sets; the chosen runs have {len(conditions)} "
                         "(pick fewer runs)")
    images_per_set, n_attention = int(float(images_per_set)), int(float(n_attention))
    rng = np.random.default_rng(int(seed))
    used: set = set()

    # Opaque set ids in random order; images sampled and shuffled per set.
    sets, images = {}, {}
    for i in rng.permutation(len(conditions)):
        c = conditions[int(i)]
        set_id = "S" + _token(rng, used, 4)
        pick = rng.permutation(len(c["records"]))[:images_per_set]
        shown = [c["records"][int(j)] for j in pick]
        score, score_name, source = automatic_score(engine, c["run"], c["label"], c["records"], question, axis)
        sets[set_id] = {"run_id": c["run"]["id"], "label": c["label"], "method": c["run"]["method"],
                        "prompt": shown[0].prompt if shown else run_prompt(c["run"]),
                        "generator": short_model((c["run"].get("models") or {}).get("generator", "")),
                        "images_in_set": len(c["records"]), "shown": [{"key": r.key, "seed": r.seed} for r in shown],
                        "auto_score": score, "auto_score_name": score_name, "auto_score_source": source}
        images[set_id] = [str(r.path) for r in shown]
    set_ids = list(sets)

    trials = ([(s,) for s in set_ids] if question == "rating"
              else [tuple(p) for p in itertools.permutations(set_ids, 2)])
    base = [trials[int(i)] for i in rng.permutation(len(trials))]
    rows = williams_rows(len(base))
    max_items = max(1, int(max_items))
    n_blocks = -(-len(base) // max_items)
    block = -(-len(base) // n_blocks)          # blocks of (nearly) equal size
    n_forms = int(float(n_raters)) if n_raters else (len(rows) if n_blocks == 1 else n_blocks)
    if n_forms < 1:
        raise InputError("a study needs at least one rater (form)")
    options = RATING_OPTIONS if question == "rating" else PAIR_OPTIONS
    text = question_text(question, axis)

    key_forms, participant_forms = [], []
    for f in range(n_forms):
        row = rows[(f // n_blocks) % len(rows)]
        b = f % n_blocks
        order = [base[i] for i in row[b * block:(b + 1) * block]]
        total = len(order) + n_attention
        check_positions = set(int(p) for p in rng.choice(np.arange(1, total), size=min(n_attention, total - 1),
                                                         replace=False)) if n_attention and total > 1 else set()
        items, shown_items, t = [], [], 0
        for position in range(total):
            item_id = "Q" + _token(rng, used, 6)
            if position in check_positions:
                shown = (tuple(set_ids[int(i)] for i in rng.choice(len(set_ids), size=len(base[0]), replace=False)))
                expected = options[int(rng.integers(len(options)))][0]
                label = dict(options)[expected] if question == "pair" else expected
                q = (f"Attention check: to show that you read each question, please select “{label}” "
                     f"for this item, whatever the images show.")
                items.append({"item": item_id, "position": position + 1, "kind": "attention", "trial_position": None,
                              "sets": list(shown), "expected": expected})
            else:
                shown, expected, q = order[t], None, text
                items.append({"item": item_id, "position": position + 1, "kind": "trial", "trial_position": t + 1,
                              "sets": list(shown), "expected": None})
                t += 1
            shown_items.append({"item": item_id, "sets": list(shown), "question": q})
        key_forms.append({"form": f + 1, "items": items})
        participant_forms.append({"form": f + 1, "items": shown_items})

    balanced = n_blocks == 1 and n_forms % len(rows) == 0
    items_per_form = max(len(f["items"]) for f in key_forms)
    minutes = items_per_form * SECONDS_PER_ITEM.get(question, 15) / 60
    if n_blocks == 1:
        note = ("every set appears equally often at every position and side" if balanced else
                f"not fully counterbalanced: use a multiple of {len(rows)} forms")
    else:
        note = (f"{len(base)} trials in all, too many for one rater: each form shows one block of at most {block} "
                f"({n_blocks} blocks); {n_forms} form(s) answer "
                f"{'every trial once' if n_forms == n_blocks else 'the blocks in turn'}; use a multiple of "
                f"{n_blocks} forms so every trial is answered equally often (not position-balanced)")
    key = {
        "format": KEY_FORMAT, "format_version": 1, "gaplens_version": __version__, "created": time.time(),
        "seed": int(seed), "question_type": question, "axis": axis, "question": text,
        "options": [o for o, _ in options], "images_per_set": images_per_set, "n_forms": n_forms,
        "n_attention": n_attention,
        "design": {"trials_per_form": min(len(base), block), "trials": len(base), "blocks": n_blocks,
                   "square_rows": len(rows), "balanced": balanced, "items_per_form": items_per_form,
                   "minutes_per_form": round(minutes, 1), "note": note},
        "sets": sets, "forms": key_forms, "balance": balance_table(key_forms, set_ids),
    }
    participant = {"question_type": question, "options": [{"value": v, "label": lab} for v, lab in options],
                   "forms": participant_forms, "sets": {}}
    return {"key": key, "participant": participant, "images": images, "thumbnail_size": int(thumbnail_size)}


def balance_table(forms: list[dict], set_ids: list[str]) -> dict:
    """Per set: how often it is at each trial position (attention checks excluded) and on
    each side, over all forms."""
    n_positions = max((i["trial_position"] or 0) for f in forms for i in f["items"]) if forms else 0
    table = {s: {"positions": [0] * n_positions, "left": 0, "right": 0} for s in set_ids}
    for f in forms:
        for item in f["items"]:
            if item["kind"] != "trial":
                continue
            for side, s in enumerate(item["sets"]):
                table[s]["positions"][item["trial_position"] - 1] += 1
                if len(item["sets"]) == 2:
                    table[s]["left" if side == 0 else "right"] += 1
    return table


def pack_summary(pack: dict) -> dict:
    key = pack["key"]
    d = key["design"]
    text = (f"{len(key['sets'])} image sets, question '{key['question_type']}' on {key['axis']}; {key['n_forms']} "
            f"form(s) of {d['trials_per_form']} items + {key['n_attention']} attention check(s); {d['note']}.")
    if "minutes_per_form" in d:
        text += (f" Each rater answers {d['items_per_form']} items, about {d['minutes_per_form']:.0f} minutes "
                 f"at {SECONDS_PER_ITEM.get(key['question_type'], 15)} s per item.")
    scored = sum(s["auto_score"] is not None for s in key["sets"].values())
    return {"sets": len(key["sets"]), "forms": key["n_forms"], "trials_per_form": d["trials_per_form"],
            "attention_checks": key["n_attention"], "balanced": d["balanced"], "square_rows": d["square_rows"],
            "sets_with_automatic_score": scored, "text": text}


def write_pack(pack: dict, path, form_html: str) -> str:
    """The pack zip: participant/ (the form `form_html`, from `engine.report.study.form_page`,
    and how to use it) and researcher/ (the key). Returns its path."""
    key = pack["key"]
    design = io.StringIO()
    w = csv.writer(design, lineterminator="\n")
    w.writerow(["form", "position", "item", "kind", "trial_position", "set_a", "set_b", "expected",
                "run_a", "label_a", "run_b", "label_b"])
    for f in key["forms"]:
        for item in f["items"]:
            a, b = (item["sets"] + [""])[:2]
            w.writerow([f["form"], item["position"], item["item"], item["kind"], item["trial_position"] or "", a, b,
                        item["expected"] or "", key["sets"][a]["run_id"], key["sets"][a]["label"],
                        key["sets"][b]["run_id"] if b else "", key["sets"][b]["label"] if b else ""])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("participant/study.html", str(form_html))
        zf.writestr("participant/README.txt", PARTICIPANT_README)
        zf.writestr("researcher/answer_key.json", json.dumps(key, indent=1, ensure_ascii=False))
        zf.writestr("researcher/design.csv", design.getvalue())
        zf.writestr("researcher/README.md", RESEARCHER_README.format(summary=pack_summary(pack)["text"],
                                                                    forms=key["n_forms"]))
    return str(path)


PARTICIPANT_README = """Image study

Open study.html in a web browser (no internet connection is needed). Enter the participant ID
and form number you were given, answer every item, then press "Download answers" and send the
downloaded CSV file back to the researcher.
"""

RESEARCHER_README = """# GapLens user-study pack

{summary}

- `participant/study.html`: give this file (and README.txt) to participants. Assign each one a
  form number from 1 to {forms} (e.g. send `study.html#form=3`); each form is one row of the
  counterbalancing design. It works offline and saves the answers as a CSV download.
- `researcher/answer_key.json`: what every opaque set id stands for (run, set label, prompt,
  model, automatic score), every form's items in order, and the expected answers of the
  attention checks. Do not give it to participants. `design.csv` is the same as a table.
- Analyse: `python -m engine runs study analyse --key <this zip> --answers answers-*.csv`, or the
  Runs tab's study importer: Krippendorff's alpha between raters and Spearman's rho between the
  human and automatic scores of the sets.
"""


# -- analysis --------------------------------------------------------------------------------
def krippendorff_alpha(units, level: str = "nominal") -> float:
    """Krippendorff's alpha for reliability data given as units, each the list of values the
    raters gave it (missing answers left out; units with fewer than two values are not
    pairable and are ignored). level: nominal, ordinal, interval or ratio. nan when the data
    have no variation (alpha is undefined) or no pairable unit.

    alpha = 1 − D_o / D_e, D_o = Σ_ck o_ck δ_ck / n and D_e = Σ_ck n_c n_k δ_ck / (n(n − 1)) over the
    coincidence matrix o_ck = Σ_u (pairs (c, k) in u) / (m_u − 1) of the values actually used
    (Krippendorff 2011). The matrix is never built: for nominal data Σ_ck o_ck δ_ck = n − Σ_c o_cc;
    for interval data Σ over a unit's ordered pairs of (x_i − x_j)² is 2(m Σx² − (Σx)²), and
    likewise for D_e; ordinal δ_ck = (Σ_{g=c..k} n_g − (n_c + n_k)/2)² is the interval δ of the
    values' midranks Σ_{g<c} n_g + n_c/2. So alpha takes time linear in the answers (plus sorting
    the distinct values); ratio δ_ck = ((c − k)/(c + k))² sums over pairs of distinct values."""
    units = [[v for v in u if not is_missing(v)] for u in units]
    units = [Counter(u) for u in units if len(u) >= 2]
    if not units:
        return float("nan")
    n_c: Counter = Counter()
    for counts in units:
        n_c.update(counts)
    n = sum(n_c.values())
    if level == "nominal":
        d_o = (n - sum(sum(k * (k - 1) for k in counts.values()) / (sum(counts.values()) - 1) for counts in units)) / n
        d_e = (n * n - sum(k * k for k in n_c.values())) / (n * (n - 1))
    elif level in ("interval", "ordinal"):
        if level == "interval":
            x = {v: float(v) for v in n_c}
        else:
            x, below = {}, 0
            for v in sorted(n_c):
                x[v], below = below + n_c[v] / 2, below + n_c[v]

        def spread(pairs) -> float:  # Σ over ordered pairs of (x_i − x_j)², the values weighted by their counts
            m = sum(k for _, k in pairs)
            return 2 * (m * sum(k * x[v] ** 2 for v, k in pairs) - sum(k * x[v] for v, k in pairs) ** 2)

        d_o = sum(spread(counts.items()) / (sum(counts.values()) - 1) for counts in units) / n
        d_e = spread(n_c.items()) / (n * (n - 1))
    elif level == "ratio":
        values = sorted(n_c)
        if len(values) > MAX_RATIO_VALUES:
            raise InputError(f"ratio alpha compares every pair of distinct values; {len(values)} is more than the "
                             f"{MAX_RATIO_VALUES} it takes")
        x = np.asarray(values, float)
        total = x[:, None] + x[None, :]
        delta = np.where(total == 0, 0.0, ((x[:, None] - x[None, :]) / np.where(total == 0, 1, total)) ** 2)
        index = {v: i for i, v in enumerate(values)}
        d_o = sum(sum(a * b * delta[index[c], index[k]] for c, a in counts.items() for k, b in counts.items())
                  / (sum(counts.values()) - 1) for counts in units) / n
        weights = np.asarray([n_c[v] for v in values], float)
        d_e = float(weights @ delta @ weights) / (n * (n - 1))
    else:
        raise InputError(f"unknown alpha level '{level}'; choose nominal, ordinal, interval or ratio")
    if d_e == 0:
        return float("nan")
    return float(1.0 - d_o / d_e)


QUESTION_OPTIONS = {"rating": [v for v, _ in RATING_OPTIONS], "pair": [v for v, _ in PAIR_OPTIONS]}
# Bounds on what an analysis reads (a visitor of a public GapLens may upload anything): the pack
# with the import's archive rules and a small answer key, answer files by bytes, rows and raters.
STUDY_PACK_LIMITS = ArchiveLimits(entries=32, total_bytes=512 * 2**20, entry_bytes=256 * 2**20)
MAX_KEY_BYTES = 4 * 2**20            # a 40-set pair study's key is ~1 MiB
MAX_ANSWERS_BYTES = 32 * 2**20       # all answer files together
MAX_ANSWER_ROWS = 200_000
MAX_PARTICIPANTS = 10_000
MAX_RATIO_VALUES = 2000
KEY_MEMBER = "researcher/answer_key.json"


def load_key(source) -> dict:
    """The answer key from a pack zip, an answer_key.json path, its text or a dict, checked
    (`check_key`). A pack is bounded like an import (entries, sizes, compression ratio) and
    the key to MAX_KEY_BYTES before anything is inflated."""
    if isinstance(source, dict):
        return check_key(source)
    if isinstance(source, (str, Path)) and len(str(source)) < 4096 and Path(str(source)).exists():
        p = Path(source)
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                check_archive(zf, p.name, STUDY_PACK_LIMITS)
                if KEY_MEMBER not in zf.namelist():
                    raise InputError(f"{p.name} is not a GapLens study pack (no {KEY_MEMBER})")
                if zf.getinfo(KEY_MEMBER).file_size > MAX_KEY_BYTES:
                    raise InputError(f"{p.name}: its answer key unpacks to {zf.getinfo(KEY_MEMBER).file_size / 2**20:.0f}"
                                     f" MiB; a GapLens key is at most {MAX_KEY_BYTES // 2**20} MiB")
                with zf.open(KEY_MEMBER) as member:
                    data = member.read(MAX_KEY_BYTES + 1)
        else:
            if p.stat().st_size > MAX_KEY_BYTES:
                raise InputError(f"{p.name} is {p.stat().st_size / 2**20:.0f} MiB; a GapLens answer key is at most "
                                 f"{MAX_KEY_BYTES // 2**20} MiB")
            data = p.read_bytes()
    elif str(source).strip().startswith("{"):
        data = str(source).encode("utf-8")
    else:
        raise InputError(f"no answer key at {str(source)[:200]} (give the pack zip or {KEY_MEMBER})")
    if len(data) > MAX_KEY_BYTES:
        raise InputError(f"the answer key is more than {MAX_KEY_BYTES // 2**20} MiB; a GapLens key is smaller")
    try:
        key = parse_json(data, "the answer key")
    except ValueError as exc:
        raise InputError(f"{exc} (give the pack zip or {KEY_MEMBER})") from None
    return check_key(key)


def check_key(key) -> dict:
    """`key` when it is a GapLens study answer key `analyse` can read: its question type's
    options, sets described by text and numbers, forms of items naming those sets. InputError
    saying what is wrong otherwise."""
    if not isinstance(key, dict) or key.get("format") != KEY_FORMAT:
        raise InputError("that file is not a GapLens study answer key")

    def bad(what: str) -> InputError:
        return InputError(f"the answer key is damaged: {what}")

    kind, sets, forms = key.get("question_type"), key.get("sets"), key.get("forms")
    if kind not in QUESTION_OPTIONS:
        raise bad(f"unknown question type {str(kind)[:40]!r}")
    if key.get("options") != QUESTION_OPTIONS[kind]:
        raise bad(f"a {kind} question's options are {', '.join(QUESTION_OPTIONS[kind])}")
    if not isinstance(key.get("axis"), str) or not isinstance(key.get("question"), str):
        raise bad("its axis or question is missing")
    text = ("run_id", "label", "prompt", "method", "generator", "auto_score_name")
    if not isinstance(sets, dict) or not all(
            isinstance(v, dict) and all(isinstance(v.get(f), str) for f in text)
            and (v.get("auto_score") is None or is_finite(v.get("auto_score"))) for v in sets.values()):
        raise bad("its sets are not described")
    if not isinstance(forms, list) or not all(isinstance(f, dict) and "form" in f and isinstance(f.get("items"), list)
                                              for f in forms):
        raise bad("its forms are not lists of items")
    width = 1 if kind == "rating" else 2
    for f in forms:
        for item in f["items"]:
            if not (isinstance(item, dict) and isinstance(item.get("item"), str)
                    and item.get("kind") in ("trial", "attention") and isinstance(item.get("sets"), list)
                    and len(item["sets"]) == width and all(isinstance(x, str) and x in sets for x in item["sets"])
                    and (item.get("expected") is None or item["expected"] in QUESTION_OPTIONS[kind])):
                raise bad(f"an item of form {str(f.get('form'))[:20]} is not valid")
    return key


def read_answers(paths) -> list[str]:
    """The texts of the answer CSV files at `paths`, after checking they are at most
    MAX_ANSWERS_BYTES together (nothing is read before that)."""
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    total = sum(p.stat().st_size for p in paths)
    if total > MAX_ANSWERS_BYTES:
        raise InputError(f"the answer files are {total / 2**20:.0f} MiB together; at most "
                         f"{MAX_ANSWERS_BYTES // 2**20} MiB are accepted")
    try:
        return [p.read_text(encoding="utf-8") for p in paths]
    except UnicodeDecodeError:
        raise InputError("an answer file is not UTF-8 text (save the CSV the form downloaded as it is)") from None


def parse_answers(texts) -> list[dict]:
    """Rows of one or more answers CSVs (the form's download; several may be concatenated), at
    most MAX_ANSWER_ROWS rows from MAX_PARTICIPANTS participants, each cell at most
    MAX_TEXT_CHARS characters."""
    rows, participants = [], set()
    for text in ([texts] if isinstance(texts, str) else texts):
        reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
        try:
            missing = {"participant", "item", "answer"} - set(reader.fieldnames or [])
            if missing:
                raise InputError(f"an answers file lacks the column(s) {', '.join(sorted(missing))}; "
                                 f"expected {', '.join(ANSWER_COLUMNS)}")
            for row in reader:
                if row.get("participant") == "participant":  # a repeated header from concatenated files
                    continue
                cells = {k: (v or "").strip() if isinstance(v, str) else "" for k, v in row.items() if k}
                if any(len(v) > MAX_TEXT_CHARS for v in cells.values()):
                    raise InputError(f"answers line {reader.line_num} has a cell over {MAX_TEXT_CHARS} characters")
                rows.append(cells)
                participants.add(cells.get("participant", ""))
                if len(rows) > MAX_ANSWER_ROWS or len(participants) > MAX_PARTICIPANTS:
                    raise InputError(f"the answers hold more than {MAX_ANSWER_ROWS} rows or {MAX_PARTICIPANTS} "
                                     "participants; analyse them in parts")
        except csv.Error as exc:
            raise InputError(f"an answers file is not a readable CSV ({exc})") from None
    return rows


def analyse(key: dict, answers, exclude_inattentive: bool = True) -> dict:
    """Agreement between raters and Spearman correlation of human and automatic set scores."""
    from scipy.stats import spearmanr

    key = check_key(key)
    items = {i["item"]: {**i, "form": f["form"]} for f in key["forms"] for i in f["items"]}
    rows = parse_answers(answers) if not (isinstance(answers, list) and answers and isinstance(answers[0], dict)) else answers
    unknown = sorted({r["item"] for r in rows if r["item"] not in items})
    if unknown:
        raise InputError(f"{len(unknown)} answered item(s) are not in this answer key (e.g. {unknown[0]}): "
                         "are the answers from another study pack?")
    kind = key["question_type"]
    valid = set(key["options"])
    latest: dict[tuple[str, str], str] = {}
    bad = []
    for r in rows:
        answer = r["answer"].lower() if kind == "pair" else r["answer"]
        answer = {"a": "left", "b": "right"}.get(answer, answer)
        if answer not in valid:
            bad.append(r["answer"])
            continue
        latest[(r["participant"], r["item"])] = answer
    participants = sorted({p for p, _ in latest})
    attention = {p: {"passed": 0, "total": 0} for p in participants}
    for (p, item), answer in latest.items():
        if items[item]["kind"] == "attention":
            attention[p]["total"] += 1
            attention[p]["passed"] += int(answer == items[item]["expected"])
    failed = [p for p in participants if attention[p]["passed"] < attention[p]["total"]]
    kept = [p for p in participants if not (exclude_inattentive and p in failed)]
    if not kept:
        raise InputError("no usable answers: " + ("every rater failed an attention check (keep them with the "
                                                  "'keep inattentive raters' option)" if participants else
                                                  "the files hold no answers"))
    trials = [(p, items[i], a) for (p, i), a in latest.items() if p in kept and items[i]["kind"] == "trial"]

    per_set: dict[str, list] = defaultdict(list)
    units: dict[tuple, list] = defaultdict(list)
    consistency = []
    if kind == "rating":
        for p, item, a in trials:
            per_set[item["sets"][0]].append(int(a))
            units[(item["sets"][0],)].append(int(a))
        alpha = krippendorff_alpha(list(units.values()), "interval")
        alpha_ordinal = krippendorff_alpha(list(units.values()), "ordinal")
        level = "interval"
    else:
        by_rater_pair = defaultdict(list)
        for p, item, a in trials:
            a_set, b_set = item["sets"]
            winner, loser = (a_set, b_set) if a == "left" else (b_set, a_set)
            per_set[winner].append(1)
            per_set[loser].append(0)
            pair = tuple(sorted(item["sets"]))
            units[pair].append(winner)
            by_rater_pair[(p, pair)].append(winner)
        consistency = [len(set(w)) == 1 for w in by_rater_pair.values() if len(w) >= 2]
        alpha = krippendorff_alpha(list(units.values()), "nominal")
        alpha_ordinal = None
        level = "nominal"

    conditions = []
    for set_id, info in key["sets"].items():
        values = per_set.get(set_id, [])
        conditions.append({"set": set_id, "run_id": info["run_id"], "label": info["label"], "prompt": info["prompt"],
                           "method": info["method"], "generator": info["generator"],
                           "human_score": float(np.mean(values)) if values else None,
                           "human_median": float(np.median(values)) if values else None, "n_answers": len(values),
                           "auto_score": info["auto_score"], "auto_score_name": info["auto_score_name"]})
    pairs = [(c["human_score"], c["auto_score"]) for c in conditions
             if is_finite(c["human_score"]) and is_finite(c["auto_score"])]
    spearman = {"rho": None, "p": None, "n": len(pairs), "note": ""}
    if len(pairs) >= 3:
        h, s = zip(*pairs)
        if len(set(h)) > 1 and len(set(s)) > 1:
            res = spearmanr(h, s)
            spearman.update(rho=float(res.statistic), p=float(res.pvalue))
        else:
            spearman["note"] = "undefined: the human or the automatic scores are all equal"
    else:
        spearman["note"] = "needs at least 3 sets with both a human and an automatic score"
    return {
        "question_type": kind, "axis": key["axis"], "question": key["question"],
        "human_score": "mean rating (1–5)" if kind == "rating" else "share of comparisons won",
        "auto_score": next((c["auto_score_name"] for c in conditions), ""),
        "participants": len(participants), "kept": len(kept), "excluded": failed if exclude_inattentive else [],
        "failed_attention": failed, "attention": attention, "invalid_answers": len(bad), "answers": len(trials),
        "agreement": {"statistic": "Krippendorff's alpha", "level": level, "alpha": _clean(alpha),
                      "alpha_ordinal": _clean(alpha_ordinal) if alpha_ordinal is not None else None,
                      "units": sum(len(v) >= 2 for v in units.values())},
        "self_consistency": (float(np.mean(consistency)) if consistency else None),
        "spearman": spearman, "conditions": sorted(conditions, key=lambda c: -(c["human_score"] or 0)),
    }


def _clean(x):
    return None if is_missing(x) else float(x)


def _f(x, digits=3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def analysis_text(a: dict) -> str:
    ag, sp = a["agreement"], a["spearman"]
    lines = [f"{a['participants']} rater(s), {a['kept']} kept ({len(a['failed_attention'])} failed an attention "
             f"check{', excluded' if a['excluded'] else ''}); {a['answers']} answers.",
             f"Agreement: Krippendorff's alpha ({ag['level']}) = {_f(ag['alpha'])} over {ag['units']} unit(s)"
             + (f"; ordinal {_f(ag['alpha_ordinal'])}" if ag.get("alpha_ordinal") is not None else "") + ".",
             f"Spearman rho (human {a['human_score']} vs {a['auto_score']}) = {_f(sp['rho'])}, p = {_f(sp['p'], 4)}, "
             f"n = {sp['n']} set(s)" + (f" ({sp['note']})" if sp["note"] else "") + "."]
    if a.get("self_consistency") is not None:
        lines.append(f"Self-consistency (same choice for a pair shown both ways round): {a['self_consistency']:.0%}.")
    for c in a["conditions"]:
        lines.append(f"  {c['set']}  human {_f(c['human_score'])}  auto {_f(c['auto_score'])}  "
                     f"{c['method']} {c['run_id']} {c['label']} {c['prompt'][:50]}")
    return "\n".join(lines)
