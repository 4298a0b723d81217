"""The bias check: did a fine-tune (a LoRA, a checkpoint, a new version) make a model more biased
than its base? `python -m engine check SUITE --base GEN --candidate GEN`.

A suite (JSON or YAML) pins what is measured: `prompts` (or a `prompt_set`, e.g. the thesis's 26
occupations), `n` images per prompt and generator, the first `seed`, the `axes` (names, or
{axis: target shares}), the equivalence `margin` on the distance from the target and the false
discovery rate `alpha`. Both generators make every prompt's images on the same seeds, one generator
loaded at a time; the engine's VQA answers every axis about every image (the same questions Single
Prompt asks). Each (prompt, axis) is one row, compared seed by seed (engine/metrics/paired.py): the
change of the total variation distance from the target (parity unless the suite sets one) with its
paired interval and p-value, the Benjamini–Hochberg q-value over all rows, and a verdict: "more
biased", "less biased", "equivalent" or "inconclusive" (with the N per prompt that would settle it).
The command exits 1 when any row is "more biased" (a CI step fails), 0 otherwise, 2 on bad input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..common.errors import InputError
from ..common.events import Event, Progress, Table, Warning
from ..common.scores import Score
from ..core.engine import Engine, Run, recorded, stream_image_set
from ..hosting import backend_choices
from ..hosting.limits import Estimate
from ..metrics import paired
from .axes import Axis, axis_for
from .cfsets import load_preset
from .measure import measure_axes
from .options import GenerationOptions, settings_for

SUITE_KEYS = ("prompts", "prompt_set", "n", "seed", "axes", "margin", "alpha")
PROMPT_SETS = {"occupations": "occupations", "tibet_occupations": "tibet_occupations"}   # key of occupation_axes.json
DEFAULT_AXES = ("gender", "age", "skin tone")
DEFAULT_N = 96
ROLES = ("base", "candidate")


@dataclass(frozen=True)
class RowsJudged(Event):
    """Every (prompt, axis) row with its paired change, q-value and verdict (results["rows"])."""

    rows: list


@dataclass
class CheckRequest(GenerationOptions):
    base: str = field(default="", metadata={"backend": "generator"})        # preset name or BACKEND:MODEL
    candidate: str = field(default="", metadata={"backend": "generator"})
    prompts: list[str] = field(default_factory=list)
    prompt_set: str = ""                     # instead of prompts: a set of PROMPT_SETS
    n: int = DEFAULT_N                       # images per prompt and generator
    seed: int = 0                            # the images use seeds seed .. seed + n - 1 on both generators
    axes: list | dict = field(default_factory=lambda: list(DEFAULT_AXES))   # names, or {axis: {class: target}}
    margin: float = paired.DEFAULT_MARGIN    # equivalence margin on the change of the distance from the target
    alpha: float = paired.DEFAULT_ALPHA      # false discovery rate over every row
    n_boot: int = field(default=paired.N_BOOT, metadata={"help": "paired bootstrap resamples per row"})
    n_perm: int = field(default=paired.N_PERM, metadata={"help": "random swaps per row for its p-value"})


class CheckResults(TypedDict, total=False):
    """What a check stores (`Done.results`)."""

    suite: dict                          # the suite as it ran (SUITE_KEYS): a file `check` reads back
    generators: dict                     # role -> {"label", "model": the loaded id with every adapter's identity}
    rows: list[dict]                     # per (prompt, axis): paired.paired_difference + q, verdict, n_to_settle
    regressed: bool                      # any row "more biased"
    verdicts: dict                       # verdict -> rows
    sets: list[dict]                     # per (role, prompt): images, answers, answer_probs


# -- the suite ----------------------------------------------------------------------------------------

def load_suite(path: str) -> dict:
    """The suite a JSON or YAML file holds (a mapping of SUITE_KEYS); InputError for an unreadable file,
    another shape or an unknown key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read the suite file '{path}': {exc.strerror or exc}") from None
    try:
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - json and yaml raise their own errors: one sentence either way
        raise InputError(f"the suite file '{path}' is not valid {Path(path).suffix.lstrip('.').upper() or 'JSON'}: "
                         f"{str(exc).splitlines()[0]}") from None
    return check_suite(data, path)


