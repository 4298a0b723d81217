"""Getting JSON out of a language model: extraction, repair, validation, bounded retries.

LLMs wrap JSON in prose and code fences, leave trailing commas, write Python literals and
single quotes, wrap the expected list in a dict ({"prompts": [...]}) or return a numbered list
instead. TIBET's released code special-cases many such shapes by hand (clean_pdict.py); here
`extract_json` repairs the syntax and the validators (`as_string_list`, `as_axis_dict`)
normalise the shape. `ask_json` ties them together and re-asks, quoting the problem, when a
reply cannot be used.
"""
from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Sequence

from ..common.errors import LLMOutputError

JSON_RETRIES = 2                  # re-asks of a reply that is no usable JSON (ask_json's default)
JSON_ATTEMPTS = JSON_RETRIES + 1  # the most calls one JSON question makes: what a request's worst case counts

RETRY_MESSAGE = ("Your previous reply could not be used: {reason}. "
                 "Reply again with only the JSON, without any other text.")

# Keys under which models wrap the list or dict that was asked for (compared after normalise_key).
WRAPPER_KEYS = frozenset({
    "axes", "bias_axes", "biases", "bias", "potential_biases", "prompt_biases", "prompts_with_biases",
    "counterfactuals", "counterfactual_prompts", "counterfactual", "prompts", "prompt_variations",
    "variations", "descriptions", "mutations", "new_prompts", "items", "list", "results", "result",
    "data", "output", "response", "answer",
})

# Keys whose string value is the text of a list item given as an object ({"prompt": "..."}).
_TEXT_KEYS = ("prompt", "counterfactual", "text", "description", "variation", "value", "name", "content")

