"""The synthetic lexicon LLM: answers GapLens's own meta-prompts (engine/common/llm_prompts.py)
from the world's lexicon, deterministically.

Each meta-prompt is recognised by matching the last user message against its template
(the template's literal text, its {fields} captured); TIBET's second and third turns by
their opening words, reading the prompt from the first turn and the axes and
counterfactuals from the assistant's earlier replies in the conversation. At temperature 0
the reply does not depend on the seed; above 0 the seed reorders the choices it makes.
"""
from __future__ import annotations

import json
import re
import string
from typing import Sequence

import numpy as np

from ...common import llm_prompts
from .phrasing import article_for, back_translate, translate, with_attributes, with_subject
from .world import World, seed_int

MIN_TIBET_AXES = 3
PERSON_TEMPLATES = ("a photo of {a} {s}", "a portrait of {a} {s} at work", "{a} {s} on a typical day")
OBJECT_TEMPLATES = ("a photo of {a} {s}", "a close-up photo of {a} {s}", "a simple picture of {a} {s}")
_PERSON_NEEDS = re.compile(r"\b(person|people|human|man|woman|men|women|someone|occupation)")
_OBJECT_NEEDS = re.compile(r"\b(object|thing|item|colou?r)")


def _template_pattern(template: str) -> re.Pattern:
    """A regex matching text made from `template`, one named group per {field} (a field
    used twice must repeat the same text); runs of whitespace match any whitespace."""
    parts, seen = [], set()
    for literal, name, _spec, _conversion in string.Formatter().parse(template):
        parts.extend(r"\s+" if chunk.isspace() else re.escape(chunk) for chunk in re.split(r"(\s+)", literal) if chunk)
        if name is not None:
            parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.*?)")
            seen.add(name)
    return re.compile("".join(parts), re.DOTALL)


TEMPLATE_TASKS = {
    "tibet_axes": _template_pattern(llm_prompts.TIBET_AXES),
    "variations": _template_pattern(llm_prompts.VARIATIONS),
    "mutations": _template_pattern(llm_prompts.MUTATIONS),
    "random_prompts": _template_pattern(llm_prompts.RANDOM_PROMPTS),
    "axis_question": _template_pattern(llm_prompts.AXIS_QUESTION),
    "translate": _template_pattern(llm_prompts.TRANSLATE),
}
TIBET_COUNTERFACTUALS_OPENING = "generate many counterfactuals"
TIBET_TO_JSON_OPENING = "convert these to a json"


def _text(message: dict) -> str:
    content = message.get("content", "")
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


