"""The typed events a method yields (DESIGN.md, "How data flows").

A method is a plain generator: it yields each piece as soon as it exists, so a tab can
stream it into widgets and the CLI can print it. Events carry data, never widgets, in fields (never
in strings a reader parses back); they are frozen and pickle, so they cross ZeroGPU's process
boundary. A method adds its own events (subclasses of Event) beside its run, e.g. mine.PromptScored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    pass


@dataclass(frozen=True)
class Progress(Event):
    """`done` of `total` units of `stage` finished; `eta_s` is the estimated seconds left."""

    done: int
    total: int
    stage: str = ""
    message: str = ""
    eta_s: float | None = None


@dataclass(frozen=True)
class Images(Event):
    """A batch of finished images (ImageRecord list) belonging to the set `label`."""

    records: list
    label: str = ""
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class AxisScores(Event):
    """The metrics of one attribute axis (of `prompt`, in a run of several prompts); values may
    hold Estimate-like dicts."""

    axis: str
    metrics: dict[str, Any]
    prompt: str | None = None


@dataclass(frozen=True)
class Headline(Event):
    """The run's headline claim and how sure it is (engine.metrics.intervals.headline_claim)."""

    claim: dict[str, Any]


@dataclass(frozen=True)
class Table(Event):
    name: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True)
class Graph(Event):
    """A graph: nodes and weighted directed edges (data only; engine.report draws it)."""

    name: str
    nodes: list[dict]
    edges: list[dict]


@dataclass(frozen=True)
class Warning(Event):  # noqa: A001 - the name DESIGN.md gives this event
    message: str


@dataclass(frozen=True)
class Done(Event):
    """The run finished; `results` is what was stored in its run record."""

    run_id: str
    results: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