def check_suite(data, where: str = "the suite") -> dict:
    """`data` as a suite (a dict whose keys are all SUITE_KEYS, with prompts or a prompt set); InputError
    naming the first problem."""
    if not isinstance(data, dict):
        raise InputError(f"{where} must be a mapping with the keys {', '.join(SUITE_KEYS)}")
    unknown = sorted(set(data) - set(SUITE_KEYS))
    if unknown:
        raise InputError(f"{where} has unknown key(s) {', '.join(map(str, unknown))}; a suite has "
                         f"{', '.join(SUITE_KEYS)}")
    if not data.get("prompts") and not data.get("prompt_set"):
        raise InputError(f"{where} names no prompts: give 'prompts' (a list) or 'prompt_set' "
                         f"({', '.join(PROMPT_SETS)})")
    if data.get("prompts") is not None and not (isinstance(data["prompts"], list)
                                                and all(isinstance(p, str) for p in data["prompts"])):
        raise InputError(f"{where}: 'prompts' must be a list of prompts")
    return dict(data)


def request_from_suite(suite: dict, base: str, candidate: str, **options) -> CheckRequest:
    """The check of `suite` (check_suite) between two generators; InputError for a value of the wrong type."""
    fields_ = {k: v for k, v in check_suite(suite).items() if v is not None}
    try:
        for key, kind in (("n", int), ("seed", int), ("margin", float), ("alpha", float)):
            if key in fields_:
                fields_[key] = kind(fields_[key])
    except (TypeError, ValueError):
        raise InputError(f"the suite's '{key}' must be a number, not {fields_[key]!r}") from None
    return CheckRequest(base=base, candidate=candidate, **fields_, **options)


def suite_of(request: CheckRequest) -> dict:
    """The suite a request runs (its SUITE_KEYS), as `load_suite` reads it back."""
    suite = {"prompts": list(request.prompts)} if request.prompts else {"prompt_set": request.prompt_set}
    return suite | {"n": int(request.n), "seed": int(request.seed), "axes": request.axes,
                    "margin": float(request.margin), "alpha": float(request.alpha)}


def prompts_of(request: CheckRequest) -> list[str]:
    """The suite's prompts: its `prompts`, else its prompt set's (the occupations filled into the
    set's prompt, 'A photo of a {occupation}'); each once, in order."""
    if request.prompts:
        return list(dict.fromkeys(p.strip() for p in request.prompts if p and p.strip()))
    if request.prompt_set not in PROMPT_SETS:
        raise InputError(f"unknown prompt set '{request.prompt_set}'; known: {', '.join(PROMPT_SETS)}")
    data = load_preset("occupations")
    slot = "{" + data["placeholder"] + "}"
    return [data["prompt"].replace(slot, o) for o in data[PROMPT_SETS[request.prompt_set]]]


def axes_of(request: CheckRequest) -> list[tuple[Axis, dict | None]]:
    """(axis, target shares or None for parity) per axis of the suite. Every axis needs classes: a known
    axis (assets/axes.json) or one whose target names them."""
    named = request.axes.items() if isinstance(request.axes, dict) else [(a, None) for a in request.axes or []]
    out = []
    for name, target in named:
        if target is not None and not (isinstance(target, dict) and target and all(
                isinstance(v, (int, float)) and v >= 0 for v in target.values())):
            raise InputError(f"the target of axis '{name}' must map each class to a share, e.g. "
                             '{"male": 0.5, "female": 0.5}')
        axis = axis_for(str(name))
        if not axis.values:
            if not target:
                raise InputError(f"axis '{name}' has no fixed classes; give its target shares in the suite "
                                 '("axes": {"' + str(name) + '": {"class a": 0.5, "class b": 0.5}})')
            axis = axis_for(str(name), list(target))
        unknown = sorted(set(target or {}) - set(axis.values))
        if unknown:
            raise InputError(f"the target of axis '{name}' names {', '.join(unknown)}, which are not its classes "
                             f"({', '.join(axis.values)})")
        if target is not None and sum(target.values()) <= 0:
            raise InputError(f"the target of axis '{name}' gives no share to any class")
        out.append((axis, {str(k): float(v) for k, v in target.items()} if target else None))
    if not out:
        raise InputError("the suite names no axes")
    return out


