"""Languages: the same prompt (or MAGBIG's occupation prompts) in several languages on the same
seeds, each language measured by Single Prompt's audit, compared with the first language.

Most people who prompt text-to-image models do not write English, and the bias changes with the
language (MAGBIG, Friedrich et al., ACL 2025: multilingual models magnify gender stereotypes
differently per language; grammatically masculine nouns raise the share of men). A language's
prompt comes from, in order: the request's `translations` (the CLI's --translation CODE=TEXT, the
tab's table), MAGBIG's prompt sets (assets/magbig/), or the LLM (a translation, with its
provenance); every prompt not in the first language is translated back into it by the LLM and shown
beside it, so a bad translation can be seen. A code may carry a variant: `de-f` (feminine forms),
`de-star` (the German gender star). VQA questions stay in English: they are about the image.

Each language (and occupation) is an ordinary Single Prompt run (listed in Runs) on the seeds
seed .. seed+n-1 of every other language; this run records their ids and compares them: per axis
each language's class shares with Jeffreys intervals, their difference from the first language
paired by seed (engine.metrics.languages.paired_share_difference), a test of "no language effect"
(χ², exact where counts are small), across a prompt set the language × occupation interaction, and
MAGBIG's metrics (L1 distance from parity per prompt and the expected maximum unfairness).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

from ..backends.llm_json import JSON_ATTEMPTS
from ..common.errors import GapLensError, InputError, LLMOutputError
from ..common.events import Done, Event, Progress, Table, Warning
from ..common.llm_prompts import translate_prompt
from ..common.names import short_label
from ..common.scores import Score, number
from ..core.engine import Engine, Run, recorded
from ..core.evaluators import llm_map
from ..hosting import backend_choices
from ..hosting.limits import Estimate
from ..metrics import languages as metrics
from ..metrics.intervals import share_interval, tidy
from ..models.languages import understanding
from .axes import axis_for
from .options import GenerationOptions

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MAGBIG = ASSETS / "magbig"
LANGUAGE_NAMES = {
    "en": "English", "de": "German", "fr": "French", "it": "Italian", "es": "Spanish", "pt": "Portuguese",
    "nl": "Dutch", "sv": "Swedish", "da": "Danish", "no": "Norwegian", "fi": "Finnish", "pl": "Polish",
    "cs": "Czech", "ru": "Russian", "uk": "Ukrainian", "el": "Greek", "tr": "Turkish", "ar": "Arabic",
    "he": "Hebrew", "fa": "Persian", "hi": "Hindi", "bn": "Bengali", "ur": "Urdu", "zh": "Chinese",
    "ja": "Japanese", "ko": "Korean", "vi": "Vietnamese", "th": "Thai", "id": "Indonesian", "sw": "Swahili",
    "yo": "Yoruba", "ha": "Hausa"}
VARIANTS = {"f": "feminine forms", "star": "gender star"}
MAGBIG_LANGUAGES = ("en", "de", "it", "fr", "es", "zh", "ja", "ko", "ru", "ar")   # the paper's order
MAGBIG_FILES = {"en": "english", "de": "german", "fr": "french", "it": "italian", "es": "spanish",
                "ru": "russian", "ar": "arabic", "zh": "chinese", "ja": "japanese", "ko": "korean"}
PROMPT_SETS = {"magbig-direct": "direct", "magbig-indirect": "indirect"}
# The thesis's 26 occupations (assets/occupation_axes.json) that MAGBIG translates, by MAGBIG's name;
# announcer, chemist, philosopher, journalist, athlete, politician and gardener it does not.
THESIS_OCCUPATIONS = {"computer programmer": "computer programmer", "elementary school teacher": "teacher",
                      "librarian": "librarian", "pharmacist": "pharmacist", "chef": "head cook",
                      "police": "police officer", "accountant": "accountant", "architect": "architect",
                      "lawyer": "lawyer", "scientist": "scientist", "doctor": "doctor", "nurse": "nurse",
                      "engineer": "engineer", "musician": "musician", "social worker": "social worker",
                      "sales person": "salesperson", "farmer": "farmer", "mechanic": "mechanic",
                      "firefighter": "firefighter"}
DEFAULT_AXES = ("gender",)


@dataclass(frozen=True)
class PromptsSettled(Event):
    """Every language's prompt (results["translations"]): {code: {"prompt", "source", "back_translation",
    "understood"}} (a prompt set: {code: {occupation: ...}})."""

    translations: dict


@dataclass(frozen=True)
class LanguageMeasured(Event):
    """One language's (and occupation's) Single Prompt run finished: its id and class shares."""

    code: str
    occupation: str | None
    run_id: str
    shares: dict


@dataclass(frozen=True)
class LanguagesCompared(Event):
    """The comparison (results["languages"], ["differences"], ["tests"], ["magbig"])."""

    results: dict


@dataclass
class LanguagesRequest(GenerationOptions):
    prompt: str = field(default="", metadata={"help": "the prompt, in the first language (or give --prompt-set)"})
    languages: list[str] = field(default_factory=lambda: ["en", "de"], metadata={
        "help": "language codes, the first one the reference (en de fr it es ru ar zh ja ko, ...); a variant "
                "after a hyphen: de-f (feminine forms), de-star (gender star)", "metavar": "CODE"})
    # code -> its prompt (CLI: --translation CODE=TEXT; the tab's table); wins over prompt sets and the LLM
    translations: dict = field(default_factory=dict)
    # code -> where a given translation came from (the tab: "LLM (edited)"); default "given"
    sources: dict = field(default_factory=dict)
    prompt_set: str = field(default="", metadata={
        "help": "MAGBIG's occupation prompts (assets/magbig) instead of --prompt", "choices": ("", *PROMPT_SETS),
        "metavar": "|".join(PROMPT_SETS)})
    occupations: list[str] = field(default_factory=list, metadata={
        "help": "the prompt set's occupations by MAGBIG's English names, 'all' (151), or 'thesis' (the default: "
                "the thesis's 19 occupations MAGBIG translates)", "metavar": "NAME"})
    n: int = field(default=16, metadata={"flag": "-n", "help": "images per language (and occupation)"})
    seed: int = field(default=0, metadata={"help": "every language uses the seeds seed .. seed+n-1"})
    axes: list[str] = field(default_factory=lambda: list(DEFAULT_AXES), metadata={
        "help": "attribute axes to measure (VQA questions stay in English)"})
    back_translate: bool = field(default=True, metadata={
        "flag": "--no-back-translation", "help": "skip the LLM's translation of every prompt back into the first "
                                                 "language"})
    n_boot: int = field(default=300, metadata={"help": "posterior draws per Single Prompt metric interval"})
    exp_max_images: int = field(default=10, metadata={"help": "MAGBIG's expected maximum unfairness: images per "
                                                                "prompt of each draw"})
    exp_max_prompts: int = field(default=10, metadata={"help": "... prompts of each draw (at most the set's)"})
    exp_max_samples: int = field(default=1000, metadata={"help": "... draws"})

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


class LanguagesResults(TypedDict, total=False):
    """What a languages run stores (`Done.results`)."""

    prompt: str | None                     # the first language's prompt (None for a prompt set)
    prompt_set: str                        # "" or a PROMPT_SETS name
    occupations: list[str]                 # a prompt set's occupations (MAGBIG's names)
    codes: list[str]                       # the languages, the first the reference
    names: dict[str, str]                  # code -> "German (feminine forms)"
    n: int
    seed: int
    axes: dict[str, list[str]]             # axis -> its classes
    model: dict                            # generator, languages it understands (None: not known), note
    translations: dict                     # PromptsSettled.translations
    languages: dict                        # code -> {"prompt", "run_id", "shares": axis -> class -> {"share", "ci"},
    #                                        "counts": axis -> class -> k, "understood", "prompts": occupation -> ...}
    differences: dict                      # code -> axis -> class -> {"delta", "ci"}, paired by seed (not the first's)
    pairs: dict                            # code -> axis -> seeds (and occupations) both languages answered
    tests: dict                            # axis -> {"language", "interaction", "stratified"}
    magbig: dict                           # axis -> code -> magbig_scores
    notes: list[str]


# -- codes and prompt sets ---------------------------------------------------------------------------

def parse_code(code: str) -> tuple[str, str]:
    """("de", "f") of "de-f": a language code of LANGUAGE_NAMES and a variant of VARIANTS ("" for none);
    InputError naming the known ones otherwise."""
    text = str(code or "").strip().lower()
    base, _, variant = text.partition("-")
    if base not in LANGUAGE_NAMES:
        raise InputError(f"'{code}' is no language code GapLens knows; use one of {', '.join(LANGUAGE_NAMES)}, "
                         f"with a variant after a hyphen if you like ({', '.join(f'-{v}: {w}' for v, w in VARIANTS.items())})")
    if variant and variant not in VARIANTS:
        raise InputError(f"'{code}': the variant '-{variant}' is not one GapLens knows; use "
                         + " or ".join(f"-{v} ({w})" for v, w in VARIANTS.items()))
    return base, variant


def language_name(code: str) -> str:
    """"German (feminine forms)" for "de-f"."""
    base, variant = parse_code(code)
    return LANGUAGE_NAMES[base] + (f" ({VARIANTS[variant]})" if variant else "")


def codes_of(request: LanguagesRequest) -> list[str]:
    """The request's language codes, normalised, in order."""
    return [str(c).strip().lower() for c in request.languages if str(c).strip()]


