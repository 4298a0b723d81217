"""The synthetic world's bias table: axes, lexicon, subjects and rules, prompt parsing, and
the attribute sampling every synthetic image is drawn from.

The table (assets/synthetic_world.json) documents its own semantics in its "_doc" key; the
code here implements exactly that: prompt-named attributes first, then the other axes in
`sampling_order`, each from the first matching rule or else the subject's distribution.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from pathlib import Path

import numpy as np

DEFAULT_TABLE_PATH = Path(__file__).resolve().parents[3] / "assets" / "synthetic_world.json"
TABLES_DIR = DEFAULT_TABLE_PATH.parent / "synthetic_tables"   # named tables: `synthetic_generator:NAME`
ENGLISH = "en"
FORMS = ("masculine", "feminine", "neutral")   # grammatical forms a language's phrase names a subject by
# A word character of a script that separates its words with spaces: a phrase of such a script matches
# whole words only, and a character of Chinese, Japanese or Korean next to it is no part of its word.
_SPACED_WORD = r"[^\W\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"

# Part of every synthetic id: bump it when the drawing changes, so cached images are redrawn.
RENDERER_VERSION = 1

KINDS = ("person", "object")
POSITIONS = ("adjective", "suffix")


@dataclass(frozen=True)
class AxisSpec:
    """One attribute axis of the world."""

    name: str
    values: tuple[str, ...]
    applies_to: tuple[str, ...]
    position: str                          # where its phrase goes in a prompt: "adjective" | "suffix"
    phrases: dict[str, dict[str, str]]     # value -> kind -> canonical phrase
    answers: dict[str, str]                # value -> free-form VQA answer
    extra: dict = field(default_factory=dict, compare=False)   # e.g. ethnicity_answers

    def phrase(self, value: str, kind: str) -> str:
        return self.phrases[value][kind]


@dataclass(frozen=True)
class Subject:
    name: str
    kind: str
    phrases: tuple[str, ...]
    badge: str
    shape: str | None
    dist: dict[str, dict[str, float]]      # axis -> value -> probability, complete and normalised

    @property
    def phrase(self) -> str:
        """The canonical phrase that names the subject in a prompt."""
        return self.phrases[0] if self.phrases else "figure"


@dataclass(frozen=True)
class Rule:
    subjects: tuple[str, ...]              # ("*",) = every subject
    conditions: dict[str, tuple[str, ...]]
    then: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Mention:
    """A lexicon phrase found in a text: what it means and where it is."""

    start: int
    end: int
    text: str
    axis: str | None = None                # set for attribute phrases
    value: str | None = None
    subject: str | None = None             # set for subject phrases
    noun: bool = False                     # a gender noun such as "woman" also names a person
    form: str | None = None                # a subject named in another language: its grammatical form (FORMS)


@dataclass(frozen=True)
class ParsedPrompt:
    subject: str
    kind: str
    values: dict[str, str]                 # axis -> value, the first phrase per axis wins
    mentions: tuple[Mention, ...]
    subject_span: tuple[int, int] | None   # where the subject is named (a gender noun counts)
    form: str | None = None                # the grammatical form the subject is named by (None: English)


@dataclass(frozen=True)
class Language:
    """A language the world speaks (assets/synthetic_languages.json): how the synthetic LLM writes a
    prompt in it (`frame` with each subject's `translations[subject][form]`, form "default",
    "feminine" or "star")."""

    code: str
    name: str
    frame: str
    translations: dict[str, dict[str, str]]


class World:
    """A loaded, validated bias table."""

    def __init__(self, table: dict):
        self.table = table
        self.axes: dict[str, AxisSpec] = _load_axes(table)
        self.subjects: dict[str, Subject] = _load_subjects(table, self.axes)
        self.default_subject: str = table.get("default_subject", "default")
        if self.default_subject not in self.subjects:
            raise ValueError(f"synthetic world: default_subject '{self.default_subject}' is not a subject")
        self.sampling_order: tuple[str, ...] = tuple(table.get("sampling_order") or self.axes)
        if sorted(self.sampling_order) != sorted(self.axes):
            raise ValueError("synthetic world: sampling_order must list every axis exactly once; got "
                             f"{list(self.sampling_order)} for axes {list(self.axes)}")
        self.rules: list[Rule] = _load_rules(table, self.axes, self.subjects)
        self.embedder_config: dict = dict(table.get("embedder") or {})
        spoken = _load_language_table(table.get("languages"))
        self.languages: dict[str, Language] = _load_languages(spoken, self.subjects)
        self.pull: dict[str, tuple[str, str, float]] = _load_pull(spoken, self.axes)
        self._lexicon, unbounded = _build_lexicon(self.axes, self.subjects, spoken)
        bounded = sorted(set(self._lexicon) - unbounded, key=len, reverse=True)
        pattern = (rf"(?<!-)(?<!{_SPACED_WORD})(" + "|".join(_phrase_regex(p) for p in bounded)
                   + rf")(?!{_SPACED_WORD})(?!-)")
        if unbounded:   # Chinese, Japanese, Korean: no spaces around words
            pattern += "|(" + "|".join(_phrase_regex(p) for p in sorted(unbounded, key=len, reverse=True)) + ")"
        self._pattern = re.compile(pattern, re.IGNORECASE)
        self._parsed: dict[str, ParsedPrompt] = {}
        canonical = json.dumps({**table, "languages": spoken} if spoken else table, sort_keys=True, ensure_ascii=True)
        self.hash: str = hashlib.sha256(f"{canonical}|renderer={RENDERER_VERSION}".encode()).hexdigest()[:10]

    # -- structure --------------------------------------------------------------------------------
    def axes_for(self, kind: str) -> list[AxisSpec]:
        """The axes drawn for a subject kind, in table order."""
        return [axis for axis in self.axes.values() if kind in axis.applies_to]

    def subjects_of(self, kind: str) -> list[str]:
        """Named subjects of a kind in table order (the default subject excluded)."""
        return [s.name for s in self.subjects.values() if s.kind == kind and s.name != self.default_subject]

    # -- parsing ----------------------------------------------------------------------------------
    def mentions(self, text: str) -> list[Mention]:
        """Every lexicon phrase in `text`, left to right, longest phrase first at each position."""
        found = []
        for match in self._pattern.finditer(text or ""):
            phrase = match.group(1) if match.group(1) is not None else match.group(2)
            meaning = self._lexicon[_normalise_phrase(phrase)]
            found.append(Mention(match.start(), match.end(), phrase, **meaning))
        return found

    def parse(self, text: str) -> ParsedPrompt:
        """The subject (the first named subject; else 'person' if a person word or gender noun
        appears; else the default subject), the attribute values the text names and the grammatical
        form its subject is named by (another language's masculine or feminine noun; None in
        English). Cached per text (every image of a set parses its prompt)."""
        parsed = self._parsed.get(text)
        if parsed is None:
            if len(self._parsed) >= 4096:
                self._parsed.clear()
            parsed = self._parsed[text] = self._parse(text)
        return parsed

    def _parse(self, text: str) -> ParsedPrompt:
        mentions = self.mentions(text)
        values: dict[str, str] = {}
        for m in mentions:
            if m.axis and m.axis not in values:
                values[m.axis] = m.value
        generic = ("person", self.default_subject)
        named = [m for m in mentions if m.subject and m.subject not in generic]
        person_words = [m for m in mentions if m.subject == "person" or m.noun]
        default_words = [m for m in mentions if m.subject == self.default_subject]
        form = None
        if named:
            subject, span, form = named[0].subject, (named[0].start, named[0].end), named[0].form
        elif person_words and "person" in self.subjects:
            subject, span = "person", (person_words[0].start, person_words[0].end)
        elif default_words:
            subject, span = self.default_subject, (default_words[0].start, default_words[0].end)
        else:
            subject, span = self.default_subject, None
        return ParsedPrompt(subject, self.subjects[subject].kind, values, tuple(mentions), span, form)

    def knows_subject(self, text: str) -> bool:
        """False when `text` names nothing the world knows (no subject, person word or its default
        subject's own phrase): it is drawn as the default figure, whatever it meant ("a surgeon")."""
        return self.parse(text).subject_span is not None

    def parse_prompt(self, text: str) -> tuple[str, dict[str, str]]:
        """(subject name, {axis: value}) for the values the text names, applicable or not."""
        parsed = self.parse(text)
        return parsed.subject, dict(parsed.values)

    def lookup(self, phrase: str) -> tuple[str, str] | None:
        """(axis, value) for a short answer choice such as 'woman', 'dark' or 'middle-aged':
        an axis value's own name counts even where the free-text lexicon leaves it out."""
        key = _normalise_phrase(phrase)
        for axis in self.axes.values():
            if key in axis.values:
                return axis.name, key
        values = self.parse(phrase).values
        return next(iter(values.items())) if values else None

    def axes_in_text(self, text: str) -> list[str]:
        """Axes whose name or keywords (word beginnings) occur in `text`, in order of first
        occurrence, e.g. 'What is the person wearing?' -> ['clothing']."""
        lowered = (text or "").lower()
        first: dict[str, int] = {}
        for axis in self.axes.values():
            for word in (axis.name, *(axis.extra.get("keywords") or [])):
                match = re.search(r"(?<!\w)" + re.escape(word.lower()), lowered)
                if match:
                    first[axis.name] = min(first.get(axis.name, match.start()), match.start())
        return sorted(first, key=first.get)

    # -- sampling ---------------------------------------------------------------------------------
    def distribution(self, subject: str, axis: str, fixed: dict[str, str]) -> dict[str, float]:
        """The distribution `axis` is sampled from, given the attributes fixed so far."""
        for rule in self.rules:
            if axis in rule.then and ("*" in rule.subjects or subject in rule.subjects) and all(
                    fixed.get(a) in allowed for a, allowed in rule.conditions.items()):
                return rule.then[axis]
        return self.subjects[subject].dist[axis]

    def sample(self, prompt: str, seed: int, guidance: float = 0.0, negative_prompt: str = "") -> dict:
        """The ground-truth attributes of image (prompt, seed): {"subject", "kind", axis: value
        for every axis of the subject's kind}."""
        parsed = self.parse(prompt)
        axes = {a.name for a in self.axes_for(parsed.kind)}
        excluded = self._named_values(negative_prompt)
        uniforms = np.random.default_rng(seed_int("attributes", prompt, seed)).random(len(self.sampling_order))
        fixed = {a: v for a, v in parsed.values.items() if a in axes}
        for axis, u in zip(self.sampling_order, uniforms):
            if axis in axes and axis not in fixed:
                dist = self._effective(parsed.subject, axis, fixed, guidance, excluded, parsed.form)
                fixed[axis] = _inverse_cdf(dist, u)
        ordered = {a: fixed[a] for a in self.axes if a in axes}
        return {"subject": parsed.subject, "kind": parsed.kind, **ordered}

    def expected_distribution(self, prompt: str, axis: str, guidance: float = 0.0,
                              negative_prompt: str = "") -> dict[str, float]:
        """The exact probability of each value of `axis` in images of `prompt` (enumerates the
        sampling chain; what N images converge to). Empty for an axis the subject lacks."""
        parsed = self.parse(prompt)
        axes = [a for a in self.sampling_order if a in {s.name for s in self.axes_for(parsed.kind)}]
        if axis not in axes:
            return {}
        excluded = self._named_values(negative_prompt)
        named = {a: v for a, v in parsed.values.items() if a in axes}
        result = {v: 0.0 for v in self.axes[axis].values}
        upstream = axes[:axes.index(axis) + 1]
        free = [a for a in upstream if a not in named]
        for combo in product(*(self.axes[a].values for a in free)):
            fixed, weight = dict(named), 1.0
            for a in upstream:
                if a in named:
                    continue
                value = combo[free.index(a)]
                weight *= self._effective(parsed.subject, a, fixed, guidance, excluded, parsed.form)[value]
                fixed[a] = value
                if weight == 0.0:
                    break
            if weight:
                result[fixed[axis]] += weight
        return result

    def _named_values(self, text: str) -> dict[str, set[str]]:
        """Every value each axis has a phrase for in `text` (a negative prompt)."""
        named: dict[str, set[str]] = {}
        for m in self.mentions(text):
            if m.axis:
                named.setdefault(m.axis, set()).add(m.value)
        return named

    def _effective(self, subject: str, axis: str, fixed: dict[str, str], guidance: float,
                   excluded: dict[str, set[str]], form: str | None = None) -> dict[str, float]:
        dist = self.distribution(subject, axis, fixed)
        pull = self.pull.get(form or "")
        if pull and pull[0] == axis:   # a masculine or feminine noun pulls gender its way (languages table)
            toward, weight = pull[1], pull[2]
            dist = {v: (1 - weight) * p + (weight if v == toward else 0.0) for v, p in dist.items()}
        dist = sharpen(dist, guidance)
        if excluded.get(axis):
            kept = {v: (0.0 if v in excluded[axis] else p) for v, p in dist.items()}
            if sum(kept.values()) > 0:
                dist = _normalised(kept)
        return dist


def sharpen(dist: dict[str, float], guidance: float) -> dict[str, float]:
    """p -> p^(1 + guidance/10), renormalised; zeros stay zero. Guidance 0 leaves p as is."""
    exponent = max(0.0, 1.0 + float(guidance) / 10.0)
    if exponent == 1.0:
        return dist
    return _normalised({v: (p ** exponent if p > 0 else 0.0) for v, p in dist.items()})


def seed_int(*parts) -> int:
    """A 64-bit seed from any parts, stable across runs and platforms."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _inverse_cdf(dist: dict[str, float], u: float) -> str:
    cumulative = 0.0
    last_possible = None
    for value, p in dist.items():
        if p <= 0:
            continue
        cumulative += p
        last_possible = value
        if u < cumulative:
            return value
    return last_possible  # u beyond a cumulative sum that rounds below 1


def _normalised(dist: dict[str, float]) -> dict[str, float]:
    total = sum(dist.values())
    return {v: p / total for v, p in dist.items()}


# -- loading and validation ------------------------------------------------------------------------
def _load_axes(table: dict) -> dict[str, AxisSpec]:
    axes = {}
    for name, spec in (table.get("axes") or {}).items():
        values = tuple(spec["values"])
        applies = tuple(spec.get("applies_to") or ["person"])
        position = spec.get("position", "suffix")
        if len(values) < 2 or len(set(values)) != len(values):
            raise ValueError(f"synthetic world: axis '{name}' needs at least two distinct values")
        if not set(applies) <= set(KINDS) or position not in POSITIONS:
            raise ValueError(f"synthetic world: axis '{name}': applies_to must be within {KINDS} "
                             f"and position one of {POSITIONS}")
        phrases = {}
        for value in values:
            raw = (spec.get("phrases") or {}).get(value, value)
            phrases[value] = {kind: (raw[kind] if isinstance(raw, dict) else raw) for kind in applies}
        answers = {v: (spec.get("answers") or {}).get(v, v) for v in values}
        for key in ("synonyms", "nouns", "phrases", "answers"):
            unknown = set(spec.get(key) or {}) - set(values)
            if unknown:
                raise ValueError(f"synthetic world: axis '{name}' {key} name unknown values {sorted(unknown)}")
        extra = {k: v for k, v in spec.items()
                 if k not in ("values", "applies_to", "position", "phrases", "answers")}
        axes[name] = AxisSpec(name, values, applies, position, phrases, answers, extra)
    if not axes:
        raise ValueError("synthetic world: the table defines no axes")
    return axes


def _complete_distribution(raw: dict | None, values: tuple[str, ...], where: str) -> dict[str, float]:
    if not raw:
        return {v: 1.0 / len(values) for v in values}
    unknown = set(raw) - set(values)
    if unknown:
        raise ValueError(f"synthetic world: {where} names unknown values {sorted(unknown)}")
    dist = {v: float(raw.get(v, 0.0)) for v in values}
    if any(p < 0 for p in dist.values()) or sum(dist.values()) <= 0:
        raise ValueError(f"synthetic world: {where} must have non-negative probabilities with a positive sum")
    if abs(sum(dist.values()) - 1.0) > 0.01:
        raise ValueError(f"synthetic world: {where} sums to {sum(dist.values()):.3f}, not 1")
    return _normalised(dist)


def _load_subjects(table: dict, axes: dict[str, AxisSpec]) -> dict[str, Subject]:
    subjects = {}
    for name, spec in (table.get("subjects") or {}).items():
        kind = spec.get("kind", "person")
        if kind not in KINDS:
            raise ValueError(f"synthetic world: subject '{name}' has kind '{kind}', not one of {KINDS}")
        raw = spec.get("dist") or {}
        for axis in raw:
            if axis not in axes or kind not in axes[axis].applies_to:
                raise ValueError(f"synthetic world: subject '{name}' has a distribution for '{axis}', "
                                 f"which is not an axis of a {kind}")
        dist = {axis.name: _complete_distribution(raw.get(axis.name), axis.values, f"subject '{name}' axis '{axis.name}'")
                for axis in axes.values() if kind in axis.applies_to}
        badge = spec.get("badge") or name[:2].upper()
        subjects[name] = Subject(name, kind, tuple(spec.get("phrases") or []), badge,
                                 spec.get("shape"), dist)
    if not subjects:
        raise ValueError("synthetic world: the table defines no subjects")
    return subjects


def _load_rules(table: dict, axes: dict[str, AxisSpec], subjects: dict[str, Subject]) -> list[Rule]:
    rules = []
    for i, spec in enumerate(table.get("rules") or []):
        names = spec.get("subject", "*")
        names = tuple([names] if isinstance(names, str) else names)
        unknown = [n for n in names if n != "*" and n not in subjects]
        if unknown:
            raise ValueError(f"synthetic world: rule {i} names unknown subjects {unknown}")
        conditions = {}
        for axis, allowed in (spec.get("if") or {}).items():
            allowed = tuple([allowed] if isinstance(allowed, str) else allowed)
            if axis not in axes or not set(allowed) <= set(axes[axis].values):
                raise ValueError(f"synthetic world: rule {i} has an unknown condition {axis}={allowed}")
            conditions[axis] = allowed
        then = {}
        for axis, raw in (spec.get("then") or {}).items():
            if axis not in axes:
                raise ValueError(f"synthetic world: rule {i} sets unknown axis '{axis}'")
            then[axis] = _complete_distribution(raw, axes[axis].values, f"rule {i} axis '{axis}'")
        if not then:
            raise ValueError(f"synthetic world: rule {i} has no 'then'")
        rules.append(Rule(names, conditions, then))
    return rules


def _normalise_phrase(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def _phrase_regex(phrase: str) -> str:
    return r"\s+".join(re.escape(word) for word in phrase.split(" "))


def _plural(phrase: str) -> str:
    words = phrase.split(" ")
    last = words[-1]
    if last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        last = last[:-1] + "ies"
    else:
        last += "s"
    return " ".join(words[:-1] + [last])


def _build_lexicon(axes: dict[str, AxisSpec], subjects: dict[str, Subject],
                   spoken: dict | None = None) -> tuple[dict[str, dict], set[str]]:
    """(phrase -> meaning (the keyword arguments of a Mention), the phrases of languages written
    without spaces, matched inside runs of characters). A phrase may mean one thing only; a
    language's phrase that another already gives the same subject keeps its first meaning."""
    lexicon: dict[str, dict] = {}
    unbounded: set[str] = set()

    def add(phrase: str, meaning: dict, origin: str) -> None:
        key = _normalise_phrase(phrase)
        if not key:
            return
        if key in lexicon and lexicon[key] != meaning:
            if "form" in meaning and lexicon[key].get("subject") == meaning["subject"]:
                return
            raise ValueError(f"synthetic world: the phrase '{key}' ({origin}) already means {lexicon[key]}")
        lexicon[key] = meaning

    for axis in axes.values():
        for value in axis.values:
            for phrase in (axis.extra.get("synonyms") or {}).get(value, []):
                add(phrase, {"axis": axis.name, "value": value}, f"axis {axis.name}")
            for phrase in (axis.extra.get("nouns") or {}).get(value, []):
                add(phrase, {"axis": axis.name, "value": value, "noun": True}, f"axis {axis.name}")
            for kind in axis.applies_to:
                add(axis.phrase(value, kind), {"axis": axis.name, "value": value}, f"axis {axis.name}")
    for subject in subjects.values():
        for phrase in subject.phrases:
            add(phrase, {"subject": subject.name}, f"subject {subject.name}")
            if _normalise_phrase(_plural(phrase)) not in lexicon:
                add(_plural(phrase), {"subject": subject.name}, f"subject {subject.name}")
    for code, language in ((spoken or {}).get("languages") or {}).items():
        for name, forms in (language.get("subjects") or {}).items():
            for form in FORMS:
                for phrase in forms.get(form) or []:
                    add(phrase, {"subject": name, "form": form}, f"language {code}, subject {name}")
                    if language.get("boundaries") is False:
                        unbounded.add(_normalise_phrase(phrase))
        for name, sentences in (language.get("sentences") or {}).items():
            for sentence in sentences:
                add(sentence, {"subject": name, "form": "neutral"}, f"language {code}, a sentence about {name}")
    return lexicon, unbounded


def _load_language_table(source) -> dict:
    """The languages table a world's "languages" key names: a file name (beside the shipped table),
    a path, or the table itself; {} (English only) without one."""
    if not source:
        return {}
    if isinstance(source, dict):
        return source
    path = Path(source).expanduser()
    path = path if path.is_absolute() else DEFAULT_TABLE_PATH.parent / path
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"synthetic world: cannot read its languages table {path}: {exc}") from exc


