"""The typed events a method yields (DESIGN.md, "How data flows").

A method is a plain generator: it yields each piece as soon as it exists, so a tab can
stream it into widgets and the CLI can print it. Events carry data, never widgets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    pass


@dataclass
class Progress(Event):
    """`done` of `total` units of `stage` finished; `eta_s` is the estimated seconds left."""

    done: int
    total: int
    stage: str = ""
    message: str = ""
    eta_s: float | None = None


@dataclass
class Images(Event):
    """A batch of finished images (ImageRecord list) belonging to the set `label`."""

    records: list
    label: str = ""
    done: int = 0
    total: int = 0


@dataclass
class Scores(Event):
    """Named numbers, e.g. the metrics of one axis; values may hold Estimate-like dicts."""

    name: str
    values: dict[str, Any]


@dataclass
class Table(Event):
    name: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Graph(Event):
    """A graph: nodes and weighted directed edges (data only; engine.report draws it)."""

    name: str
    nodes: list[dict]
    edges: list[dict]


@dataclass
class Warning(Event):  # noqa: A001 - the name DESIGN.md gives this event
    message: str


@dataclass
class Done(Event):
    """The run finished; `results` is what was stored in its run record."""

    run_id: str
    results: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