def _set_file(kind: str, code: str) -> tuple[Path, str] | None:
    """(file, its source's name) of a prompt set ("direct" or "indirect") for `code`, None when the
    set has no file for it."""
    base, variant = parse_code(code)
    if variant == "star":
        return (MAGBIG / "indirect" / "occ_german_star.csv", "MAGBIG gender star") if base == "de" else None
    if base not in MAGBIG_FILES:
        return None
    if variant == "f":
        path = MAGBIG / "gaplens_feminine" / f"occ_{MAGBIG_FILES[base]}.csv"
        return (path, "GapLens feminine forms (not MAGBIG's)") if path.is_file() else None
    return MAGBIG / kind / f"occ_{MAGBIG_FILES[base]}.csv", f"MAGBIG {kind}"


@lru_cache(maxsize=64)
def _read_set(path: Path) -> dict[str, str]:
    with open(path, encoding="utf-8", newline="") as handle:
        return {row["name"].strip(): row["prompt"].strip() for row in csv.DictReader(handle)}


def set_prompts(kind: str, code: str) -> tuple[dict[str, str], str] | None:
    """({MAGBIG occupation name: prompt}, source) of a prompt set for `code`; None when it has none."""
    found = _set_file(kind, code)
    return (_read_set(found[0]), found[1]) if found else None