class SyntheticLLM:
    def __init__(self, world: World):
        self.world = world
        self.id = f"synthetic-llm:{world.hash}"

    def chat(self, messages: Sequence[dict], *, temperature: float = 1.0, max_tokens: int = 1024,
             seed: int = 0) -> str:
        """The reply to the last user message (max_tokens is not enforced: replies are short)."""
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            return self._prose_help()
        last = _text(messages[users[-1]]).strip()
        rng = np.random.default_rng(seed_int("llm", last, seed)) if temperature > 0 else None
        lowered = last.lower()
        if lowered.startswith(TIBET_COUNTERFACTUALS_OPENING):
            return self._tibet_counterfactuals(messages)
        if lowered.startswith(TIBET_TO_JSON_OPENING):
            return self._tibet_json(messages)
        for task, pattern in TEMPLATE_TASKS.items():
            match = pattern.fullmatch(last)
            if match:
                return getattr(self, f"_{task}")(match.groupdict(), rng)
        return self._prose_help()

    # -- TIBET (three turns in one chat) -------------------------------------------------------------
    def tibet_axes(self, prompt: str, rng: np.random.Generator | None = None) -> list[str]:
        """The axes TIBET's first turn names for a prompt: those of the subject's kind that the
        prompt leaves open (named ones too when fewer than 3 are open), shuffled by `rng`."""
        parsed = self.world.parse(prompt)
        kind_axes = [a.name for a in self.world.axes_for(parsed.kind)]
        axes = [a for a in kind_axes if a not in parsed.values]
        if len(axes) < MIN_TIBET_AXES:
            axes += [a for a in kind_axes if a in parsed.values][:MIN_TIBET_AXES - len(axes)]
        if rng is not None:
            axes = [axes[i] for i in rng.permutation(len(axes))]
        return axes

    def counterfactuals(self, prompt: str, axis: str) -> list[str]:
        """One prompt per other value of the axis, each differing from `prompt` in that one
        attribute phrase ("a photo of a doctor" -> "a photo of a female doctor", ...)."""
        current = self.world.parse(prompt).values.get(axis)
        return [with_attributes(self.world, prompt, {axis: value})
                for value in self.world.axes[axis].values if value != current]

    def _tibet_axes(self, fields: dict, rng: np.random.Generator | None) -> str:
        prompt = fields["prompt"].strip()
        lines = [f'For the prompt "{prompt}", the generated images may be biased along these axes:']
        for i, axis in enumerate(self.tibet_axes(prompt, rng), start=1):
            values = self.world.axes[axis].values
            lines.append(f"{i}. {axis}: the images may show mostly one {axis} "
                         f"({', '.join(values[:-1])} or {values[-1]}).")
        return "\n".join(lines)

    def _tibet_context(self, messages: Sequence[dict]) -> tuple[str | None, list[str], dict[str, list[str]]]:
        """From the conversation so far: the prompt of turn 1, the axes the assistant listed
        after it, and the counterfactuals it listed after turn 2."""
        prompt, axes, counterfactuals = None, [], {}
        stage = None
        for message in messages:
            text = _text(message).strip()
            if message.get("role") == "user":
                match = TEMPLATE_TASKS["tibet_axes"].fullmatch(text)
                if match:
                    prompt, axes, counterfactuals, stage = match.group("prompt").strip(), [], {}, "axes"
                elif text.lower().startswith(TIBET_COUNTERFACTUALS_OPENING):
                    stage = "counterfactuals"
                else:
                    stage = None
            elif message.get("role") == "assistant" and stage == "axes":
                axes = [name for name in (m.strip().lower() for m in re.findall(r"^\s*\d+\.\s*([^:\n]+):", text, re.M))
                        if name in self.world.axes]
            elif message.get("role") == "assistant" and stage == "counterfactuals":
                counterfactuals = _parse_sections(text, self.world.axes)
        return prompt, axes, counterfactuals

    def _tibet_counterfactuals(self, messages: Sequence[dict]) -> str:
        prompt, axes, _ = self._tibet_context(messages)
        if prompt is None:
            return "Please first give me the image generation prompt, so I can name its bias axes."
        axes = axes or self.tibet_axes(prompt)
        blocks = ["Counterfactual prompts, one concept changed at a time:"]
        for axis in axes:
            blocks.append(f"\n{axis}:\n" + "\n".join(f"- {cf}" for cf in self.counterfactuals(prompt, axis)))
        return "\n".join(blocks)

    def _tibet_json(self, messages: Sequence[dict]) -> str:
        prompt, axes, counterfactuals = self._tibet_context(messages)
        if prompt is None:
            return "{}"
        if not counterfactuals:
            counterfactuals = {axis: self.counterfactuals(prompt, axis) for axis in (axes or self.tibet_axes(prompt))}
        return json.dumps(counterfactuals, indent=2)

    # -- MineTheGap ---------------------------------------------------------------------------------
    def variations(self, prompt: str, n: int, axes: list[str] | None = None,
                   rng: np.random.Generator | None = None) -> list[str]:
        """n sentences that keep the prompt and name a value for each open axis (only `axes`
        when given), spreading the values as evenly as possible: the full grid of value
        combinations cycled when it fits in n, else every axis balanced on its own."""
        parsed = self.world.parse(prompt)
        rng = rng if rng is not None else np.random.default_rng(seed_int("variations", prompt))
        open_axes = [a.name for a in self.world.axes_for(parsed.kind) if a.name not in parsed.values
                     and (axes is None or a.name in axes)]
        if not open_axes:
            return [prompt] * n
        sizes = [len(self.world.axes[a].values) for a in open_axes]
        grid = int(np.prod(sizes))
        if grid <= n:
            every = [tuple(int(k) for k in np.unravel_index(c, sizes)) for c in rng.permutation(grid)]
            combos = every * (n // grid) + _balanced_subset(every, sizes, n % grid)
        else:
            columns = [rng.permutation([i % size for i in range(n)]) for size in sizes]
            combos = list(zip(*columns))
        return [with_attributes(self.world, prompt, {axis: self.world.axes[axis].values[int(k)]
                                                     for axis, k in zip(open_axes, combo)})
                for combo in combos]

    def _variations(self, fields: dict, rng: np.random.Generator | None) -> str:
        only = re.match(r"\s*vary only (.+?); keep", fields.get("axis_hint", ""))
        axes = None
        if only:   # an axis the world does not know leaves every open axis to vary
            axes = self.world.axes_in_text(only.group(1)) or None
        return json.dumps(self.variations(fields["prompt"].strip(), _count(fields["n"]), axes, rng))

    def mutations(self, prompt: str, m: int, rng: np.random.Generator | None = None) -> list[str]:
        """m prompts with the subject swapped for another of the same kind, the rest kept."""
        parsed = self.world.parse(prompt)
        rng = rng if rng is not None else np.random.default_rng(seed_int("mutations", prompt))
        candidates = [s for s in self.world.subjects_of(parsed.kind) if s != parsed.subject]
        candidates = [candidates[i] for i in rng.permutation(len(candidates))]
        result = []
        for subject in candidates:
            mutated = with_subject(self.world, prompt, subject)
            if mutated != prompt and mutated not in result:
                result.append(mutated)
            if len(result) == m:
                break
        return result

    def _mutations(self, fields: dict, rng: np.random.Generator | None) -> str:
        return json.dumps(self.mutations(fields["prompt"].strip(), _count(fields["m"]), rng))

    def random_prompts(self, r: int, avoid: Sequence[str] = (), needs: str = "",
                       rng: np.random.Generator | None = None) -> list[str]:
        """r short prompts about the table's subjects, preferring subjects the avoided
        prompts do not mention and never repeating an avoided prompt; `needs` ('at least one
        person', 'an object with a colour') restricts the kind."""
        rng = rng if rng is not None else np.random.default_rng(seed_int("random", r, *avoid))
        kinds = {"person", "object"}
        for axis in self.world.axes_in_text(needs):
            kinds &= set(self.world.axes[axis].applies_to)
        if _PERSON_NEEDS.search(needs.lower()):
            kinds &= {"person"}
        elif _OBJECT_NEEDS.search(needs.lower()):
            kinds &= {"object"}
        kinds = [k for k in ("person", "object") if k in kinds] or ["person", "object"]
        subjects = [s for kind in kinds for s in self.world.subjects_of(kind)]
        used = {self.world.parse(p).subject for p in avoid}
        shuffled = [subjects[i] for i in rng.permutation(len(subjects))]
        ordered = [s for s in shuffled if s not in used] + [s for s in shuffled if s in used]
        avoided = {p.strip().lower() for p in avoid}
        result: list[str] = []
        for subject in ordered * len(PERSON_TEMPLATES):
            templates = PERSON_TEMPLATES if self.world.subjects[subject].kind == "person" else OBJECT_TEMPLATES
            phrase = self.world.subjects[subject].phrase
            template = templates[int(rng.integers(len(templates)))]
            prompt = template.format(a=article_for(phrase), s=phrase)
            if prompt.lower() not in avoided and prompt not in result:
                result.append(prompt)
            if len(result) == r:
                break
        return result

    def _random_prompts(self, fields: dict, rng: np.random.Generator | None) -> str:
        avoid = [p.strip() for p in fields.get("avoid", "").split(";") if p.strip() and p.strip() != "none"]
        needs = re.sub(r"^\s*Each prompt must include\s*", "", fields.get("axis_clause", "")).rstrip(". \n")
        return json.dumps(self.random_prompts(_count(fields["r"]), avoid, needs, rng))

    # -- BiasConnect ----------------------------------------------------------------------------------
    def _axis_question(self, fields: dict, rng: np.random.Generator | None) -> str:
        axis, values = fields["axis"].strip(), fields["values"].strip()
        known = self.world.axes_in_text(axis)
        kind = self.world.axes[known[0]].applies_to[0] if known else "person"
        thing = "the person" if kind == "person" else "the object"
        return json.dumps({"question": f"What is the {axis} ({values}) of {thing} in the image?"})

    # -- Languages ------------------------------------------------------------------------------------
    def _translate(self, fields: dict, rng: np.random.Generator | None) -> str:
        """{"translation": ...}: the prompt in a language the world speaks (phrasing.translate), or back
        in English (phrasing.back_translate); a prompt naming nothing it knows is left as it is."""
        language, _, clause = (fields["language"] + fields["form_clause"]).partition(",")
        name = language.strip().lower()
        code = next((c for c, spoken in self.world.languages.items() if name in (c, spoken.name.lower())), None)
        if code is None:
            names = ", ".join(spoken.name for spoken in self.world.languages.values())
            return f"I cannot translate into {language.strip()}: the synthetic world speaks {names}."
        form = "feminine" if "feminine" in clause else "star" if "gender star" in clause else "default"
        prompt = fields["prompt"].strip()
        text = back_translate(self.world, prompt) if code == "en" else translate(self.world, prompt, code, form)
        return json.dumps({"translation": text or prompt}, ensure_ascii=False)

    def _prose_help(self) -> str:
        persons = ", ".join(self.world.subjects_of("person")[:6])
        objects = ", ".join(self.world.subjects_of("object")[:6])
        return ("I am the synthetic world's lexicon model: I answer GapLens's bias-audit meta-prompts "
                f"(bias axes, counterfactuals, variations, mutations, random prompts). I know people such as "
                f"{persons}, and objects such as {objects}.")


def _balanced_subset(combos: list[tuple[int, ...]], sizes: list[int], k: int) -> list[tuple[int, ...]]:
    """k of the combos, picked greedily so that no value of any axis is used more than
    ceil(k / axis size) times (topped up in order if the greedy pass falls short)."""
    caps = [-(-k // size) for size in sizes]
    counts = [[0] * size for size in sizes]
    chosen = []
    for combo in combos:
        if len(chosen) == k:
            break
        if all(counts[j][v] < caps[j] for j, v in enumerate(combo)):
            chosen.append(combo)
            for j, v in enumerate(combo):
                counts[j][v] += 1
    chosen += [c for c in combos if c not in chosen][:k - len(chosen)]
    return chosen


def _count(text: str) -> int:
    match = re.search(r"\d+", text or "")
    return max(0, int(match.group())) if match else 0


def _parse_sections(text: str, axes) -> dict[str, list[str]]:
    """{axis: [items]} from 'axis:' header lines followed by '- item' lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^\s*([A-Za-z][\w \-]*):\s*$", line)
        item = re.match(r"^\s*[-*]\s+(.+?)\s*$", line)
        if header and header.group(1).strip().lower() in axes:
            current = header.group(1).strip().lower()
            sections[current] = []
        elif item and current:
            sections[current].append(item.group(1))
    return sections