def _load_languages(spoken: dict, subjects: dict[str, Subject]) -> dict[str, Language]:
    """English (the table's own phrases) and every language of the languages table."""
    english = {s.name: {"default": s.phrase} for s in subjects.values()}
    languages = {ENGLISH: Language(ENGLISH, "English", "a photo of {noun}", english)}
    for code, spec in (spoken.get("languages") or {}).items():
        unknown = set(spec.get("subjects") or {}) | set(spec.get("sentences") or {})
        unknown -= set(subjects)
        if unknown:
            raise ValueError(f"synthetic world: language '{code}' names unknown subjects {sorted(unknown)}")
        for name, forms in (spec.get("subjects") or {}).items():
            odd = set(forms) - set(FORMS) - {"translate"}
            if odd:
                raise ValueError(f"synthetic world: language '{code}', subject '{name}': unknown forms {sorted(odd)}")
        if code == ENGLISH:
            continue   # English's subjects are the table's; its entry only adds sentences
        translations = {name: dict(forms.get("translate") or {}) for name, forms in (spec.get("subjects") or {}).items()}
        languages[code] = Language(code, str(spec.get("name") or code), str(spec.get("frame") or "{noun}"), translations)
    return languages


def _load_pull(spoken: dict, axes: dict[str, AxisSpec]) -> dict[str, tuple[str, str, float]]:
    """form -> (axis, value, weight): how a masculine or feminine noun pulls an axis."""
    pull = {}
    for form, spec in (spoken.get("pull") or {}).items():
        axis, value, weight = spec.get("axis"), spec.get("value"), float(spec.get("weight", 0.0))
        if form not in FORMS or axis not in axes or value not in axes[axis].values or not 0.0 <= weight <= 1.0:
            raise ValueError(f"synthetic world: the languages table's pull for '{form}' must name a form "
                             f"{FORMS}, an axis and one of its values, and a weight from 0 to 1")
        pull[form] = (axis, value, weight)
    return pull