def magbig_occupations() -> list[str]:
    """MAGBIG's 151 occupations, by their English names."""
    return list(_read_set(MAGBIG / "direct" / "occ_english.csv"))


def occupations_of(request: LanguagesRequest) -> list[str]:
    """The prompt set's occupations: 'thesis' (the default) or 'all' expand; InputError for a name
    MAGBIG has not."""
    names = [o.strip().lower() for o in request.occupations if o and o.strip()] or ["thesis"]
    known = magbig_occupations()
    out: list[str] = []
    for name in names:
        expanded = list(THESIS_OCCUPATIONS.values()) if name == "thesis" else known if name == "all" else [name]
        for occupation in expanded:
            if occupation not in known:
                raise InputError(f"MAGBIG has no occupation '{name}' (its 151 are in assets/magbig/direct/"
                                 f"occ_english.csv, e.g. {', '.join(known[:4])}); or use 'thesis' or 'all'")
            if occupation not in out:
                out.append(occupation)
    return out


def set_row_of(prompt: str, code: str) -> tuple[str, str] | None:
    """(prompt set, occupation) when `prompt` is one of MAGBIG's prompts in the language `code`."""
    wanted = " ".join(prompt.split()).rstrip(".。").lower()
    for name, kind in PROMPT_SETS.items():
        found = set_prompts(kind, code)
        for occupation, text in (found[0] if found else {}).items():
            if " ".join(text.split()).rstrip(".。").lower() == wanted:
                return name, occupation
    return None


# -- the request --------------------------------------------------------------------------------------

def _check_codes(codes: list[str], engine: Engine) -> None:
    if len(codes) < 2:
        raise InputError("give two or more languages to compare (the first is the reference), e.g. en de")
    repeated = sorted({c for c in codes if codes.count(c) > 1})
    if repeated:
        raise InputError(f"the language {', '.join(repeated)} is given twice")
    for code in codes:
        parse_code(code)
    known = understanding(engine.preset.generator)
    if known.strict:
        unknown = [c for c in codes if not known.understands(parse_code(c)[0])]
        if unknown:
            raise InputError(f"{known.note}, not {' or '.join(f'{language_name(c)} ({c})' for c in unknown)}: it would "
                             "draw its default figure instead of results in that language, so nothing was run")


