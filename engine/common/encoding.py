"""JSON for what the engine stores and prints: numpy arrays and numbers, records with `to_json`
and dataclasses become JSON values (anything else its `str`)."""
from __future__ import annotations

import json
import re

import numpy as np

MAX_JSON_DEPTH = 64                        # GapLens' own JSON nests a dozen levels at most
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_CHUNK = 2**20


def json_default(obj):
    """`json.dumps(..., default=json_default)`: a JSON value for what json cannot encode."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return str(obj)


def json_depth(text: str) -> int:
    """Returns how deeply `text` (JSON) nests arrays and objects, counted without parsing it (brackets
    outside strings), in linear time and bounded memory."""
    codes = np.frombuffer(_STRING.sub("", text).encode("utf-8", "replace"), np.uint8)
    depth = deepest = 0
    for start in range(0, len(codes), _CHUNK):
        part = codes[start:start + _CHUNK]
        steps = (np.isin(part, (91, 123)).astype(np.int32) - np.isin(part, (93, 125)))   # [{ minus ]}
        running = np.cumsum(steps) + depth
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def parse_json(text: str | bytes, what: str, max_depth: int = MAX_JSON_DEPTH):
    """The value of the JSON `text` from outside (an upload, an import); ValueError naming `what`
    (one sentence) when it is not JSON or nests deeper than `max_depth` levels, which is checked
    first (Python's parser would recurse until it fails)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8 text") from None
    if json_depth(text) > max_depth:
        raise ValueError(f"{what} nests more than {max_depth} levels deep; GapLens reads at most {max_depth}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{what} is not valid JSON ({str(exc)[:120]})") from None