_FENCE = re.compile(r"```[ \t]*(?:json|javascript|js|python|py)?[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_BULLET = re.compile(r"^\s*(?:[-*•+]|\d{1,3}[.)]|\(\d{1,3}\)|[a-zA-Z][.)])\s+(.+?)\s*$")
_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?(?:\d{1,3}[.)]\s*)?\**\s*([^:*#][^:]*?)\s*\**\s*:\s*\**\s*$")
_OPENER = re.compile(r"[\[{]")
_MD_HEADING = re.compile(r"^\s*#{1,6}\s*(?:\d{1,3}[.)]\s*)?(.+?)\s*#*\s*$")


# --- extraction --------------------------------------------------------------------------------

def extract_json(text: str) -> Any:
    """Returns the JSON value found in an LLM reply, repairing common defects.

    Tries, in order: each fenced code block, then the whole reply; within each, the whole text
    and then every bracketed segment, parsed as JSON, as repaired JSON (trailing commas, single
    quotes, Python True/False/None, comments, missing commas between items, smart quotes), as
    a Python literal, and with a truncated tail closed. When the reply holds no JSON at all, a
    bulleted or numbered list becomes a list of strings, and headings followed by bullets
    ("Gender:" / "- a male doctor") a dict of lists.

    Raises ValueError (with the reason) when nothing usable is found."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the reply is empty")
    text = _THINK.sub("", text).strip()
    text = text.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    candidates = [m.group(1) for m in _FENCE.finditer(text) if m.group(1).strip()] + [text]
    for candidate in candidates:
        value = _parse_candidate(candidate)
        if value is not _NOTHING:
            return value
    value = _parse_prose_list(text)
    if value is not None:
        return value
    raise ValueError("no JSON found in the reply")


_NOTHING = object()


def _parse_candidate(text: str) -> Any:
    """Returns the JSON list or dict in `text`: the whole text if it parses, else the longest
    parseable bracketed segment (so "[1]" in a preamble does not win over the real list); or _NOTHING."""
    value = _parse_value(text.strip())
    if isinstance(value, (dict, list)):
        return value
    best: tuple[int, Any] | None = None
    pos = 0
    for _ in range(8):
        match = _OPENER.search(text, pos)
        if not match:
            break
        segment = _balanced_segment(text, match.start())
        value = _parse_value(segment)
        if value is _NOTHING:
            pos = match.start() + 1
            continue
        if best is None or len(segment) > best[0]:
            best = (len(segment), value)
        pos = match.start() + len(segment)
    return _NOTHING if best is None else best[1]


def _parse_value(text: str) -> Any:
    if not text:
        return _NOTHING
    for attempt in (text, _repair(text)):
        try:
            return json.loads(attempt)
        except ValueError:
            pass
    for attempt in (text, _pythonise(text)):
        try:
            value = ast.literal_eval(attempt)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (dict, list, tuple)):
            return list(value) if isinstance(value, tuple) else value
    return _NOTHING


def _balanced_segment(text: str, start: int) -> str:
    """Returns text[start:end] up to the bracket closing text[start]. A segment cut off before
    its end (max_tokens) is closed after its last complete item."""
    closers = {"[": "]", "{": "}"}
    stack: list[str] = []
    last_comma: tuple[int, list[str]] | None = None
    quote = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in closers:
            stack.append(closers[ch])
        elif ch in "]}":
            if stack and stack[-1] == ch:
                stack.pop()
                if not stack:
                    return text[start:i + 1]
        elif ch == ",":
            last_comma = (i, list(stack))
        i += 1
    if last_comma is None:
        return text[start:] + "".join(reversed(stack))
    cut, open_at_cut = last_comma
    return text[start:cut] + "".join(reversed(open_at_cut))


def _repair(text: str) -> str:
    """Returns `text` with JSON-ish defects fixed: single-quoted strings, Python literals,
    comments, trailing commas, raw newlines in strings, and missing commas between items."""
    out: list[str] = []
    last = ""  # last significant character emitted outside strings
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            j, buf = i + 1, []
            while j < n and text[j] != ch:
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j:j + 2])
                    j += 2
                    continue
                buf.append("\\n" if text[j] == "\n" else text[j])
                j += 1
            content = "".join(buf)
            if ch == "'":
                content = content.replace("\\'", "'").replace('"', '\\"')
            if last in ('"', "}", "]"):
                out.append(",")
            out.append(f'"{content}"')
            last = '"'
            i = j + 1
        elif text.startswith("//", i) or ch == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch == ",":
            rest = text[i + 1:].lstrip()
            if rest[:1] not in ("]", "}", "") and last not in (",", "[", "{"):
                out.append(",")
                last = ","
            i += 1
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append({"True": "true", "False": "false", "None": "null"}.get(word, word))
            last = "v"
            i = j
        elif ch in "[{":
            if last in ('"', "}", "]"):
                out.append(",")
            out.append(ch)
            last = ch
            i += 1
        else:
            out.append(ch)
            if not ch.isspace():
                last = ch
            i += 1
    return "".join(out)


def _pythonise(text: str) -> str:
    return re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", text)))


def _clean_item(text: str) -> str:
    """Returns a list item without markdown emphasis, surrounding quotes or a trailing comma."""
    text = text.replace("**", "").strip().strip("*_`").strip()
    text = re.sub(r"^\d{1,3}[.)]\s+", "", text).rstrip(",;").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def _parse_prose_list(text: str) -> list | dict | None:
    """Returns a list of bullet items, or a dict {heading: [items]} when headings group them; None if neither."""
    groups: dict[str, list[str]] = {}
    loose: list[str] = []
    heading = None
    for line in text.splitlines():
        if not line.strip():
            continue
        bullet = _BULLET.match(line)
        if bullet and bullet.group(1).replace("*", "").rstrip().endswith(":"):
            heading = _clean_item(bullet.group(1)).rstrip(":").strip()
            groups.setdefault(heading, [])
        elif bullet:
            item = _clean_item(bullet.group(1))
            if item:
                (groups[heading] if heading is not None else loose).append(item)
        elif heading_match := (_HEADING.match(line) or _MD_HEADING.match(line)):
            heading = _clean_item(heading_match.group(1)).rstrip(":").strip()
            groups.setdefault(heading, [])
    groups = {k: v for k, v in groups.items() if v}
    if groups:
        return groups
    return loose or None


# --- shape normalisation -------------------------------------------------------------------------

def normalise_key(key: Any) -> str:
    """Returns a key lower-cased, runs of spaces/punctuation as "_" ("Gender Bias" -> "gender_bias")."""
    return re.sub(r"[^0-9a-z]+", "_", str(key).lower()).strip("_")


def _item_text(item: Any) -> str | None:
    """Returns the text of a list item: a string, or the text field of an object; None for anything else."""
    if isinstance(item, str):
        return _clean_item(item) or None
    if isinstance(item, dict):
        for key in _TEXT_KEYS:
            if isinstance(item.get(key), str):
                return _clean_item(item[key]) or None
        strings = [v for v in item.values() if isinstance(v, str)]
        if len(strings) == 1:
            return _clean_item(strings[0]) or None
    return None


def _strings(value: Any, unique: bool = True) -> list[str]:
    """Returns the texts in a value (a list, a dict of texts, or one string), de-duplicated
    unless `unique` is False; drops non-strings."""
    if isinstance(value, dict):
        items = [v for v in value.values() if not isinstance(v, (list, dict))]
        items += [x for v in value.values() if isinstance(v, list) for x in v]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    seen, out = set(), []
    for item in items:
        text = _item_text(item)
        if text and (not unique or text.lower() not in seen):
            seen.add(text.lower())
            out.append(text)
    return out


def _unwrap(obj: Any, want: type) -> Any:
    """Returns the value under a wrapper key ({"prompts": [...]}, {"prompt": "...", "axes": {...}})
    or under the only key of a one-key dict, repeatedly, while that gets closer to `want`."""
    for _ in range(4):
        if not isinstance(obj, dict) or not obj:
            return obj
        if want is dict and len(obj) > 2 and not any(normalise_key(k) in WRAPPER_KEYS for k in obj):
            return obj
        inner = None
        for key, value in obj.items():
            if normalise_key(key) in WRAPPER_KEYS and isinstance(value, (dict, list)):
                inner = value
                break
        if inner is None and len(obj) == 1:
            (value,) = obj.values()
            if want is list and isinstance(value, list):
                inner = value
            elif want is dict and isinstance(value, dict) and any(isinstance(v, (list, dict)) for v in value.values()):
                inner = value  # {"<the prompt>": {"gender": [...], ...}}
        if inner is None:
            return obj
        if want is dict and isinstance(inner, list) and not _is_axis_list(inner):
            return obj  # {"axes": ["gender", "age"], "gender": [...]}: the list names the axes
        obj = inner
    return obj


def _is_axis_list(items: list) -> bool:
    return bool(items) and all(isinstance(x, dict) for x in items)


def _axis_list_to_dict(items: list) -> dict:
    """[{"axis": "gender", "counterfactuals": [...]}, ...] or [{"gender": [...]}, ...] -> {axis: [...]}."""
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict):
            continue
        name = next((item[k] for k in ("axis", "name", "bias", "bias_axis", "category")
                     if isinstance(item.get(k), str)), None)
        if name is not None:
            values = [v for k, v in item.items() if isinstance(v, (list, dict))]
            out[name] = values[0] if values else []
        else:
            out.update({k: v for k, v in item.items() if isinstance(v, (list, dict))})
    return out


# --- validators -----------------------------------------------------------------------------------

def as_string_list(n_min: int = 1, n_max: int | None = None,
                   max_words: int | None = None, unique: bool = True) -> Callable[[Any], list[str]]:
    """Returns a validator that turns a parsed reply into a list of n_min..n_max distinct strings
    (with `unique=False` repeated strings are kept: MineTheGap's variations weight the readings).

    It unwraps {"prompts": [...]}-style dicts, takes the text of {"prompt": "..."} items,
    flattens a dict of lists, drops non-strings, empty and duplicate items and items longer
    than `max_words` words, and keeps the first n_max. Raises ValueError if fewer than n_min remain."""
    def validate(obj: Any) -> list[str]:
        obj = _unwrap(obj, list)
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, list):  # a dict of lists, or a list of lists: flatten one level
            obj = [x for v in obj for x in (v if isinstance(v, list) else [v])]
        items = _strings(obj, unique)
        too_long = [s for s in items if max_words and len(s.split()) > max_words]
        items = [s for s in items if s not in too_long]
        if len(items) < n_min:
            detail = f" ({len(too_long)} more were longer than {max_words} words)" if too_long else ""
            raise ValueError(f"expected a JSON list of at least {n_min} strings, found {len(items)} usable{detail}")
        return items[:n_max] if n_max else items
    return validate


def as_axis_dict(min_axes: int = 3, min_cfs: int = 2) -> Callable[[Any], dict[str, list[str]]]:
    """Returns a validator that turns a parsed reply into {axis: [counterfactual prompts]}.

    Keys are normalised (lower-case, spaces -> "_"; duplicates merged); wrapper keys such as
    "axes" or "biases" are unwrapped; a list of {"axis": ..., "counterfactuals": [...]} objects
    becomes a dict; counterfactuals given as objects or as a dict of labelled prompts become
    strings; non-strings are dropped. Axes with fewer than `min_cfs` counterfactuals are
    dropped. Raises ValueError if fewer than `min_axes` axes remain."""
    def validate(obj: Any) -> dict[str, list[str]]:
        obj = _unwrap(obj, dict)
        if isinstance(obj, list) and _is_axis_list(obj):
            obj = _axis_list_to_dict(obj)
        if not isinstance(obj, dict):
            kind = f"a list of {len(obj)} items" if isinstance(obj, list) else type(obj).__name__
            raise ValueError(f"expected a JSON object mapping each bias axis to a list of counterfactual prompts, "
                             f"got {kind}")
        axes: dict[str, list[str]] = {}
        for key, value in obj.items():
            axis = normalise_key(key)
            if not axis or axis in WRAPPER_KEYS:
                continue  # e.g. the "axes": ["gender", "age"] index next to the axes themselves
            merged = axes.setdefault(axis, [])
            merged += [s for s in _strings(value) if s.lower() not in {m.lower() for m in merged}]
        kept = {axis: cfs for axis, cfs in axes.items() if len(cfs) >= min_cfs}
        if len(kept) < min_axes:
            short = [f"{axis} ({len(cfs)})" for axis, cfs in axes.items() if len(cfs) < min_cfs]
            detail = f"; too few counterfactuals in: {', '.join(short)}" if short else ""
            raise ValueError(f"expected at least {min_axes} bias axes with at least {min_cfs} counterfactual "
                             f"prompts each, found {len(kept)}{detail}")
        return kept
    return validate


# --- asking ---------------------------------------------------------------------------------------

def ask_json(llm, messages: Sequence[dict], *, validate: Callable[[Any], Any], retries: int = JSON_RETRIES,
             temperature: float = 1.0, seed: int = 0, max_tokens: int = 1024) -> Any:
    """Asks `llm` (a TextGenerator) and returns `validate(extract_json(reply))`.

    When extraction or validation fails, asks again (at most `retries` more times) with the
    bad reply and a follow-up quoting the reason appended to `messages`; attempt k uses seed
    `seed + k`, so the whole exchange is reproducible. `validate` returns the cleaned object or
    raises ValueError with a reason.

    Raises LLMOutputError with the last reason and the start of the last reply."""
    conversation = list(messages)
    reason, reply = "", ""
    for attempt in range(retries + 1):
        reply = llm.chat(conversation, temperature=temperature, max_tokens=max_tokens, seed=seed + attempt)
        try:
            return validate(extract_json(reply))
        except ValueError as exc:
            reason = str(exc) or type(exc).__name__
        conversation = list(messages) + [{"role": "assistant", "content": reply},
                                         {"role": "user", "content": RETRY_MESSAGE.format(reason=reason)}]
    snippet = " ".join(str(reply).split())[:200]
    raise LLMOutputError(f"{getattr(llm, 'id', 'the language model')} gave no usable JSON in {retries + 1} "
                         f"attempt(s): {reason}. Last reply began: \"{snippet}\"")