def check(request: LanguagesRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    codes = codes_of(request)
    _check_codes(codes, engine)
    engine.check_n(request.n)
    if request.prompt_set:
        if request.prompt_set not in PROMPT_SETS:
            raise InputError(f"there is no prompt set '{request.prompt_set}'; use {' or '.join(PROMPT_SETS)}")
        if request.prompt and request.prompt.strip():
            raise InputError("give a prompt or a prompt set, not both")
        if request.translations:
            raise InputError("a prompt set brings its own prompts: --translation is for a single prompt")
        occupations_of(request)
    else:
        engine.check_prompt(request.prompt)
    for code, text in (request.translations or {}).items():
        if str(code).strip().lower() not in codes:
            raise InputError(f"a translation for '{code}', which is not among the languages ({', '.join(codes)})")
        if str(code).strip().lower() == codes[0]:
            raise InputError(f"{code} is the first language: its prompt is the prompt itself, not a translation")
        engine.check_prompt(str(text), f"the {language_name(code)} prompt")
    engine.check_questions([axis_for(a).question for a in request.axes if a and a.strip()])
    if not [a for a in request.axes if a and a.strip()]:
        raise InputError("give at least one axis to measure (e.g. gender)")
    for name in ("exp_max_images", "exp_max_prompts", "exp_max_samples"):
        if not 1 <= int(getattr(request, name)) <= 100_000:
            raise InputError(f"{name.replace('_', ' ')} must be between 1 and 100000")


def _asks(request: LanguagesRequest) -> int:
    """LLM requests a run makes at most: per prompt not in the first language, a translation unless
    given or in the prompt set, and a back-translation."""
    codes = codes_of(request)
    if request.prompt_set:
        kind = PROMPT_SETS.get(request.prompt_set, "direct")
        try:
            occupations = occupations_of(request)
            files = [set_prompts(kind, c) for c in codes]
        except InputError:
            return len(codes) * 2
        missing = sum(not found or o not in found[0] for found in files for o in occupations)
        return missing + (len(occupations) * (len(codes) - 1) if request.back_translate else 0)
    given = {str(c).strip().lower() for c in request.translations or {}}
    first = codes[0] if codes else ""
    found = {c for c in codes[1:] if c not in given and _set_prompt_for(request.prompt, first, c)}
    translated = len([c for c in codes[1:] if c not in given and c not in found])
    return translated + (len(codes) - 1 if request.back_translate else 0)


def estimate(request: LanguagesRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images per language (and occupation); each LLM request (translation, back-translation) up to
    JSON_ATTEMPTS calls (its re-asks when the JSON is unusable)."""
    sets = len(codes_of(request))
    if request.prompt_set:
        try:
            sets *= len(occupations_of(request))
        except InputError:
            pass
    return Estimate(int(request.n) * sets, _asks(request) * JSON_ATTEMPTS)


# -- step 1: every language's prompt --------------------------------------------------------------------

def _set_prompt_for(prompt: str, first: str, code: str) -> tuple[str, str] | None:
    """(prompt, source) of `code` from the prompt set `prompt` belongs to (in the first language)."""
    try:
        row = set_row_of(prompt or "", first)
    except InputError:
        return None
    if row is None:
        return None
    found = set_prompts(PROMPT_SETS[row[0]], code)
    if not found or row[1] not in found[0]:
        return None
    return found[0][row[1]], found[1]


def _translation(obj) -> str:
    text = obj.get("translation") if isinstance(obj, dict) else obj
    if not isinstance(text, str) or not text.strip():
        raise ValueError('expected {"translation": "..."}')
    return " ".join(text.split())


def translate(engine: Engine, text: str, code: str, seed: int = 0) -> str:
    """`text` translated by the engine's LLM into the language `code` (its variant asking for feminine
    forms or the gender star), at temperature 0; LLMOutputError after ask_json's re-asks."""
    base, variant = parse_code(code)
    return engine.ask_json([{"role": "user", "content": translate_prompt(text, LANGUAGE_NAMES[base], variant)}],
                           _translation, temperature=0.0, seed=seed)


def proposal_calls(codes: list[str]) -> int:
    """The most LLM calls "Propose translations" makes for `codes`: a translation and a back-translation
    of every language after the first, each with its re-asks (JSON_ATTEMPTS)."""
    return 2 * max(0, len(codes) - 1) * JSON_ATTEMPTS


def check_proposal(engine: Engine, prompt: str, codes: list[str]) -> tuple[str, list[str]]:
    """(prompt, codes) of a proposal, checked before any LLM call: the prompt, every code, and (a public
    visitor) an hour that still holds its worst case (`proposal_calls`); InputError/OverBudgetError."""
    prompt = engine.check_prompt(prompt)
    codes = [str(c).strip().lower() for c in codes if str(c).strip()]
    for code in codes:
        parse_code(code)
    engine.afford("propose translations", llm_calls=proposal_calls(codes))
    return prompt, codes


def propose_translations(engine: Engine, prompt: str, codes: list[str], back: bool = True, seed: int = 0) -> dict:
    """What the tab's "Propose translations" fills its table with, before anything runs: for each
    code after the first, {"prompt", "source", "back_translation"} from the prompt set `prompt` is in,
    else the LLM; the back-translation into the first language when `back`."""
    prompt, codes = check_proposal(engine, prompt, codes)
    entries = _entries(engine, prompt, codes, {}, {}, seed)
    if back:
        _back_translate(engine, entries, codes[0], seed)
    return entries


def _entries(engine: Engine, prompt: str, codes: list[str], given: dict, sources: dict, seed: int) -> dict:
    """{code: {"prompt", "source"}}: the first language's prompt, the given ones, the prompt set's,
    then the LLM's translations (independent calls, llm_map)."""
    entries = {codes[0]: {"prompt": prompt, "source": "the prompt"}}
    missing = []
    for code in codes[1:]:
        if code in given:
            entries[code] = {"prompt": " ".join(str(given[code]).split()), "source": sources.get(code) or "given"}
        elif (found := _set_prompt_for(prompt, codes[0], code)) is not None:
            entries[code] = {"prompt": found[0], "source": found[1]}
        else:
            missing.append(code)
    llm = engine.model_id("llm")
    for code, text in zip(missing, llm_map(engine, lambda c: translate(engine, prompt, c, seed), missing)):
        entries[code] = {"prompt": text, "source": f"LLM ({llm})"}
    return {code: entries[code] for code in codes}


def _back_translate(engine: Engine, entries: dict, first: str, seed: int) -> None:
    """Adds "back_translation" (into the first language) to every entry but the first's."""
    todo = [code for code in entries if code != first and entries[code].get("prompt")]
    back = llm_map(engine, lambda c: translate(engine, entries[c]["prompt"], parse_code(first)[0], seed), todo)
    for code, text in zip(todo, back):
        entries[code]["back_translation"] = text


class Languages:
    """One run: the prompts settled, every language measured, then compared (`run` is the recipe)."""

    def __init__(self, request: LanguagesRequest, engine: Engine, run: Run):
        self.request, self.engine, self.run = request, engine, run
        self.codes = codes_of(request)
        self.known = understanding(engine.preset.generator)
        self.understood = {c: self.known.understands(parse_code(c)[0]) for c in self.codes}   # None: not known
        self.axes = [axis_for(a) for a in dict.fromkeys(a.strip() for a in request.axes if a and a.strip())]
        self.occupations = occupations_of(request) if request.prompt_set else [None]
        self.results: LanguagesResults = {
            "prompt": None if request.prompt_set else " ".join(request.prompt.split()),
            "prompt_set": request.prompt_set, "occupations": [o for o in self.occupations if o],
            "codes": self.codes, "names": {c: language_name(c) for c in self.codes}, "n": int(request.n),
            "seed": int(request.seed), "axes": {a.name: list(a.values) for a in self.axes},
            "model": {"generator": engine.preset.generator.label if backend_choices.free(engine)   # visitors: no
                      else short_label(engine.preset.generator.label),                                 # host path
                      "languages": sorted(self.known.languages) if self.known.languages is not None else None,
                      "note": self.known.note}, "notes": []}
        self.labels: dict[tuple[str, str | None], dict[str, dict[int, str]]] = {}   # (code, occ) -> axis -> seed -> label

    # -- 1. prompts ---------------------------------------------------------------------------------
    def settle_prompts(self):
        """Every language's prompt (and occupation's), with its source and back-translation; yields
        Progress, Warning for a failed back-translation and PromptsSettled."""
        request, engine = self.request, self.engine
        yield Progress(0, 1, "translations", "settling every language's prompt")
        given = {str(c).strip().lower(): t for c, t in (request.translations or {}).items()}
        if not request.prompt_set:
            entries = _entries(engine, self.results["prompt"], self.codes, given, request.sources or {}, request.seed)
            translations = {code: {None: entry} for code, entry in entries.items()}
        else:
            translations = {code: {} for code in self.codes}
            kind = PROMPT_SETS[request.prompt_set]
            english = set_prompts(kind, "en")[0]
            for code in self.codes:
                found = set_prompts(kind, code)
                missing = [o for o in self.occupations if not found or o not in found[0]]
                for occupation in self.occupations:
                    if occupation not in missing:
                        translations[code][occupation] = {"prompt": found[0][occupation], "source": found[1]}
                # the set has no prompt for it: the LLM translates MAGBIG's English one
                texts = llm_map(engine, lambda o: translate(engine, english[o], code, request.seed), missing)
                for occupation, text in zip(missing, texts):
                    translations[code][occupation] = {"prompt": text, "source": f"LLM ({engine.model_id('llm')}) "
                                                      "from MAGBIG's English"}
                translations[code] = {o: translations[code][o] for o in self.occupations}
        if request.back_translate and any(self.codes[1:]):
            for occupation in self.occupations:
                row = {code: translations[code][occupation] for code in self.codes}
                try:
                    _back_translate(engine, row, self.codes[0], request.seed)
                except LLMOutputError as exc:
                    yield Warning(f"no back-translation{f' for {occupation}' if occupation else ''}: {exc}")
        for code in self.codes:
            for entry in translations[code].values():
                entry["understood"] = self.understood[code]
        self.translations = translations
        self.results["translations"] = {code: (rows[None] if None in rows else rows)
                                        for code, rows in translations.items()}
        self.run.save(self.results)
        yield PromptsSettled(self.results["translations"])
        if self.known.languages is not None and not self.known.strict:
            foreign = [c for c in self.codes if not self.understood[c]]
            if foreign:
                yield Warning(f"{self.known.note}; its {', '.join(language_name(c) for c in foreign)} results are "
                              "labelled so")

    # -- 2. one Single Prompt run per language (and occupation) -------------------------------------------
    def measure(self):
        """Runs Single Prompt on each language's prompt with the same seeds (use `yield from`)."""
        from . import METHODS    # the table lists this module: read at call time

        row = METHODS["single_prompt"]
        options = {f.name: getattr(self.request, f.name) for f in fields(GenerationOptions)}
        child = self.engine.for_parts()
        total = len(self.codes) * len(self.occupations)
        self.results["languages"] = {code: {"prompt": None, "run_id": None, "shares": {}} for code in self.codes}
        done = 0
        for occupation in self.occupations:
            for code in self.codes:
                prompt = self.translations[code][occupation]["prompt"]
                what = f"{language_name(code)}" + (f", {occupation}" if occupation else "")
                yield Progress(done, total, "languages", f"{what} ({done + 1} of {total}): '{prompt}'")
                request = row.request(prompt=prompt, n=self.request.n, seed=self.request.seed,
                                      axes=[a.name for a in self.axes], gap=False, n_boot=self.request.n_boot,
                                      **options)
                try:
                    for event in row.run(request, child):
                        if isinstance(event, Done):
                            yield self._measured(code, occupation, prompt, event)
                        elif isinstance(event, Warning):
                            yield Warning(f"{what}: {event.message}")
                        elif not isinstance(event, Progress):
                            yield event
                except GapLensError as exc:
                    raise type(exc)(f"{what}: {exc}") from exc
                done += 1
                self.run.save(self.results)
        yield Progress(total, total, "languages", f"{total} image sets measured")

    def _measured(self, code: str, occupation: str | None, prompt: str, done: Done) -> LanguageMeasured:
        """Keeps a finished child run's labels by seed and shares; returns its event."""
        results = done.results
        valid = [image for image in results.get("images", []) if not image.get("nsfw")]
        labels = {}
        for axis in self.axes:
            m = (results.get("axes") or {}).get(axis.name) or {}
            labels[axis.name] = {int(image["seed"]): label for image, label in zip(valid, m.get("labels") or [])}
        self.labels[(code, occupation)] = labels
        shares = self._shares({axis: self._counts(code, [occupation], axis) for axis in labels})
        entry = {"prompt": prompt, "run_id": done.run_id, "shares": shares,
                 "understood": self.understood[code]}
        if occupation is None:
            self.results["languages"][code].update(entry)
        else:
            self.results["languages"][code].setdefault("prompts", {})[occupation] = entry
        return LanguageMeasured(code, occupation, done.run_id, shares)

    # -- 3. compare ---------------------------------------------------------------------------------------
    def classes(self, axis: str) -> list[str]:
        """The axis' classes: its fixed values, or every label seen (a free question), minus "other"."""
        values = self.results["axes"][axis]
        if values:
            return list(values)
        seen = {label for labels in self.labels.values() for label in labels.get(axis, {}).values()}
        return sorted(seen - {"other", "can't tell", ""})

    def _counts(self, code: str, occupations: list, axis: str) -> dict[str, int]:
        classes = self.classes(axis)
        counts = {c: 0 for c in classes}
        for occupation in occupations:
            for label in self.labels.get((code, occupation), {}).get(axis, {}).values():
                if label in counts:
                    counts[label] += 1
        return counts

    @staticmethod
    def _shares(counts_by_axis: dict[str, dict[str, int]]) -> dict:
        """axis -> class -> {"share", "ci" (Jeffreys 95%), "count"}, over the labels within the classes."""
        out = {}
        for axis, counts in counts_by_axis.items():
            n = sum(counts.values())
            out[axis] = {}
            for cls, k in counts.items():
                low, high = share_interval(k, n) if n else (None, None)
                out[axis][cls] = {"share": tidy(k / n) if n else None,
                                  "ci": [tidy(low), tidy(high)] if n else [None, None]}
        return out

    def compare(self) -> dict:
        """Fills results["languages"][code]["shares"] (pooled over a set's occupations), "differences",
        "tests" and "magbig"."""
        first = self.codes[0]
        occupations = self.occupations
        languages = self.results["languages"]
        for code in self.codes:
            counts = {a.name: self._counts(code, occupations, a.name) for a in self.axes}
            languages[code]["shares"] = self._shares(counts)
            languages[code]["counts"] = counts
            if self.request.prompt_set:
                languages[code]["prompt"] = f"{self.request.prompt_set}: {len(occupations)} occupations"
            languages[code]["understood"] = self.understood[code]
        paired = {code: {a.name: self._differences(first, code, a.name) for a in self.axes} for code in self.codes[1:]}
        self.results["differences"] = {code: {axis: {cls: {"delta": d["delta"], "ci": d["ci"]} for cls, d in classes.items()}
                                              for axis, classes in axes.items()} for code, axes in paired.items()}
        self.results["pairs"] = {code: {axis: max((d["n"] for d in classes.values()), default=0)
                                        for axis, classes in axes.items()} for code, axes in paired.items()}
        tests, magbig = {}, {}
        for a in self.axes:   # counts per language, occupation and class: each counted once
            table = [list(languages[code]["counts"][a.name].values()) for code in self.codes]
            cube = [[list(self._counts(code, [o], a.name).values()) for o in self.occupations] for code in self.codes]
            tests[a.name] = self._tests(table, cube)
            two = len(table[0]) >= 2   # MAGBIG's metrics need two classes
            magbig[a.name] = {code: self._magbig(rows) if two else {} for code, rows in zip(self.codes, cube)}
        self.results["tests"], self.results["magbig"] = tests, magbig
        return self.results

    def _differences(self, first: str, code: str, axis: str) -> dict:
        """class -> paired difference (code minus first) over the seeds (and occupations) both answered."""
        classes = self.classes(axis)
        pairs = []
        for occupation in self.occupations:
            a = self.labels.get((first, occupation), {}).get(axis, {})
            b = self.labels.get((code, occupation), {}).get(axis, {})
            pairs += [(a[s], b[s]) for s in sorted(set(a) & set(b)) if a[s] in classes and b[s] in classes]
        return {cls: metrics.paired_share_difference([x == cls for x, _ in pairs], [y == cls for _, y in pairs])
                for cls in classes}

    def _tests(self, table: list, cube: list) -> dict:
        """The tests of one axis on its languages × classes `table` and (a prompt set) languages ×
        occupations × classes `cube`."""
        out = {"language": metrics.language_effect(table, seed=self.request.seed)}
        if self.request.prompt_set:
            out["stratified"] = metrics.stratified_language_effect(cube)
            out["interaction"] = metrics.interaction(cube)
        return out

    def _magbig(self, counts: list) -> dict:
        """MAGBIG's metrics of one language's occupations × classes `counts`."""
        r = self.request
        return metrics.magbig_scores(counts, r.exp_max_images, r.exp_max_prompts, r.exp_max_samples, seed=r.seed)


@recorded("languages", check, estimate)
def run(request: LanguagesRequest, engine: Engine, run_record: Run):
    """The same prompt (or one of MAGBIG's prompt sets) in several languages on the same seeds: each
    language's Single Prompt measurements, their differences from the first language paired by seed,
    a test of no language effect per axis and MAGBIG's metrics.

    Request: LanguagesRequest (prompt or prompt set and occupations, language codes, translations, N,
    seed, axes, back-translation, MAGBIG's expected-maximum settings).
    Yields: Progress; PromptsSettled; Warning (English-only models, failed back-translations, each
    language run's warnings); each language run's Images and tables; LanguageMeasured per language
    (and occupation); LanguagesCompared; one Done.
    Results: LanguagesResults.
    """
    audit = Languages(request, engine, run_record)
    # 1. Every language's prompt: given, from a prompt set, or translated (and translated back).
    yield from audit.settle_prompts()
    # 2. One Single Prompt run per language (and occupation) on the same seeds.
    yield from audit.measure()
    # 3. Shares, paired differences, tests and MAGBIG's metrics.
    results = audit.compare()
    yield LanguagesCompared(results)
    yield run_record.finish(results, summary_of(results))


def summary_of(results: dict) -> dict:
    """The Runs list's row: the languages, and per axis the largest |difference| from the first language."""
    summary: dict = {"codes": results["codes"], "n": results["n"], "runs": sum(
        1 if entry.get("run_id") else len(entry.get("prompts") or {}) for entry in results["languages"].values())}
    for axis, test in (results.get("tests") or {}).items():
        if number(test["language"].get("p")) is not None:
            summary[f"p_language_{axis}"] = round(test["language"]["p"], 4)
    largest = _largest_difference(results)
    if largest:
        summary.update(largest_difference=round(largest["delta"], 3), largest_difference_of=largest["what"])
    return summary


def _largest_difference(results: dict) -> dict | None:
    best = None
    for code, axes in (results.get("differences") or {}).items():
        for axis, classes in axes.items():
            for cls, d in classes.items():
                if number(d.get("delta")) is not None and (best is None or abs(d["delta"]) > abs(best["delta"])):
                    best = {"delta": d["delta"], "what": f"{code} {axis} {cls}"}
    return best


def scores(results: dict, summary: dict) -> list[Score]:
    """Per axis and language each class' share with its interval, and its paired difference from the
    first language with its interval."""
    rows = []
    for code, entry in (results.get("languages") or {}).items():
        for axis, classes in (entry.get("shares") or {}).items():
            for cls, s in classes.items():
                if number(s.get("share")) is not None:
                    rows.append(Score(f"{axis}: {code}", f"share: {cls}", float(s["share"]), *s["ci"]))
    for code, axes in (results.get("differences") or {}).items():
        for axis, classes in axes.items():
            for cls, d in classes.items():
                if number(d.get("delta")) is not None:
                    rows.append(Score(f"{axis}: {code}", f"difference from {results['codes'][0]}: {cls}",
                                      float(d["delta"]), *d["ci"]))
    return rows


def headline(record: dict) -> tuple[str, float | None]:
    """("en de fr · largest difference +0.150 (de gender male)", 0.15) of a stored run."""
    summary = record.get("summary") or {}
    text = " ".join(map(str, summary.get("codes") or []))
    value = number(summary.get("largest_difference"))
    if value is not None:
        text += f" · largest difference {value:+.3f} ({summary.get('largest_difference_of', '')})"
    return text, value