# -- loading ------------------------------------------------------------------------------------------
def load_world(source: str | Path | dict | None = None) -> World:
    """The world of a table: a dict, a path to a JSON file, the name of a table in
    assets/synthetic_tables/ (`synthetic_generator:doctor-male-95`), a bare file name not found here (the
    one shipped in assets/ of that name, as the app names it: `synthetic_vqa:synthetic_world.json`), or
    None/'default' for the shipped assets/synthetic_world.json. Files are cached by path and modification time."""
    if isinstance(source, dict):
        return World(extended(source, DEFAULT_TABLE_PATH.parent))
    path = table_path(source)
    return _load_world_file(str(path), path.stat().st_mtime_ns)


def table_path(source: str | Path | None) -> Path:
    """The file a table name stands for: the shipped table for None/'default', a name of
    TABLES_DIR (without '.json'), else a path; FileNotFoundError when there is no such file."""
    if source in (None, "", "default", "synthetic", "synthetic_world"):
        return DEFAULT_TABLE_PATH
    named = TABLES_DIR / f"{source}.json"
    if re.fullmatch(r"[\w.-]+", str(source)) and named.is_file():
        return named
    path = Path(source)
    shipped = DEFAULT_TABLE_PATH.parent / path.name
    if not path.is_absolute() and not path.is_file() and path.name == str(source) and shipped.is_file():
        path = shipped   # a shipped table by its file name, as the app names it ('synthetic_vqa:synthetic_world.json')
    path = path.expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"synthetic world table not found: {path} (named tables: "
                                f"{', '.join(sorted(p.stem for p in TABLES_DIR.glob('*.json')))})")
    return path


def extended(table: dict, folder: Path, depth: int = 0) -> dict:
    """`table` on top of the table its "extends" names (a name or a path relative to `folder`): dicts
    merged key by key, anything else (a list of rules, a distribution's value) replaced. A fine-tune
    of the world is then the one distribution it changes."""
    if "extends" not in table:
        return table
    if depth > 4:
        raise ValueError("synthetic world tables extend each other more than 4 deep")
    name = str(table["extends"])
    path = table_path(name if (TABLES_DIR / f"{name}.json").is_file() or name in ("default", "synthetic_world")
                      else str((folder / name)))
    base = extended(_read_table(str(path)), path.parent, depth + 1)
    return _merged(base, {k: v for k, v in table.items() if k != "extends"})


def _merged(base, change):
    if isinstance(base, dict) and isinstance(change, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in change.items()}}
    return change


def _read_table(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as exc:
            raise ValueError(f"synthetic world table {path} is not valid JSON: {exc}") from exc


@lru_cache(maxsize=8)
def _load_world_file(path: str, _mtime_ns: int) -> World:
    return World(extended(_read_table(path), Path(path).parent))