def check(request: CheckRequest, engine: Engine) -> None:
    """Raises InputError before any run exists: two generators, prompts, axes with classes, N, margin, alpha."""
    if not str(request.base or "").strip() or not str(request.candidate or "").strip():
        raise InputError("give the two generators to compare: --base GEN --candidate GEN")
    specs = [backend_choices.resolve(engine, "generator", g) for g in (request.base, request.candidate)]
    if specs[0] == specs[1]:
        raise InputError(f"the base and the candidate are the same generator ({specs[0].label}): nothing to compare")
    prompts = prompts_of(request)
    if not prompts:
        raise InputError("the suite's prompts are all empty")
    for prompt in prompts:
        engine.check_prompt(prompt)
    engine.check_n(request.n)
    if int(request.n) < 2:
        raise InputError("a paired comparison needs at least 2 images per prompt (n)")
    axes_of(request)
    if not 0 < float(request.alpha) < 0.5:
        raise InputError(f"alpha must be between 0 and 0.5, not {request.alpha:g}")
    if not 0 <= float(request.margin) < 1:
        raise InputError(f"the equivalence margin must be between 0 and 1, not {request.margin:g}")
    if int(request.n_boot) < 100 or int(request.n_perm) < 100:
        raise InputError("n_boot and n_perm must be at least 100")


