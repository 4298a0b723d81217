"""Attribute axes with fixed answer choices (assets/axes.json) and free-text axes."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from ..common.errors import InputError
from ..models.presets import ASSETS


@dataclass(frozen=True)
class Axis:
    """One attribute axis: the VQA question asked of every image and its answer classes.
    `values` is empty for a free-text axis, whose classes are the answers observed."""

    name: str
    question: str
    values: tuple[str, ...] = ()
    pd_groups: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    reference: dict = field(default_factory=dict, compare=False)  # value -> target share; {} = uniform


@lru_cache(maxsize=1)
def known_axes() -> dict[str, Axis]:
    table = json.loads((ASSETS / "axes.json").read_text())
    return {name: Axis(name, spec["question"], tuple(spec["values"]),
                       tuple(tuple(g) for g in spec["pd_groups"]) if spec.get("pd_groups") else None)
            for name, spec in table.items() if not name.startswith("_")}


def axis_for(name: str, values: list[str] | None = None) -> Axis:
    """The known axis of that name, or a free-text axis asked with TIBET's template
    'What is {axis} in the image?' (docs/spec/thesis-tibet-biasconnect-intermit.md §2.4). Given `values`, they
    become its choices."""
    key = name.strip().lower()
    known = known_axes().get(key)
    if known and not values:
        return known
    topic = re.sub(r"[\s_]*bias(es)?$", "", key).replace("_", " ")
    question = known.question if known else f"What is {topic} in the image?"
    return Axis(key, question, tuple(v.strip().lower() for v in (values or []) if v.strip()))


def normalise_free_answer(answer: str) -> str:
    """A free-text answer as a class label: lower-case, no articles or trailing punctuation."""
    text = re.sub(r"[^\w\s-]", "", (answer or "").lower()).strip()
    text = re.sub(r"^(a|an|the)\s+", "", text)
    return text or "other"


def parse_shares(body: str, separator: str = "=") -> dict[str, float]:
    """'male=50, female=50' (or with separator ':') -> {'male': 50.0, 'female': 50.0}; a trailing
    '%' is allowed. Not normalised."""
    shares = {}
    for item in filter(None, (i.strip() for i in body.split(","))):
        value, sep, share = item.rpartition(separator)
        try:
            if not sep or not value.strip():
                raise ValueError
            shares[value.strip().lower()] = float(share.strip().rstrip("%"))
        except ValueError:
            raise InputError(f"target share '{item}' is not 'value{separator}number'") from None
    return shares


def parse_targets(text: str) -> dict[str, dict[str, float]]:
    """'gender: male=50, female=50; age: young=30, middle-aged=40, old=30' -> target shares per
    axis (percentages or fractions), each normalised to sum 1. Empty text -> {} (uniform)."""
    targets = {}
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        axis, sep, body = part.partition(":")
        if not sep:
            raise InputError(f"target '{part}' must look like 'axis: value=share, value=share'")
        shares = parse_shares(body)
        total = sum(shares.values())
        if total <= 0:
            raise InputError(f"the target shares of '{axis.strip()}' add up to {total}")
        targets[axis.strip().lower()] = {k: v / total for k, v in shares.items()}
    return targets
