"""Bias axes, counterfactual prompts and their image sets: what Counterfactuals (TIBET) and
Intersectional (BiasConnect) share, so an Intersectional run of a prompt reuses the images
(and the LLM's axes) of a Counterfactuals run of the same prompt from the store.

- Axes come from TIBET's three-turn meta-prompt (thesis §2.3; `propose_axes`), a preset
  (Table 6.1, `load_preset`) or the user's table; each is {axis: [counterfactual prompts]}.
- A counterfactual should differ from the prompt in one concept (one changed place, articles
  ignored) and be at most `max_length_change` words longer or shorter (the released TIBET
  code's ±5-token check). The LLM's counterfactuals failing a check are dropped; the user's
  are kept with a warning: the table is theirs.
- A prompt may hold one placeholder such as "{occupation}" filled from a list of values
  (aggregate mode); counterfactuals then use the same placeholder.
- Each axis' answer choices are what its counterfactuals name; its VQA question and ideal
  distribution are settled once (`settle_questions_and_ideals`, Intersectional and Mitigate).
- Every set uses the same seeds, so sets differ only in the prompt. Image labels in a run:
  "initial" and "axis=<axis>|cf=<prompt>", prefixed "prompt=<prompt>|" in aggregate mode.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Callable

from ..backends.llm_json import JSON_ATTEMPTS, as_axis_dict
from ..common.errors import InputError, LLMOutputError
from ..common.events import Table, Warning
from ..common.llm_prompts import axis_question_prompt, tibet_turns
from ..core.engine import Engine, Run, stream_image_set
from ..core.evaluators import llm_map
from ..hosting.limits import Estimate
from ..metrics import biasconnect as bc
from ..metrics.tibet import ENGLISH_STOPWORDS
from ..models.presets import ASSETS
from .axes import known_axes
from .options import GenerationOptions

MAX_LENGTH_CHANGE = 5
ARTICLES = frozenset({"a", "an", "the"})
PRESETS = {"occupations": "occupation_axes.json"}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_WORDS = re.compile(r"\{\w+\}|[\w'-]+")
IDENTICAL = "is the prompt itself"


@dataclass
class SetsRequest(GenerationOptions):
    """The fields every counterfactual-set method shares (a base for its request dataclass)."""

    prompt: str = field(metadata={"help": "the initial prompt; may hold one {placeholder} filled by --fill"})
    axes: dict[str, list[str]] | None = None   # {axis: [counterfactual prompts]}; None: ask the LLM
    fill: list[str] = field(default_factory=list, metadata={
        "help": "aggregate mode: values of the placeholder", "metavar": "VALUE"})
    n: int = field(default=16, metadata={"flag": "-n", "help": "images per set (the thesis uses 48)"})
    seed: int = field(default=0, metadata={"help": "every set uses the seeds seed .. seed+n-1"})
    llm_seed: int = field(default=0, metadata={"help": "seed of the LLM's axes proposal"})
    max_length_change: int = MAX_LENGTH_CHANGE

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


@dataclass(frozen=True)
class SetSpec:
    """One image set of a run: the initial prompt (axis None) or one counterfactual."""

    label: str
    prompt: str                  # the filled prompt the images are generated from
    prompt_index: int            # which prompt of an aggregate run
    axis: str | None = None
    cf: str | None = None        # the counterfactual as written in the axes table (a template)
    value: str | None = None     # what the counterfactual names, e.g. "male"


# -- axes tables --------------------------------------------------------------------------------

def axis_name(name: str) -> str:
    """'Skin_Tone bias' -> 'skin tone bias': lower-case, '_' as spaces (the LLM JSON helper's keys)."""
    return re.sub(r"\s+", " ", str(name).replace("_", " ")).strip().lower()


def axes_from_rows(rows) -> dict[str, list[str]]:
    """{axis: [counterfactuals]} from table rows (axis, counterfactual); an empty axis cell
    continues the axis above, empty counterfactuals are skipped."""
    axes: dict[str, list[str]] = {}
    current = ""
    for row in rows or []:
        cells = [("" if c is None else str(c)).strip() for c in list(row)[:2]] + ["", ""]
        current = axis_name(cells[0]) or current
        if current and cells[1]:
            axes.setdefault(current, []).append(cells[1])
    return axes


def rows_from_axes(axes: dict[str, list[str]]) -> list[list[str]]:
    return [[axis, cf] for axis, cfs in axes.items() for cf in cfs]


EXAMPLE_AXES = ("gender", "age")


def example_axes(prompt: str, axes=EXAMPLE_AXES) -> dict[str, list[str]]:
    """Returns counterfactual axes for an example prompt "a photo of a(n) <occupation>": the Table 6.1
    preset's `axes` with its placeholder filled with that occupation ({} for another prompt)."""
    match = re.fullmatch(r"\s*an? photo of an? (.+?)\s*", str(prompt), flags=re.IGNORECASE)
    if not match:
        return {}
    data = load_preset("occupations")
    slot = "{" + data["placeholder"] + "}"
    return {a: [cf.replace(slot, match.group(1)) for cf in data["axes"][a]] for a in axes if a in data["axes"]}


def load_preset(name: str = "occupations") -> dict:
    """A preset axes set from assets/ ({"prompt", "placeholder", "axes", "occupations", ...})."""
    if name not in PRESETS:
        raise InputError(f"unknown axes preset '{name}'; known: {', '.join(PRESETS)}")
    return json.loads((ASSETS / PRESETS[name]).read_text())


# -- checking counterfactuals -------------------------------------------------------------------

def _words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def _changes(prompt: str, cf: str) -> list[tuple[list[str], list[str]]]:
    """The places where `cf` differs from `prompt`: (removed words, inserted words) per place,
    places that only swap an article ('a' -> 'an') left out."""
    a, b = _words(prompt), _words(cf)
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    places = [(a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    return [(old, new) for old, new in places if set(old + new) - ARTICLES]


def check_counterfactual(prompt: str, cf: str, max_length_change: int = MAX_LENGTH_CHANGE) -> str | None:
    """Why `cf` is not a counterfactual of `prompt` (None when it is one): identical, changed in
    more than one place, or more than `max_length_change` words longer/shorter."""
    places = _changes(prompt, cf)
    if not places:
        return IDENTICAL
    if len(places) > 1:
        return f"changes the prompt in {len(places)} places, not one concept"
    change = len(_words(cf)) - len(_words(prompt))
    if abs(change) > max_length_change:
        return (f"is {abs(change)} words {'longer' if change > 0 else 'shorter'} than the prompt "
                f"(at most {max_length_change})")
    return None


def counterfactual_value(prompt: str, cf: str) -> str:
    """What the counterfactual names: its inserted or replacing words without stop words
    ('A photo of a {occupation} in formal attire' -> 'formal attire'); BiasConnect's choices."""
    inserted = [w for _, new in _changes(prompt, cf) for w in new if not _PLACEHOLDER.fullmatch(w)]
    content = [w for w in inserted if w not in ENGLISH_STOPWORDS] or inserted
    return " ".join(dict.fromkeys(content)) or cf.strip().lower()


def clean_axes(prompt: str, axes: dict, max_length_change: int = MAX_LENGTH_CHANGE,
               strict: bool = False) -> tuple[dict[str, list[str]], list[str]]:
    """The axes with names normalised and blank, duplicate or identical-to-prompt
    counterfactuals removed, and the problems found. `strict` (the LLM's output) also drops
    counterfactuals failing `check_counterfactual`; otherwise they are kept and reported."""
    cleaned: dict[str, list[str]] = {}
    problems = []
    for raw_axis, cfs in (axes or {}).items():
        kept = cleaned.setdefault(axis_name(raw_axis), [])
        for cf in (str(c).strip() for c in cfs or []):
            if not cf or cf.lower() in {k.lower() for k in kept}:
                continue
            problem = check_counterfactual(prompt, cf, max_length_change)
            drop = problem is not None and (strict or problem == IDENTICAL)
            if problem:
                problems.append(f"{axis_name(raw_axis)}: '{cf}' {problem} ({'dropped' if drop else 'kept'})")
            if not drop:
                kept.append(cf)
    return {a: cfs for a, cfs in cleaned.items() if a and cfs}, problems


# -- the LLM ------------------------------------------------------------------------------------

def propose_axes(engine: Engine, prompt: str, seed: int = 0,
                 max_length_change: int = MAX_LENGTH_CHANGE) -> tuple[dict[str, list[str]], list[str]]:
    """TIBET's three-turn conversation (thesis §2.3, temperature 1 as in the paper): bias axes,
    then counterfactuals, then their JSON; replies are cached in the store. Returns the
    checked axes (at most MAX_PROPOSED_AXES) and the dropped counterfactuals. A reply that cannot be
    parsed, or keeps no axis with two counterfactuals, is asked again (bounded: at most
    PROPOSE_CALLS calls in all); then LLMOutputError."""
    prompt = engine.check_prompt(prompt)
    turns = tibet_turns(prompt)
    messages: list[dict] = []
    for turn in turns[:2]:
        messages.append({"role": "user", "content": turn})
        reply = engine.llm.chat(messages, temperature=1.0, max_tokens=2048, seed=seed)
        messages.append({"role": "assistant", "content": reply})
    messages.append({"role": "user", "content": turns[2]})
    problems: list[str] = []
    shape = as_axis_dict(min_axes=1, min_cfs=2)

    def validate(obj):
        axes, found = clean_axes(prompt, shape(obj), max_length_change, strict=True)
        problems[:] = found
        axes = {a: cfs for a, cfs in axes.items() if len(cfs) >= 2}
        if not axes:
            raise ValueError("no axis kept two counterfactuals that each change one concept of the prompt: "
                             + "; ".join(found[:3]))
        return axes

    try:
        axes = engine.ask_json(messages, validate, temperature=1.0, seed=seed, max_tokens=2048)
    except LLMOutputError as exc:
        raise LLMOutputError(f"{exc}. Type the axes and counterfactuals into the table by hand instead.") from exc
    if len(axes) > MAX_PROPOSED_AXES:   # each may cost a question (QUESTION_CALLS): the estimates count these
        extra = list(axes)[MAX_PROPOSED_AXES:]
        problems.append(f"axes after the first {MAX_PROPOSED_AXES} ({', '.join(extra)}) (dropped: a proposal keeps "
                        f"at most {MAX_PROPOSED_AXES}; type more into the table)")
        axes = {a: cfs for a, cfs in list(axes.items())[:MAX_PROPOSED_AXES]}
    return axes, problems


# -- prompts and sets ---------------------------------------------------------------------------

def placeholder(prompt: str) -> str | None:
    names = set(_PLACEHOLDER.findall(prompt))
    if len(names) > 1:
        raise InputError(f"the prompt has {len(names)} placeholders ({', '.join(sorted(names))}); use one")
    return names.pop() if names else None


def fill_values(fill) -> list[str]:
    return [f.strip() for f in fill or [] if f and f.strip()]


def expand(prompt: str, fill: list[str]) -> list[str]:
    """The prompts of a run: `prompt`, or one per fill value of its placeholder."""
    name, values = placeholder(prompt), fill_values(fill)
    if name and not values:
        raise InputError(f"the prompt has the placeholder {{{name}}}: give the values to fill in "
                         f"(e.g. a list of occupations), or write the prompt out")
    if values and not name:
        raise InputError("fill values were given but the prompt has no {placeholder} to fill")
    return [prompt.replace(f"{{{name}}}", value) for value in values] if name else [prompt]


def check_placeholders(template: str, axes) -> None:
    """Raises InputError for a counterfactual with a {placeholder} that the prompt's own
    placeholder (filled by the fill values) does not fill: it would be generated literally."""
    if not isinstance(axes, dict):
        return
    filled = {placeholder(template)} - {None}
    for cfs in axes.values():
        for cf in cfs or []:
            unfilled = sorted(set(_PLACEHOLDER.findall(str(cf))) - filled)
            if unfilled:
                braces = ", ".join(f"{{{name}}}" for name in unfilled)
                fix = (f"use the prompt's {{{next(iter(filled))}}}" if filled else
                       f"put {braces} in the prompt and give fill values")
                raise InputError(f"the counterfactual '{cf}' has {braces}, which neither the prompt nor the fill "
                                 f"values fill, so it would be generated literally: write it out or {fix}")


def propose_for(engine: Engine, prompt: str, fill: list[str], seed: int = 0,
                max_length_change: int = MAX_LENGTH_CHANGE) -> tuple[dict[str, list[str]], list[str]]:
    """`propose_axes` for the first prompt of a run; with a placeholder, the counterfactuals
    are written back as templates (those not naming the fill value are left out)."""
    first = expand(prompt, fill)[0]
    engine.afford("propose axes", llm_calls=PROPOSE_CALLS)   # its worst case, before the first call
    axes, problems = propose_axes(engine, first, seed, max_length_change)
    name = placeholder(prompt)
    if name:
        value = fill_values(fill)[0]
        axes = {a: [cf.replace(value, f"{{{name}}}") for cf in cfs if value in cf] for a, cfs in axes.items()}
        axes = {a: cfs for a, cfs in axes.items() if cfs}
    return axes, problems


def fit_proposed(engine: Engine, estimate: Callable, request, axes: dict[str, list[str]], share: int = 1):
    """The LLM's `axes` cut to what a public visitor's request was charged (Engine.fit_proposed_axes;
    `estimate`: the method's; use `yield from`): a Warning names the axes left out; InputError
    when none fits."""
    kept, left_out = engine.fit_proposed_axes(estimate, request, axes, share)
    if left_out:
        limit = f"the {engine.budget.images // share} images" + (" each model's sets may have" if share > 1 else
                                                                 " one request may generate here")
        if not kept:
            raise InputError(f"every axis the LLM proposed needs more than {limit} at N = {request.n} per set: "
                             "lower N, or type the axes into the table")
        yield Warning(f"left out the proposed axes {', '.join(left_out)}: with them the sets would need more than "
                      f"{limit}")
    return kept


SETS_GUESS = 13  # sets of a request whose axes the LLM will propose (1 + 3 axes × 4)
# The most LLM calls of TIBET's three-turn axes proposal (propose_axes): two chat turns, then the JSON
# turn, asked again while its reply is unusable (JSON_ATTEMPTS in all)
PROPOSE_CALLS = 2 + JSON_ATTEMPTS
QUESTION_CALLS = JSON_ATTEMPTS   # the most LLM calls of one axis' VQA question (axis_question)
MAX_PROPOSED_AXES = 10           # axes a proposal keeps (each may need a question)


def one_set_each(axes: dict[str, list[str]]) -> int:
    """Sets per prompt of a request measuring `axes` once: the prompt's and one per counterfactual."""
    return 1 + sum(len(cfs) for cfs in axes.values())


def estimate_sets(request: SetsRequest, sets_per_prompt: Callable[[dict], int], proposed: int | None = None,
                  asks_per_axis: bool = False) -> Estimate:
    """What a request of counterfactual image sets can spend: N images per set and
    `sets_per_prompt(axes)` sets per prompt and fill value; when the LLM proposes the axes,
    SETS_GUESS sets (a guess) or `proposed`, the images the request is held to (its sets are cut
    to fit, `fit_proposed`). LLM calls, at most: the proposal's (PROPOSE_CALLS), and with
    `asks_per_axis` QUESTION_CALLS per axis not given a question (a proposal keeps at most
    MAX_PROPOSED_AXES, and for a visitor those whose sets, two counterfactuals each at least, fit)."""
    fills, n = max(1, len(request.fill or [])), max(1, int(request.n))
    if not (isinstance(request.axes, dict) and request.axes):
        images = proposed if proposed is not None else n * SETS_GUESS * fills
        most = MAX_PROPOSED_AXES   # a visitor's proposal keeps the axes whose sets fit its images (fit_proposed)
        while proposed is not None and most and n * fills * sets_per_prompt(
                {f"axis {i}": ["a", "b"] for i in range(most)}) > proposed:
            most -= 1
        return Estimate(images, PROPOSE_CALLS + (QUESTION_CALLS * most if asks_per_axis else 0))
    given = getattr(request, "questions", None) or {}   # settle_questions_and_ideals asks for the others
    asked = {axis_name(a) for a in request.axes} - set(given) if asks_per_axis else set()
    return Estimate(n * sets_per_prompt(request.axes) * fills, QUESTION_CALLS * len(asked))


def check(request: SetsRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    template = engine.check_prompt(request.prompt)
    engine.check_n(request.n)
    for p in expand(template, request.fill):
        engine.check_prompt(p)
    check_placeholders(template, request.axes)


def prepare(request: SetsRequest, engine: Engine, estimate: Callable):
    """Check the request of a method (`estimate`: its own) and settle the axes (use `yield from`): yields Warning
    events and, when the LLM proposed the axes, a Table('axes') event; returns (prompts, axes,
    specs). A public visitor's proposed axes are cut to what the request was charged."""
    template = engine.check_prompt(request.prompt)
    prompts = expand(template, request.fill)
    for p in prompts:
        engine.check_prompt(p)
    if request.axes:
        check_placeholders(template, request.axes)
        axes, problems = clean_axes(template, request.axes, request.max_length_change)
    else:
        axes, problems = propose_for(engine, template, request.fill, request.llm_seed, request.max_length_change)
        axes = yield from fit_proposed(engine, estimate, request, axes)
        yield Table("axes", ["axis", "counterfactual"], rows_from_axes(axes))
    for problem in problems:
        yield Warning(f"counterfactual {problem}")
    if not axes:
        raise InputError("no axis has a counterfactual: add rows (axis, counterfactual prompt) to the table")
    name, values = placeholder(template), fill_values(request.fill)
    aggregate = len(prompts) > 1
    specs = []
    for i, p in enumerate(prompts):
        specs.append(SetSpec(set_label(p, aggregate), p, i))
        specs += [SetSpec(set_label(p, aggregate, axis, cf), cf.replace(f"{{{name}}}", values[i]) if name else cf,
                          i, axis, cf, counterfactual_value(template, cf))
                  for axis, cfs in axes.items() for cf in cfs]
    return prompts, axes, specs


def choices(template: str, cfs: list[str]) -> list[str]:
    """An axis' answer choices: what its counterfactuals name, in order, without repeats."""
    return list(dict.fromkeys(counterfactual_value(template, cf) for cf in cfs))



def _question_reply(obj) -> str:
    text = obj.get("question") if isinstance(obj, dict) else obj
    if not isinstance(text, str) or not text.strip():
        raise ValueError('expected {"question": "..."}')
    return text.strip()



def axis_question(engine: Engine, axis: str, values: list[str], seed: int = 0) -> tuple[str, str]:
    """(question, where it came from) for a multiple-choice VQA over `values` (spec §3.2)."""
    known = known_axes().get(axis)
    if known and set(known.values) == set(values):
        return known.question, "assets/axes.json"
    try:
        return engine.ask_json([{"role": "user", "content": axis_question_prompt(axis, values)}], _question_reply,
                               temperature=0.0, seed=seed), "LLM"
    except LLMOutputError:
        return f"What is the {axis} ({', '.join(values)}) of the person in the image?", "template (the LLM failed)"



def settle_questions_and_ideals(request, engine: Engine, axes: dict[str, list[str]], values: dict[str, list[str]]):
    """Each axis' VQA question (`request.questions`, else `axis_question`) and ideal
    distribution D* (`request.ideals`, axis names and values normalised; a missing axis is
    uniform, biasconnect.ideal_distribution), shared by Intersectional and Mitigate (use
    `yield from`: yields a Warning for ideals of axes not in the table, then
    Table("questions")); returns (questions, ideals)."""
    questions, sources = {}, {}
    asked = [a for a in axes if a not in request.questions]   # independent LLM calls: at once through a server
    replies = dict(zip(asked, llm_map(engine, lambda a: axis_question(engine, a, values[a], request.llm_seed), asked)))
    for axis in axes:
        if axis in request.questions:
            questions[axis], sources[axis] = request.questions[axis], "request"
        else:
            questions[axis], sources[axis] = replies[axis]
    given = {axis_name(a): {str(k).strip().lower(): v for k, v in (d or {}).items()}
             for a, d in (request.ideals or {}).items()}
    unknown = set(given) - set(axes)
    if unknown:
        yield Warning(f"ideal distributions for axes not in the table are ignored: {', '.join(sorted(unknown))}")
    try:
        ideals = {y: bc.ideal_distribution(values[y], given.get(y) or None, request.other_policy) for y in axes}
    except ValueError as exc:
        raise InputError(f"ideal distribution: {exc}") from None
    yield Table("questions", ["axis", "question", "choices", "source"],
                [[a, questions[a], ", ".join(values[a]), sources[a]] for a in axes])
    return questions, ideals



def set_label(prompt: str, aggregate: bool, axis: str | None = None, cf: str | None = None) -> str:
    """The label of a set in a run: "initial" or "axis=<axis>|cf=<cf>", prefixed
    "prompt=<prompt>|" in aggregate mode."""
    prefix = f"prompt={prompt}|" if aggregate else ""
    return prefix + ("initial" if axis is None else f"axis={axis}|cf={cf}")


def generate_set(engine: Engine, run: Run, spec: SetSpec, seeds: list[int], settings,
                 index: int, total: int, evaluate=None):
    """Generate one set through the store (use `yield from`); returns its records without
    images the safety checker flagged (with a Warning when there are any). `evaluate(valid_batch)`
    warms the caches beside generation (engine.core.run.stream_image_set)."""
    def evaluate_valid(batch):
        valid_batch = [r for r in batch if not r.nsfw]
        if valid_batch:
            evaluate(valid_batch)

    records = yield from stream_image_set(engine, run, spec.prompt, seeds, settings, label=spec.label,
                                          progress_offset=index * len(seeds), progress_total=total * len(seeds),
                                          evaluate=evaluate_valid if evaluate else None)
    valid = [r for r in records if not r.nsfw]
    flagged = sum(r.nsfw and not r.refused for r in records)   # refusals were reported as such
    if flagged:
        yield Warning(f"{flagged} image(s) of '{spec.prompt}' were flagged by the safety "
                      "checker and are excluded from every metric")
    if not valid:
        raise InputError(f"every image of '{spec.prompt}' was flagged by the safety checker or refused by the API; "
                         "nothing to measure")
    return valid


