"""Text from outside, checked once where it enters (STYLE.md §11): what a visitor types or sends
through the API, a command-line argument, a field of an imported archive. One function decides
whether a text may enter (`text_problem`): at most a given length, no NUL character, and no
unpaired surrogate, which is no Unicode character at all (a JSON escape such as "\\ud800" makes
one; so does a byte that is not UTF-8 on a command line, which Python's argv decodes as
U+DC80–U+DCFF): such a string cannot be encoded as UTF-8, so no key, database row, page or
export could hold it. `check_texts` applies it to every string of a nested value (a request,
a form's values) and bounds the value's nesting and list lengths.

Every text from outside is checked so before it is stored, so what GapLens stores re-imports; a
store written before these checks may still hold unpaired surrogates or NULs in its JSON, which
`readable` replaces wherever the store reads values back (engine/store/runs.py).
"""
from __future__ import annotations

import re

from .errors import InputError

MAX_TEXT_CHARS = 1000     # a prompt, a name, a search, a line of a list: what a person types
MAX_ITEMS = 500           # entries of one list or table
MAX_DEPTH = 16            # nesting of a request (a comparison's request holds an audit's axes table)

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED = re.compile(r"\\u(?:[dD][89a-fA-F]|0000)")   # how JSON text escapes a surrogate or a NUL


def text_problem(text: str, limit: int | None = MAX_TEXT_CHARS) -> str | None:
    """What keeps `text` out, as the rest of a sentence about it ("is 1001 characters long; the
    maximum is 1000"), or None when it may enter. `limit`: the most characters (None: any)."""
    if limit is not None and len(text) > limit:
        return f"is {len(text)} characters long; the maximum is {limit}"
    if "\x00" in text:
        return f"holds a NUL character (at character {text.index(chr(0)) + 1}), which no text may hold"
    found = _SURROGATE.search(text)
    if found:
        return (f"holds an unpaired surrogate (U+{ord(found.group()):04X}, at character {found.start() + 1}), which is "
                f"not text: use UTF-8 (on a command line, a byte that is not UTF-8 arrives as one)")
    return None


def check_text(text, what: str, limit: int | None = MAX_TEXT_CHARS):
    """`text` unchanged when it may enter (None passes too); else InputError, one sentence naming
    `what` ("the prompt", "--search")."""
    if isinstance(text, str):
        problem = text_problem(text, limit)
        if problem:
            raise InputError(f"{what} {problem}")
    return text


def check_texts(value, what: str, limit: int | None = MAX_TEXT_CHARS, *, items: int = MAX_ITEMS,
                depth: int = MAX_DEPTH):
    """`value` unchanged when every string in it (dict keys too) may enter, no list or dict holds
    more than `items` entries and it nests at most `depth` levels; else InputError naming where,
    from `what` ("prompt", "axes.gender")."""
    _walk(value, what, limit, items, depth, depth)
    return value


def _walk(value, where: str, limit, items: int, depth: int, left: int) -> None:
    if isinstance(value, str):
        check_text(value, where, limit)
        return
    if not isinstance(value, (dict, list, tuple)):
        return
    if left <= 0:
        raise InputError(f"{where} nests more than {depth} levels deep; GapLens reads at most {depth}")
    if len(value) > items:
        raise InputError(f"{where} has {len(value)} {'entries' if isinstance(value, dict) else 'items'}; at most "
                         f"{items} are accepted")
    if isinstance(value, dict):
        for key, entry in value.items():
            check_text(str(key), f"a key of {where}", limit)
            _walk(entry, f"{where}.{key}", limit, items, depth, left - 1)
    else:
        for entry in value:
            _walk(entry, where, limit, items, depth, left - 1)


def readable(value):
    """`value` (JSON-like) with every unpaired surrogate replaced by U+FFFD and every NUL left out,
    so it can be stored, printed, served, exported and imported again: for what a store written
    before the checks above may hold, and for what the app computes from outside text it did not
    check (a model's reply) before it is stored."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value).replace("\x00", "")
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [readable(v) for v in value]
    return value


def needs_readable(json_text: str) -> bool:
    """Whether JSON text (as `json.dumps` writes it by default) escapes a surrogate or a NUL, the
    only way it can hold either: a quick test before `readable` walks the decoded value."""
    return bool(_ESCAPED.search(json_text))