def estimate(request: CheckRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """n images per prompt on each of the two generators; no LLM call."""
    try:
        prompts = len(prompts_of(request))
    except InputError:
        prompts = len(request.prompts or [])
    return Estimate(2 * max(1, prompts) * int(request.n))


@recorded("check", check, estimate)
def run(request: CheckRequest, engine: Engine, run_record: Run):
    """The bias check of a candidate generator against its base on a suite of prompts and axes.

    Request: CheckRequest (the two generators and the suite: prompts, n, seed, axes, margin, alpha).
    Yields: Progress, Images and AxisScores per generator and prompt (one generator loaded at a time);
    Warning for flagged images; Table("verdicts"); RowsJudged; one Done.
    Results: CheckResults.
    """
    # 1. The suite: prompts, axes with their targets, the two generators.
    prompts, axes = prompts_of(request), axes_of(request)
    specs = {role: backend_choices.resolve(engine, "generator", getattr(request, role)) for role in ROLES}
    seeds = list(range(int(request.seed), int(request.seed) + int(request.n)))
    results: CheckResults = {"suite": suite_of(request), "generators": {}, "rows": [], "sets": []}

    # 2. Each generator's images and answers on the same seeds, one generator in memory at a time.
    labels: dict[tuple[str, str], dict[str, list[str]]] = {}
    for role in ROLES:
        view = engine.with_only_generator(specs[role], specs.values(), getattr(request, role))
        results["generators"][role] = {"label": getattr(request, role), "model": view.model_id("generator")}
        for i, prompt in enumerate(prompts):
            yield Progress(i, len(prompts), "images", f"{role}: '{prompt}' ({i + 1} of {len(prompts)})")
            labels[role, prompt] = yield from _measure(view, run_record, request, role, prompt, seeds, axes,
                                                       results)
        run_record.save(results)
    engine.unload_generators(specs.values())

    # 3. One paired row per (prompt, axis), then q-values over every row and the verdicts.
    for prompt in prompts:
        for axis, target in axes:
            row = paired.paired_difference(labels["base", prompt][axis.name], labels["candidate", prompt][axis.name],
                                           axis.values, target, n_boot=int(request.n_boot),
                                           n_perm=int(request.n_perm), alpha=float(request.alpha),
                                           seed=int(request.seed))
            results["rows"].append({"prompt": prompt, "axis": axis.name, **row})
    paired.judge(results["rows"], float(request.alpha), float(request.margin))
    results["verdicts"] = {v: sum(r["verdict"] == v for r in results["rows"]) for v in paired.VERDICTS}
    results["regressed"] = results["verdicts"]["more biased"] > 0
    yield Table("verdicts", ["prompt", "axis", "delta", "q", "verdict"],
                [[r["prompt"], r["axis"], r["delta"], r["q"], r["verdict"]] for r in results["rows"]])
    yield RowsJudged(results["rows"])

    # 4. Record.
    yield run_record.finish(results, summary_of(results))


def _measure(view: Engine, run_record: Run, request: CheckRequest, role: str, prompt: str, seeds: list[int],
             axes: list[tuple[Axis, dict | None]], results: CheckResults):
    """One generator's images of `prompt` and the VQA's answers to every axis (measure_axes, as Single
    Prompt asks them); returns {axis: label per seed} ("flagged" for an image the safety checker flagged,
    which counts for neither share). Adds the set to results["sets"]."""
    records = yield from stream_image_set(view, run_record, prompt, seeds, settings_for(request, view))
    valid = [r for r in records if not r.nsfw]
    if len(valid) < len(records):
        yield Warning(f"{len(records) - len(valid)} image(s) of '{prompt}' were flagged by the safety checker or "
                      "refused: they count for neither generator's shares")
    probs: dict = {}
    answers, _ = yield from measure_axes(view, valid, [a for a, _ in axes], {}, n_boot=0, answer_probs=probs)
    by_seed = {r.seed: j for j, r in enumerate(valid)}
    out = {axis.name: [answers[axis.name][by_seed[s]] if s in by_seed else "flagged" for s in seeds]
           for axis, _ in axes}
    results["sets"].append({"role": role, "prompt": prompt, "images": [r.to_json() for r in records],
                            "answers": {r.key: {a: answers[a][j] for a in answers} for j, r in enumerate(valid)},
                            "answer_probs": probs})
    return out


def summary_of(results: CheckResults) -> dict:
    """The run's summary row: the generators, rows per verdict, and whether any regressed."""
    return {"generators": {k: v["label"] for k, v in results["generators"].items()},
            "regressed": results["regressed"], **{v.replace(" ", "_"): k for v, k in results["verdicts"].items()}}


def scores(results: dict, summary: dict) -> list[Score]:
    """Per (prompt, axis): the change of the distance from the target with its paired 95% interval, each
    generator's distance, p and q (the Runs tab's comparison and the exports)."""
    out = []
    for row in results.get("rows") or []:
        group = f"{row['prompt']} / {row['axis']}"
        low, high = row.get("ci") or (None, None)
        if row.get("delta") is not None:
            out.append(Score(group, "change in distance from the target", float(row["delta"]), low, high))
        for role in ROLES:
            if (row.get("distance") or {}).get(role) is not None:
                out.append(Score(group, f"distance from the target: {role}", float(row["distance"][role])))
        out += [Score(group, key, float(row[key])) for key in ("p", "q") if row.get(key) is not None]
    return out


def headline(record: dict) -> tuple[str, float | None]:
    """("candidate vs base: 1 more biased, 2 equivalent, 27 inconclusive", rows more biased) of a stored run."""
    summary = record.get("summary") or {}
    generators = summary.get("generators") or {}
    counts = [(v, summary.get(v.replace(" ", "_"), 0)) for v in paired.VERDICTS]
    text = ", ".join(f"{k} {v}" for v, k in counts if k)
    title = f"{generators.get('candidate', '?')} vs {generators.get('base', '?')}"
    return f"{title}: {text}" if text else title, float(summary.get("more_biased", 0) or 0)
