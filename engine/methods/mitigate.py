"""Mitigate (InterMit, thesis Ch. 7; docs/spec/thesis-tibet-biasconnect-intermit.md §4): lower
the priority-weighted bias τ of a prompt below ε by prompt modification, one bias axis at a
time, picking each axis from the Intersectional Sensitivity matrix S so that intersections
are taken into account.

The loop (Alg. 4 with the spec §4.3 clarifications; each numbered one is marked `§4.3-k`):

    p        = the priorities over B* scaled to ‖p‖₁ = 1
    τ        = ⟨w̄_{B*}, p⟩ measured on the CURRENT image set (§4.3-1), w̄ = biasconnect.w_bar
               against each axis' ideal distribution D*
    if τ < ε before any step: nothing to do (§4.3-6)
    repeat:  S  = the sensitivity matrix measured on top of the current prompt set: for every
                  axis x not mitigated yet (rows; axes outside B* included, §4.3-5) and every
                  axis y (columns), IS_xy = w̄_now(y) − w̄(y over x's counterfactual sets mixed
                  in proportion to D*_x); the diagonal IS_xx is kept, so an axis can be chosen
                  to fix itself (§4.3-4)
             γ_x = ⟨S[x, B*], p⟩ (biasconnect.priority_alignment); x* = argmax over the axes
                  not used yet (§4.3-2; ties: table order)
             stop "no axis helps" when no γ_x > 0, "all axes used" when none is left
                  (§4.3-3; at most |B| steps, spec §8 item 12)
             mitigate x*: the prompt set becomes its product with x*'s counterfactuals,
                  regenerate, recompute τ and every w̄; stop "threshold reached" when τ < ε,
                  else loop: S is re-measured on the new prompt set (Sec 7.6)
    With |B*| = 1 only that axis is a candidate (the thesis skips BiasConnect then).

Prompt modification (spec §4.4): the prompt set is the Cartesian product of the
counterfactual values of the mitigated axes. A product prompt is the base prompt with the
one-concept edit of each chosen counterfactual applied (`compose`; one counterfactual alone
is used verbatim, so the first sets are the Intersectional tab's and come from the store).

Non-uniform targets (spec §8 item 11): a product prompt's weight is the product over its
axes of D*_x(value) / (the number of x's counterfactuals naming that value). The N images of
a set are apportioned to the prompts by `allocate`: deterministic sequential apportionment
(each image goes to the prompt furthest behind its quota, counting both its joint quota
k·w and the quota of each of its values), so every value's count stays within about one
image of N·D* (age 30/40/30 with N = 20 gives exactly 6/8/6). Prompt q with n_q images uses the
seeds seed .. seed+n_q−1 (the same seeds policy as every other set), so sets repeat exactly
and come from the store. The sensitivity rows mix x's counterfactual sets with the same D*_x
weights, so S predicts what mitigating x to D*_x would do (uniform D* = BiasConnect's equal
mix).

Uncertainty: every distribution, w̄ and τ has a 95% bootstrap interval, images resampled
within each prompt of a set (the allocation is fixed by design). A trade-off alert is raised
when a step makes any axis' w̄ worse by more than `tradeoff_tolerance`, with the interval of
the change ("significant" when it excludes 0).

Preview (`preview`): from one sensitivity matrix only, no generation: the greedy order and
predicted τ, composing effects additively (w̄ after mitigating x = w̄_mixed[x] for the first
step, exact under S; later steps w̄(y) − IS_xy, clipped to [0, 1], a mitigated axis staying
where its own row put it). The run's first choice is the preview's first step on the same S.

Quality after mitigation (spec §4.5): IsP?, the share of images for which the VQA answers
"yes" to "Is there a person in the image?"; and a CLIP-IQA-style score per attribute, the
softmax (logit scale 100, CLIP's) of an image's cosine similarity to an antonym prompt pair,
e.g. "Good photo." vs "Bad photo." (CLIP-IQA's own pairs for quality, natural and
colorfulness; for "real", which the thesis names without its prompts, "Real photo." vs
"Abstract photo." is our choice), with the preset's embedder (reconstructed: CLIP-IQA proper
uses a ResNet-50 CLIP without positional embedding). A warning when a score drops by more
than `quality_tolerance` from the initial images. On the synthetic preset the pair prompts
carry no attribute, so the score is 0.5 everywhere: a calibration check, not a measurement.

Baseline `strategy="all"`: mitigate every axis of B* in order of priority without looking
at S or stopping at ε (what ITI-GEN does; MitSteps = 100%), to compare with.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence, TypedDict

import numpy as np

from ..common.errors import InputError
from ..common.events import Event, Images, Progress, Warning
from ..common.scores import finite_or_none, number
from ..core.distributed import distributed_evaluation, distributed_image_sets
from ..core.engine import Engine, Run, recorded, stream_image_set
from ..hosting.limits import Estimate
from ..metrics import biasconnect as bc
from ..metrics._weights import normalised_weights
from ..metrics.bootstrap import percentile_interval, resample_indices
from ..metrics.intervals import share_interval
from ..models import sources as image_sources
from . import cfsets
from .axes import parse_shares
from .cfsets import (SetSpec, SetsRequest, axis_name, choices, counterfactual_value, prepare,
                     settle_questions_and_ideals)
from .measure import AskedAnswers, cant_tell_counts, one_hot, outside_count, resample_weights, tally
from .options import settle_settings
from .prompt_set import allocate, compose

DEFAULT_EPSILON = 0.35
STRATEGIES = ("intermit", "all")
PERSON_QUESTION = "Is there a person in the image?"
# Antonym prompt pairs for the attributes Table 7.1 reports: CLIP-IQA's (Wang et al. 2023) for
# quality, natural and colorfulness; the "real" pair is ours (the thesis names no prompts).
QUALITY_PAIRS = {"quality": ("Good photo.", "Bad photo."), "real": ("Real photo.", "Abstract photo."),
                 "natural": ("Natural photo.", "Synthetic photo."), "colorfulness": ("Colorful photo.", "Dull photo.")}
STOP_MESSAGES = {
    "below_threshold": "τ is already below ε on the initial images: nothing to mitigate",
    "threshold_reached": "τ fell below ε: mitigation succeeded",
    "no_gain": "no remaining axis has γ > 0 (mitigating any of them would not lower τ): ε not reached",
    "all_used": "every candidate axis has been mitigated: ε not reached",
    "baseline_done": "every axis of B* mitigated (baseline: all axes, no sensitivity matrix, no early stop)",
    "preview": "preview only: the sensitivity matrix was measured, nothing was mitigated",
}
# The preview predicts from the sensitivity matrix: its outcome is a forecast, never a success.
PREVIEW_MESSAGES = {
    "below_threshold": "τ is already below ε on the initial images: nothing to mitigate",
    "threshold_reached": "τ would fall below ε (not run yet)",
    "no_gain": "it would stop with τ above ε: no remaining axis would lower τ",
    "all_used": "it would stop with τ above ε after mitigating every candidate axis",
}


def outcome(results: dict) -> str:
    """Returns the one-sentence outcome of a finished run for the status line; a preview says
    it is a prediction, so it cannot contradict the preview panel."""
    stop = results.get("stop") or {}
    states = results.get("states") or [{}]
    if stop.get("reason") == "preview":
        forecast = (results.get("preview") or {}).get("message", "")
        return f"Preview done (nothing mitigated yet); predicted: {forecast}"
    tau = f"τ {states[0].get('tau', float('nan')):.3f} → {states[-1].get('tau', float('nan')):.3f}"
    verdict = "ε reached" if stop.get("reached") else "ε not reached"
    return f"Done, {verdict}: {stop.get('message', '')}; {len(results.get('steps') or [])} step(s), {tau}"




@dataclass(frozen=True)
class PromptSetImages(Images):
    """Images of the prompt set of step `step` (0: the base prompt's), not of a counterfactual set
    that measures the sensitivity."""

    step: int = 0


@dataclass(frozen=True)
class Measured(Event):
    """The run's results so far (MitigateResults), after every measurement of a prompt set."""

    results: dict


@dataclass(frozen=True)
class PreviewReady(Event):
    """The steps the first sensitivity matrix predicts (results["preview"])."""

    preview: dict


@dataclass(frozen=True)
class StepDone(Event):
    """One mitigation step done: its record (results["steps"][-1])."""

    record: dict


@dataclass
class MitigateRequest(SetsRequest):
    mitigate: list[str] = field(default_factory=list)   # B*; empty: the axes with a priority, else every axis
    priorities: dict = field(default_factory=dict)      # axis -> weight ≥ 0 (scaled to sum 1); empty: equal
    ideals: dict = field(default_factory=dict)          # axis -> {value: share}: D*; a missing axis is uniform
    select: list[str] = field(default_factory=list)     # keep only these axes of the table / the LLM's (B)
    epsilon: float = field(default=DEFAULT_EPSILON, metadata={"help": "stop when τ < ε"})
    strategy: str = field(default="intermit", metadata={
        "help": "intermit, or all: the baseline mitigating every axis of B*", "choices": STRATEGIES})
    preview_only: bool = field(default=False, metadata={
        "help": "measure the sensitivity matrix and print the predicted steps; mitigate nothing"})
    other_policy: str = field(default="drop", metadata={
        "help": "answers outside an axis' choices: drop them, or count them in an 'other' bin D* gives 0",
        "choices": bc.OTHER_POLICIES})
    questions: dict = field(default_factory=dict)       # axis -> VQA question (overrides the default)
    n_boot: int = field(default=200, metadata={"help": "bootstrap resamples for every interval; 0: none",
                                               "zero_off": True})
    quality: bool = field(default=True, metadata={
        "help": "skip the IsP? and CLIP-IQA-style checks", "flag": "--no-quality"})
    tradeoff_tolerance: float = field(default=0.02, metadata={
        "help": "alert when a step raises an axis' w̄ by more than this"})
    quality_tolerance: float = field(default=0.05, metadata={
        "help": "warn when a quality score drops by more than this"})
    export: str = field(default="", metadata={"metavar": "PATH", "help": "write the mitigated prompt set (JSON) here"})


@dataclass(frozen=True)
class Component:
    """One prompt of a prompt set: the counterfactual chosen for each mitigated axis."""

    prompt: str
    choice: tuple[tuple[str, str], ...]    # ((axis, counterfactual template), ...) in table order
    weight: float


@dataclass
class Setup:
    """What a run settles before generating: axes, values, questions, D*, B*, p."""

    base: str
    template: str
    axes: dict[str, list[str]]
    filled: dict[tuple[str, str], str]      # (axis, cf template) -> cf prompt
    values: dict[str, list[str]]
    cf_value: dict[tuple[str, str], str]
    questions: dict[str, str]
    ideals: dict[str, np.ndarray]
    targets: list[str]                      # B*
    priorities: dict[str, float]            # over B*, sum 1
    mix: dict[str, dict[str, float]]        # axis -> cf -> sampling weight (D*_x per counterfactual)
    policy: str
    composition_warnings: set = field(default_factory=set)

    def prompt_of(self, choice) -> str:
        order = list(self.axes)
        ordered = sorted(choice, key=lambda c: order.index(c[0]))
        prompt, clean = compose(self.base, [self.filled[c] for c in ordered])
        if not clean:
            self.composition_warnings.add(prompt)
        return prompt

    def product(self, current: list[Component], axis: str) -> list[Component]:
        """The prompt set after mitigating `axis`: every prompt × every counterfactual of it."""
        out = []
        for comp in current:
            for cf in self.axes[axis]:
                choice = comp.choice + ((axis, cf),)
                out.append(Component(self.prompt_of(choice), choice, comp.weight * self.mix[axis][cf]))
        return [c for c in out if c.weight > 0]

    def counts(self, comps: list[Component], n: int) -> list[int]:
        return allocate([c.weight for c in comps], n, [c.choice for c in comps])


def _mix_weights(cfs: list[str], cf_value: dict, axis: str, values: list[str], ideal: np.ndarray) -> dict[str, float]:
    """Sampling weight of each counterfactual: D*(its value) shared among the counterfactuals
    naming that value."""
    share = dict(zip(values, ideal[:len(values)].tolist()))
    named = defaultdict(int)
    for cf in cfs:
        named[cf_value[(axis, cf)]] += 1
    return {cf: share[cf_value[(axis, cf)]] / named[cf_value[(axis, cf)]] for cf in cfs}


def normalise_priorities(targets: list[str], priorities: dict) -> dict[str, float]:
    """p over B* with ‖p‖₁ = 1; equal when no priority is given, 0 for an axis left out."""
    if not priorities:
        return {a: 1.0 / len(targets) for a in targets}
    try:
        p = normalised_weights(targets, {a: float(priorities.get(a, 0.0)) for a in targets}, "the priority vector")
    except ValueError as exc:
        raise InputError(f"priorities: {exc}") from None
    return dict(zip(targets, p.tolist()))


# -- measuring ------------------------------------------------------------------------------------

def _est(value: float, draws: np.ndarray | None) -> dict:
    low, high = percentile_interval(draws) if draws is not None and len(draws) else (math.nan, math.nan)
    return {"value": finite_or_none(value), "low": finite_or_none(low), "high": finite_or_none(high)}


class Measurer:
    """Generates sets through the store, asks every axis' question, keeps the answers."""

    def __init__(self, engine: Engine, run_record: Run, setup: Setup, request: MitigateRequest, settings):
        self.engine, self.run_record, self.setup, self.request, self.settings = engine, run_record, setup, request, settings
        self.answers: dict[str, dict[str, np.ndarray]] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.records: dict[str, list] = {}
        self.outside = dict.fromkeys(setup.axes, 0)
        self.asked = AskedAnswers()   # per image, for the JSON

    def sets(self, specs: list[tuple[SetSpec, int]], stage: str, step: int | None = None):
        """Generate and answer every (spec, number of images) (use `yield from`); the images of the
        prompt set of step `step`, when given, as PromptSetImages."""
        total = sum(k for _, k in specs)
        done = 0
        # Under `accelerate launch` every rank generates its share of the missing images first.
        sets = [(spec.prompt, list(range(self.request.seed, self.request.seed + k)), self.settings) for spec, k in specs]
        yield from distributed_image_sets(self.engine, sets)
        yield from distributed_evaluation(self.engine, sets, asks=[(self.setup.questions[y], self.setup.values[y])
                                                                   for y in self.setup.axes])
        for spec, k in specs:
            seeds = list(range(self.request.seed, self.request.seed + k))
            records = yield from _of_step(step, stream_image_set(
                self.engine, self.run_record, spec.prompt, seeds, self.settings, label=spec.label,
                progress_offset=done, progress_total=total))
            done += k
            valid = [r for r in records if not r.nsfw]
            if len(valid) < len(records):
                yield Warning(f"{len(records) - len(valid)} image(s) of '{spec.prompt}' were flagged by the safety "
                              "checker and are excluded from every metric")
            self.records[spec.label] = valid
            yield Progress(done, total, stage, f"{stage}: asking the VQA about '{spec.prompt}'")
            self.answers[spec.label] = {}
            asked = self.asked.ask_all(self.engine, spec.label, valid, {y: (self.setup.questions[y], self.setup.values[y])
                                                                         for y in self.setup.axes})
            for y, labels in asked.items():
                self.answers[spec.label][y] = one_hot(labels, self.setup.values[y], self.setup.policy)
                self.outside[y] += outside_count(labels, self.setup.values[y])
            if self.request.n_boot:
                self.weights[spec.label] = resample_weights(len(valid), self.request.n_boot, self.request.seed,
                                                            len(self.weights))

    def state(self, step: int, comps: list[Component], mitigated: list[str]):
        """Generate the current prompt set and measure it (use `yield from`); returns the state
        dict (w̄, τ, distributions with intervals) and its specs."""
        counts = self.setup.counts(comps, self.request.n)
        specs = [(SetSpec(f"step={step}|prompt={c.prompt}", c.prompt, 0), k) for c, k in zip(comps, counts) if k]
        stage = "initial images" if step == 0 else f"step {step}: images of the mitigated prompt set"
        yield from self.sets(specs, stage, step)
        specs = [s for s, _ in specs]
        if not any(self.records[s.label] for s in specs):
            raise InputError("every image of the prompt set was flagged by the safety checker; nothing to measure")
        return self._describe(step, comps, counts, mitigated, specs), specs

    def _describe(self, step, comps, counts, mitigated, specs) -> dict:
        setup = self.setup
        init, _ = tally(specs, setup.axes, self.answers, None, {})
        boot = (tally(specs, setup.axes, self.answers, self.weights, {})[0]
                if self.request.n_boot else None)
        w_bar, w_ci, dists = {}, {}, {}
        draws_w = {}
        cant_tell = self.asked.cant_tell([s.label for s in specs])
        for y in setup.axes:
            counts_y = init[y][0]
            w_bar[y] = bc.w_bar(counts_y, setup.ideals[y]) if counts_y.sum() else math.nan
            draws = None
            if boot is not None:
                draws = np.array([bc.w_bar(row, setup.ideals[y]) if row.sum() else math.nan for row in boot[y]])
            draws_w[y] = draws
            w_ci[y] = _est(w_bar[y], draws)
            shares = counts_y / counts_y.sum() if counts_y.sum() else np.full(len(counts_y), math.nan)
            names = setup.values[y] + (["other"] if setup.policy == "other_bin" else [])
            # Jeffreys intervals for the shares (issue 16: they hold at small N; 8 of 8 is not [1, 1])
            intervals = [share_interval(counts_y[k], counts_y.sum()) if counts_y.sum() else (math.nan, math.nan)
                         for k in range(len(names))]
            dists[y] = {"values": names, "counts": [int(c) for c in counts_y], "shares": [finite_or_none(s) for s in shares],
                        "low": [finite_or_none(lo) for lo, _ in intervals], "high": [finite_or_none(hi) for _, hi in intervals],
                        "ideal": setup.ideals[y].tolist(),
                        **cant_tell.get(y, cant_tell_counts([]))}
        unmeasured = [a for a in setup.priorities if math.isnan(w_bar[a])]
        if unmeasured:
            raise InputError(f"no VQA answer about {', '.join(unmeasured)} fell within its choices on the images of "
                             f"step {step}: τ cannot be measured; leave it out of the axes to mitigate (B*), or check "
                             "its question and counterfactuals")
        tau = bc.weighted_bias(w_bar, setup.priorities)
        tau_draws = None
        if boot is not None:
            tau_draws = sum(setup.priorities[a] * draws_w[a] for a in setup.priorities)
        tau_est = _est(tau, tau_draws)
        return {"step": step, "mitigated": list(mitigated),
                "prompt_set": [{"prompt": c.prompt, "weight": c.weight, "n": k,
                                "values": {a: setup.cf_value[(a, cf)] for a, cf in c.choice}}
                               for c, k in zip(comps, counts)],
                "n_images": int(sum(len(self.records[s.label]) for s in specs)),
                "w_bar": {y: finite_or_none(v) for y, v in w_bar.items()},
                "w_bar_ci": {y: [e["low"], e["high"]] for y, e in w_ci.items()},
                "tau": finite_or_none(tau), "tau_ci": [tau_est["low"], tau_est["high"]],
                "distributions": dists, "_draws": {"w_bar": draws_w, "tau": tau_draws}}

    def matrix(self, step: int, comps: list[Component], candidates: list[str], current_specs: list[SetSpec]):
        """Generate the counterfactual sets of `candidates` on top of the prompt set and return
        the sensitivity matrix (rows: candidates; others nan) (use `yield from`)."""
        setup = self.setup
        counts = setup.counts(comps, self.request.n)
        specs = []
        for x in candidates:
            for cf in setup.axes[x]:
                for c, k in zip(comps, counts):
                    if k:
                        prompt = setup.prompt_of(c.choice + ((x, cf),))
                        specs.append((SetSpec(f"step={step}|axis={x}|cf={cf}|prompt={c.prompt}", prompt, 0, x, cf,
                                              setup.cf_value[(x, cf)]), k))
        yield Progress(0, 1, "sensitivity", f"step {step + 1}: measuring how each of {len(candidates)} axis(es) "
                                            "would move every axis")
        yield from self.sets(specs, f"step {step + 1}: counterfactual sets")
        all_specs = current_specs + [s for s, _ in specs]
        init, tables = tally(all_specs, setup.axes, self.answers, None, {x: setup.axes[x] for x in candidates})
        mixed = {x: {y: _weighted_mix(tables[x][y][0], [setup.mix[x][cf] for cf in setup.axes[x]]) for y in setup.axes}
                 for x in candidates}
        return bc.intersectional_sensitivity({y: init[y][0] for y in setup.axes}, mixed, setup.ideals)


def _weighted_mix(table: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """D_{B_x}(B_y) with x's counterfactual sets (table rows) mixed in proportion to `weights`
    (biasconnect.mixed_distribution when they are equal); rows without counts are left out."""
    rows = np.asarray(table, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = (rows.sum(axis=1) > 0) & (w > 0)
    if not keep.any():
        return np.full(rows.shape[1], np.nan)
    rows, w = rows[keep], w[keep] / w[keep].sum()
    return (rows / rows.sum(axis=1, keepdims=True) * w[:, None]).sum(axis=0)


# -- choosing and predicting ----------------------------------------------------------------------

def choose(gammas: dict[str, float], candidates: list[str]) -> str | None:
    """argmax γ over the candidates (ties: the earlier candidate); None when no γ > 0."""
    valid = [(gammas[x], -i, x) for i, x in enumerate(candidates)
             if gammas.get(x) is not None and not math.isnan(gammas[x])]
    if not valid:
        return None
    g, _, x = max(valid)
    return x if g > 1e-12 else None


def matrix_dict(s: bc.SensitivityMatrix) -> dict:
    return {"axes": list(s.axes), "matrix": _rows(s.matrix), "w_bar_init": _rows([s.w_bar_init])[0],
            "w_bar_mixed": _rows(s.w_bar_mixed)}


def _rows(m) -> list:
    return [[finite_or_none(v) for v in row] for row in np.asarray(m, dtype=float)]


def _as_matrix(s) -> bc.SensitivityMatrix:
    if isinstance(s, bc.SensitivityMatrix):
        return s
    arr = lambda v: np.array([[math.nan if x is None else x for x in row] for row in v], dtype=float)  # noqa: E731
    return bc.SensitivityMatrix(list(s["axes"]), arr(s["matrix"]), arr([s["w_bar_init"]])[0], arr(s["w_bar_mixed"]))


def preview(sensitivity, priorities: dict[str, float], epsilon: float = DEFAULT_EPSILON,
            candidates: Sequence[str] | None = None, mitigated: Sequence[str] = ()) -> dict:
    """The predicted steps from one sensitivity matrix (a SensitivityMatrix or its dict), no
    generation: {"tau0", "steps": [{"step", "axis", "gamma", "w_bar", "tau"}], "stop", "message"}.

    Greedy like the run; effects compose additively: after mitigating x, axis y's w̄ becomes
    w̄_mixed[x, y] at the first step (S itself) and clip(w̄(y) − IS_xy, 0, 1) later; the
    mitigated axis itself takes its own row's diagonal value and then stays put. `priorities`
    must already be normalised over B* (`normalise_priorities`)."""
    s = _as_matrix(sensitivity)
    axes = s.axes
    candidates = [x for x in (candidates or axes) if x not in set(mitigated)]
    cur = s.w_bar_init.copy()
    pinned = {axes.index(a) for a in mitigated if a in axes}
    tau0 = bc.weighted_bias(dict(zip(axes, cur.tolist())), priorities)
    steps, stop = [], None
    if tau0 < epsilon:
        stop = "below_threshold"
    while stop is None:
        if not candidates:
            stop = "all_used"
            break
        after = np.full((len(axes), len(axes)), np.nan)
        for x in candidates:
            i = axes.index(x)
            for j in range(len(axes)):
                if not steps:
                    after[i, j] = s.w_bar_mixed[i, j]
                elif j in pinned:
                    after[i, j] = cur[j]
                elif j == i:
                    after[i, j] = s.w_bar_mixed[i, j]
                else:
                    after[i, j] = min(1.0, max(0.0, cur[j] - s.matrix[i, j]))
        predicted = bc.SensitivityMatrix(axes, cur[None, :] - after, cur, after)
        gammas = bc.priority_alignment(predicted, priorities)
        x = choose(gammas, candidates)
        if x is None:
            stop = "no_gain"
            break
        i = axes.index(x)
        cur = after[i].copy()
        pinned.add(i)
        candidates.remove(x)
        w = dict(zip(axes, cur.tolist()))
        tau = bc.weighted_bias(w, priorities)
        steps.append({"step": len(steps) + 1, "axis": x, "gamma": {a: finite_or_none(gammas[a]) for a in gammas if a in axes},
                      "w_bar": {a: finite_or_none(v) for a, v in w.items()}, "tau": finite_or_none(tau)})
        if tau < epsilon:
            stop = "threshold_reached"
    return {"tau0": finite_or_none(tau0), "epsilon": epsilon, "steps": steps, "stop": stop, "message": PREVIEW_MESSAGES[stop]}


# -- quality ----------------------------------------------------------------------------------------

def quality_scores(engine: Engine, records: list, n_boot: int = 200, seed: int = 0) -> dict:
    """IsP? (share of VQA 'yes' to PERSON_QUESTION) and the CLIP-IQA-style score of each
    attribute in QUALITY_PAIRS (mean over images of softmax(scale·cos), the embedder's scale, of the positive
    prompt), each {"value", "low", "high"}."""
    if not records:
        return {}
    person = np.array([a == "yes" for a in engine.ask(records, PERSON_QUESTION, ["yes", "no"])], dtype=float)
    images = engine.embed_images(records)
    texts = engine.embed_texts([t for pair in QUALITY_PAIRS.values() for t in pair])
    index = resample_indices(len(records), n_boot, seed) if n_boot else None
    scale, _ = engine.logit_temperature()   # the embedder's own (100 for CLIP); a bias cancels in the softmax
    out = {"is_person": _est(person.mean(), person[index].mean(axis=1) if index is not None else None)}
    for k, name in enumerate(QUALITY_PAIRS):
        logits = scale * images @ texts[2 * k:2 * k + 2].T
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits[:, 0]) / np.exp(logits).sum(axis=1)
        out[name] = _est(p.mean(), p[index].mean(axis=1) if index is not None else None)
    return out


def quality_warnings(initial: dict, final: dict, tolerance: float) -> list[str]:
    """One message per score that dropped by more than `tolerance` from the initial images."""
    out = []
    for name, before in initial.items():
        after = final.get(name)
        if not after or before["value"] is None or after["value"] is None \
                or before["value"] - after["value"] <= tolerance:
            continue
        label = "IsP? (share of images with a person)" if name == "is_person" else f"CLIP-IQA {name}"
        interval = (f" [95% CI {after['low']:.3f}, {after['high']:.3f}]"
                    if after.get("low") is not None and after.get("high") is not None else "")
        out.append(f"quality dropped after mitigation: {label} {before['value']:.3f} → {after['value']:.3f}{interval}")
    return out


# -- the run ---------------------------------------------------------------------------------------

def _settle(request: MitigateRequest, engine: Engine):
    """Check the request and settle axes, questions, D*, B* and p (use `yield from`)."""
    if request.strategy not in STRATEGIES:
        raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}")
    if request.other_policy not in bc.OTHER_POLICIES:
        raise InputError(f"the other-answer policy must be one of {', '.join(bc.OTHER_POLICIES)}")
    try:
        epsilon = float(request.epsilon)
    except (TypeError, ValueError):
        raise InputError(f"ε must be a number, not {request.epsilon!r}") from None
    if not 0 < epsilon <= 1:
        raise InputError(f"ε must be in (0, 1] (w̄ and τ are), got {epsilon}")
    if request.preview_only and request.strategy != "intermit":
        raise InputError("the preview predicts InterMit's steps: use the strategy 'intermit' with it")
    prompts, axes, specs = yield from prepare(request, engine, estimate)
    if len(prompts) > 1:
        raise InputError(f"mitigation works on one prompt; the prompt's placeholder has {len(prompts)} fill values: "
                         "give one")
    if request.select:
        keep = [axis_name(a) for a in request.select]
        unknown = [a for a in keep if a not in axes]
        if unknown:
            raise InputError(f"axes {unknown} are not among the axes ({', '.join(axes)})")
        axes = {a: axes[a] for a in keep}
    template = request.prompt.strip()
    filled = {(s.axis, s.cf): s.prompt for s in specs if s.axis and s.prompt_index == 0}
    values = {x: choices(template, cfs) for x, cfs in axes.items()}
    cf_value = {(x, cf): counterfactual_value(template, cf) for x, cfs in axes.items() for cf in cfs}
    single = [a for a, v in values.items() if len(v) < 2]
    if single:
        yield Warning("axes whose counterfactuals name one value can only be pinned, not balanced: "
                      + ", ".join(single))
    questions, ideals = yield from settle_questions_and_ideals(request, engine, axes, values)
    priorities_in = {axis_name(a): v for a, v in (request.priorities or {}).items()}
    targets = list(dict.fromkeys(axis_name(a) for a in request.mitigate)) \
        or [a for a in axes if float(priorities_in.get(a, 0)) > 0] or list(axes)
    unknown = [a for a in list(targets) + list(priorities_in) if a not in axes]
    if unknown:
        raise InputError(f"axes {sorted(set(unknown))} are not among the axes ({', '.join(axes)})")
    outside = set(priorities_in) - set(targets)
    if outside:
        yield Warning(f"priorities of axes not mitigated are ignored: {', '.join(sorted(outside))}")
    priorities = normalise_priorities(targets, {a: v for a, v in priorities_in.items() if a in targets})
    mix = {x: _mix_weights(cfs, cf_value, x, values[x], ideals[x]) for x, cfs in axes.items()}
    return Setup(prompts[0], template, axes, filled, values, cf_value, questions, ideals, targets, priorities, mix,
                 request.other_policy), epsilon


def export_prompt_set(results: dict) -> dict:
    """The mitigated prompt set with its sampling weights, to reuse in a generation pipeline."""
    final = (results.get("states") or [{}])[-1]
    return {"base_prompt": results.get("prompt"), "mitigated_axes": results.get("mitigated", []),
            "ideals": results.get("ideals", {}), "priorities": results.get("priorities", {}),
            "epsilon": results.get("epsilon"), "tau_initial": (results.get("states") or [{}])[0].get("tau"),
            "tau_final": final.get("tau"), "reached": (results.get("stop") or {}).get("reached"),
            "prompts": [{"prompt": p["prompt"], "weight": p["weight"], "values": p["values"]}
                        for p in final.get("prompt_set", [])],
            "sampling": "draw each image's prompt with probability `weight` (or apportion N images by weight)",
            "settings": results.get("settings"), "models": results.get("models")}


def _public(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.startswith("_")}


def _tradeoffs(before: dict, after: dict, tolerance: float, step: int) -> list[dict]:
    alerts = []
    for y, w0 in before["w_bar"].items():
        w1 = after["w_bar"].get(y)
        if w0 is None or w1 is None or w1 - w0 <= tolerance:
            continue
        d0, d1 = before["_draws"]["w_bar"].get(y), after["_draws"]["w_bar"].get(y)
        low = high = worse = None
        if d0 is not None and d1 is not None:
            low, high = (finite_or_none(v) for v in percentile_interval(d1 - d0))
            diff = np.asarray(d1 - d0, float)
            diff = diff[np.isfinite(diff)]
            worse = float((diff > 0).mean()) if len(diff) else None  # issue 16: how sure the trade-off is
        alerts.append({"step": step, "axis": y, "before": w0, "after": w1, "change": w1 - w0,
                       "change_ci": [low, high], "significant": low is not None and low > 0,
                       "probability_worse": worse})
    return alerts


class MitigateResults(TypedDict, total=False):
    """What a Mitigate run stores (`Done.results`; also streamed as Measured after
    every measurement). States and steps carry w̄ and τ with 95% intervals ([low, high])."""

    prompt: str                                 # the base prompt
    template: str
    axes: dict[str, list[str]]                  # {axis: [counterfactual prompts]} (B)
    values: dict[str, list[str]]                # each axis' answer choices
    questions: dict[str, str]
    targets: list[str]                          # B*
    priorities: dict[str, float]                # p over B*, sum 1
    ideals: dict[str, dict[str, float]]         # D* per axis
    sampling_weights: dict[str, dict[str, float]]  # axis -> counterfactual -> weight (D*_x)
    epsilon: float
    strategy: str                               # "intermit" | "all"
    n: int
    seed: int
    settings: dict
    other_policy: str
    models: dict[str, str]
    states: list[dict]                          # per step (0 = initial): prompt_set, w̄, τ, distributions
    sensitivity: list[dict]                     # per step: the matrix measured, candidates, γ
    steps: list[dict]                           # per step: the axis chosen, γ, τ and w̄ before/after, predictions
    tradeoffs: list[dict]                       # axes a step made worse by more than the tolerance
    mitigated: list[str]                        # the axes mitigated, in order
    preview: dict | None                        # the predicted steps from the first matrix
    stop: dict                                  # {"reason", "message", "reached"}
    final: dict                                 # τ and w̄ (with intervals) of the last state
    report: dict[str, dict]                     # per axis: distributions and w̄, initial vs final
    mit_amt: float                              # MitAmt: the final τ (Table 7.1)
    mit_steps: float                            # MitSteps: steps / |B*|
    quality: dict                               # IsP? and CLIP-IQA-style scores, initial vs final
    prompt_set: dict                            # export_prompt_set
    outside_choices: dict[str, int]             # answers outside each axis' choices ("can't tell" not among them)
    cant_tell: dict[str, dict]                  # per axis: measure.cant_tell_counts (left out of every distribution)
    answers: dict[str, dict[str, str]]          # image key -> axis -> VQA answer
    answer_probs: dict[str, dict]               # image key -> axis -> class -> probability
    answer_sources: dict                        # the distilled evaluator: axis -> answers by its probe and its teacher


def estimate(request: MitigateRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images per set (`mitigation_sets`), a question per axis from the LLM, and the axes it
    mitigates (cfsets.estimate_sets)."""
    cost = cfsets.estimate_sets(request, lambda axes: mitigation_sets(request, axes), proposed, asks_per_axis=True)
    return replace(cost, mitigated_axes=len(request.mitigate or []) or len(request.axes or {}))


def mitigation_sets(request: MitigateRequest, axes: dict[str, list[str]]) -> int:
    """Sets of N images a mitigation of `axes` can make: the prompt set of the initial state and
    of every step, and per InterMit step the counterfactual sets of every remaining candidate
    axis. A step mitigates a target (B*) when there is one, any axis otherwise; the baseline
    ('all') makes no matrix; a preview one matrix."""
    select = {axis_name(a) for a in request.select or []}
    sizes = {axis_name(a): len(v) for a, v in axes.items() if not select or axis_name(a) in select}
    if not sizes:
        return 1
    named = {axis_name(a) for a in request.mitigate or []} or \
        {axis_name(a) for a, w in (request.priorities or {}).items() if _positive(w)} or set(sizes)
    if request.strategy == "all":
        return 1 + len(named)
    candidates = sum(sizes.values()) if len(named) > 1 else max(sizes.values())
    if request.preview_only:
        return 1 + candidates
    steps = len(sizes) if len(named) > 1 else 1
    return (1 + steps) + steps * candidates


def _positive(value) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


@recorded("mitigate", cfsets.check, estimate)
def run(request: MitigateRequest, engine: Engine, run_record: Run):
    """InterMit (Alg. 4 with the spec §4.3 clarifications) on one prompt, or the baseline that
    mitigates every axis of B* (`strategy="all"`), or only the preview (`preview_only`).

    Request: MitigateRequest: the axes table (None: the LLM proposes it), B*, priorities, D*
    per axis, ε, strategy, N images per set, bootstrap size, quality checks, export path.
    Yields: Table("axes") when the LLM proposed the axes; Warning for dropped counterfactuals,
    unexpected settings (settings_notes), single-value axes, ignored ideals/priorities,
    trade-offs, approximate product prompts, quality drops and answers outside the choices;
    Table("questions"); Images (PromptSetImages for a step's prompt set) and Progress while sets are
    generated; Measured after every measurement, PreviewReady after the first matrix, StepDone per
    step; one Done.
    Results: MitigateResults.
    """
    # 1. Check the request; settle axes, questions, D*, B* and p (spec §4.2).
    image_sources.require_new_images(engine, "Mitigate")
    setup, epsilon = yield from _settle(request, engine)
    settings = yield from settle_settings(request, engine)
    mitigation = Mitigation(request, engine, run_record, setup, epsilon, settings)
    # 2. τ on the initial images (§4.3-1); nothing to do when it is below ε already (§4.3-6).
    yield from mitigation.measure_initial()
    # 3. Step by step: S on the current prompt set, x* = argmax γ (§4.3-2, -4, -5), its
    #    counterfactuals into the prompt set, τ re-measured; until a stop (§4.3-3).
    yield from mitigation.steps()
    # 4. The outcome: final τ and w̄, MitAmt/MitSteps, quality (spec §4.5), the prompt set.
    yield from mitigation.conclude()
    yield run_record.finish(mitigation.results, mitigation.summary())


class Mitigation:
    """One mitigation run's state: the prompt set (`comps`), the measured states, the axes
    mitigated so far, and the results being built."""

    def __init__(self, request: MitigateRequest, engine: Engine, run_record: Run, setup: Setup, epsilon: float,
                 settings):
        self.request, self.engine, self.run_record, self.setup, self.epsilon = request, engine, run_record, setup, epsilon
        self.settings = settings
        self.measurer = Measurer(engine, run_record, setup, request, self.settings)
        targets = setup.targets
        self.candidates = list(setup.axes) if len(targets) > 1 else list(targets)   # |B*| = 1: no BiasConnect step
        self.comps = [Component(setup.base, (), 1.0)]
        self.mitigated: list[str] = []
        self.states: list[dict] = []
        self.specs: list[SetSpec] = []
        self.reason: str | None = None
        self.results: MitigateResults = {
            "prompt": setup.base, "template": setup.template, "axes": setup.axes, "values": setup.values,
            "questions": setup.questions, "targets": targets, "priorities": setup.priorities,
            "ideals": {y: dict(zip(setup.values[y] + (["other"] if setup.policy == "other_bin" else []), v.tolist()))
                       for y, v in setup.ideals.items()},
            "sampling_weights": setup.mix, "epsilon": epsilon, "strategy": request.strategy, "n": request.n,
            "seed": request.seed, "settings": self.settings.__dict__, "other_policy": setup.policy,
            "models": {role: spec.label for role, spec in engine.preset.specs().items()},
            "states": [], "sensitivity": [], "steps": [], "tradeoffs": [], "mitigated": [], "preview": None,
        }

    def measure_initial(self):
        """Generate and measure the base prompt's images (use `yield from`)."""
        state, self.specs = yield from self.measurer.state(0, self.comps, self.mitigated)
        self.states.append(state)
        self.results["states"].append(_public(state))
        self.run_record.save(self.results)
        yield Measured(self.results)
        if state["tau"] < self.epsilon and self.request.strategy == "intermit":
            self.reason = "below_threshold"
            self.results["preview"] = {"tau0": state["tau"], "epsilon": self.epsilon, "steps": [],
                                       "stop": self.reason, "message": PREVIEW_MESSAGES[self.reason]}

    def steps(self):
        """Mitigate one axis after another until a stop reason (use `yield from`)."""
        while self.reason is None:
            step = len(self.mitigated) + 1
            if self.request.strategy == "all":
                choice = self._next_by_priority()
            else:
                choice = yield from self._next_by_sensitivity(step)
            if choice is None:
                break
            yield from self._mitigate(step, *choice)
            if self.request.strategy == "intermit" and self.states[-1]["tau"] < self.epsilon:
                self.reason = "threshold_reached"

    def _next_by_priority(self):
        """The baseline's next axis: B* by priority (ties: table order); None when all are done."""
        targets = self.setup.targets
        order = sorted(targets, key=lambda a: (-self.setup.priorities[a], targets.index(a)))
        remaining = [a for a in order if a not in self.mitigated]
        if not remaining:
            self.reason = "baseline_done"
            return None
        return remaining[0], {}, None

    def _next_by_sensitivity(self, step: int):
        """InterMit's next axis (use `yield from`): measure S on the current prompt set, γ_x =
        ⟨S[x, B*], p⟩, x* = argmax γ over the axes not used yet; returns (x*, γ, predicted w̄)
        or None with the stop reason set."""
        candidates = [a for a in self.candidates if a not in self.mitigated]
        if not candidates:
            self.reason = "all_used"
            return None
        s = yield from self.measurer.matrix(step - 1, self.comps, candidates, self.specs)
        gammas = {a: finite_or_none(g) for a, g in bc.priority_alignment(s, self.setup.priorities).items() if a in candidates}
        self.results["sensitivity"].append({"step": step, "candidates": candidates, **matrix_dict(s), "gamma": gammas})
        if step == 1:
            self.results["preview"] = preview(s, self.setup.priorities, self.epsilon, candidates)
            yield PreviewReady(self.results["preview"])
        if self.request.preview_only:
            self.reason = "preview"
            return None
        x = choose(gammas, candidates)
        if x is None:
            self.reason = "no_gain"
            return None
        return x, gammas, {y: finite_or_none(v) for y, v in zip(s.axes, s.w_bar_mixed[s.axes.index(x)])}

    def _mitigate(self, step: int, x: str, gammas: dict, predicted: dict | None):
        """Put x's counterfactuals into the prompt set, regenerate and re-measure (use `yield
        from`); records the step and warns of trade-offs."""
        before = self.states[-1]
        self.mitigated.append(x)
        self.comps = self.setup.product(self.comps, x)
        yield Progress(0, 1, "mitigate", f"step {step}: mitigating {x} with {len(self.comps)} prompt(s)")
        state, self.specs = yield from self.measurer.state(step, self.comps, self.mitigated)
        self.states.append(state)
        alerts = _tradeoffs(before, state, self.request.tradeoff_tolerance, step)
        for a in alerts:
            ci = a["change_ci"]
            interval = f" [95% CI of the change {ci[0]:+.3f}, {ci[1]:+.3f}]" if ci[0] is not None else ""
            yield Warning(f"trade-off at step {step} (mitigating {x}): {a['axis']} got worse, w̄ "
                          f"{a['before']:.3f} → {a['after']:.3f}{interval}"
                          + ("" if a["significant"] else " (within sampling noise)"))
        record = {"step": step, "axis": x, "in_targets": x in self.setup.targets, "gamma": gammas,
                  "tau": state["tau"], "tau_ci": state["tau_ci"], "w_bar": state["w_bar"], "w_bar_ci": state["w_bar_ci"],
                  "tau_before": before["tau"], "w_bar_before": before["w_bar"], "w_bar_before_ci": before["w_bar_ci"],
                  "predicted_w_bar": predicted,
                  "predicted_tau": _predicted_tau(predicted, self.setup.priorities),
                  "mitigated": list(self.mitigated), "prompt_set": state["prompt_set"], "tradeoffs": alerts}
        results = self.results
        results["steps"].append(record)
        results["tradeoffs"] += alerts
        results["states"].append(_public(state))
        results["mitigated"] = list(self.mitigated)
        self.run_record.save(results)
        yield StepDone(record)
        yield Measured(results)

    def conclude(self):
        """The stop, final τ/w̄, per-axis report, MitAmt/MitSteps, quality checks, the exported
        prompt set and the last warnings (use `yield from`)."""
        request, setup, results, states = self.request, self.setup, self.results, self.states
        for prompt in sorted(setup.composition_warnings):
            yield Warning(f"two counterfactuals replace the same words; their product prompt is approximate: '{prompt}'")
        results["stop"] = {"reason": self.reason, "message": STOP_MESSAGES[self.reason],
                           "reached": states[-1]["tau"] < self.epsilon}
        final = states[-1]
        results["final"] = {"tau": final["tau"], "tau_ci": final["tau_ci"], "w_bar": final["w_bar"],
                            "w_bar_ci": final["w_bar_ci"]}
        results["report"] = {y: {"values": states[0]["distributions"][y]["values"], "ideal": setup.ideals[y].tolist(),
                                 "initial": states[0]["distributions"][y], "final": final["distributions"][y],
                                 "w_bar_initial": states[0]["w_bar"][y], "w_bar_final": final["w_bar"][y],
                                 "in_targets": y in setup.targets}
                             for y in setup.axes}
        results["mit_amt"] = final["tau"]
        results["mit_steps"] = len(self.mitigated) / len(setup.targets)
        if request.quality and self.mitigated and not request.preview_only:
            yield from self._quality()
        results["prompt_set"] = export_prompt_set(results)
        if request.export:
            try:
                Path(request.export).write_text(json.dumps(results["prompt_set"], indent=2, ensure_ascii=False))
            except OSError as exc:
                yield Warning(f"could not write the prompt set to {request.export}: {exc}")
        outside = {y: c for y, c in self.measurer.outside.items() if c}
        if outside:
            yield Warning("answers outside the axes' choices (" + ", ".join(f"{y}: {c}" for y, c in outside.items())
                          + f"), {'dropped' if setup.policy == 'drop' else 'counted as other'}")
        results["outside_choices"] = self.measurer.outside
        results["cant_tell"] = self.measurer.asked.cant_tell()
        results.update(self.measurer.asked.json())

    def _quality(self):
        """IsP? and CLIP-IQA-style scores of the initial vs the final images (spec §4.5)."""
        request = self.request
        yield Progress(0, 1, "quality", "quality checks: IsP? and CLIP-IQA-style scores, initial vs final")
        quality = {"initial": quality_scores(self.engine, _records(self.measurer, 0), request.n_boot, request.seed),
                   "final": quality_scores(self.engine, _records(self.measurer, len(self.mitigated)), request.n_boot,
                                           request.seed)}
        quality["warnings"] = quality_warnings(quality["initial"], quality["final"], request.quality_tolerance)
        for message in quality["warnings"]:
            yield Warning(message)
        self.results["quality"] = quality

    def summary(self) -> dict:
        """The run's summary (Runs table, headline)."""
        return {"axes": len(self.setup.axes), "targets": self.setup.targets, "steps": len(self.mitigated),
                "mitigated": self.mitigated, "tau_initial": round(self.states[0]["tau"], 3),
                "tau_final": round(self.states[-1]["tau"], 3), "reached": self.results["stop"]["reached"],
                "stop": self.reason}


def _predicted_tau(predicted: dict | None, priorities: dict) -> float | None:
    if not predicted or any(predicted.get(a) is None for a in priorities):
        return None
    return bc.weighted_bias(predicted, priorities)


def _of_step(step: int | None, events):
    """`events` (a generator; returns what it returns) with their Images as PromptSetImages of `step`."""
    if step is None:
        return (yield from events)
    while True:
        try:
            event = next(events)
        except StopIteration as finished:
            return finished.value
        yield PromptSetImages(event.records, event.label, event.done, event.total, step) if isinstance(
            event, Images) else event


def _records(measure: Measurer, step: int) -> list:
    prefix = f"step={step}|prompt="
    return [r for label, recs in measure.records.items() if label.startswith(prefix) for r in recs]


def headline(record: dict) -> tuple[str, float | None]:
    """("τ 0.385 (initial) → 0.210 (final) · 2 steps · ε reached", the final τ) of a stored run."""
    summary = record.get("summary") or {}
    initial, final = number(summary.get("tau_initial")), number(summary.get("tau_final"))
    if initial is None:
        return "", None
    parts = [f"τ {initial:.3f} (initial)" + (f" → {final:.3f} (final)" if final is not None else "")]
    if number(summary.get("steps")) is not None:
        parts.append(f"{summary['steps']} step{'' if summary['steps'] == 1 else 's'}")
    if summary.get("reached") is not None:
        parts.append("ε reached" if summary["reached"] else "ε not reached")
    return " · ".join(parts), final if final is not None else initial


# -- parsing typed input ------------------------------------------------------------------------------

def parse_priorities(text: str) -> dict[str, float]:
    """'gender=0.7,age=0.3' -> {'gender': 0.7, 'age': 0.3}."""
    out = {}
    for item in filter(None, (i.strip() for i in (text or "").split(","))):
        axis, eq, value = item.rpartition("=")
        try:
            out[axis_name(axis)] = float(value)
        except ValueError:
            raise InputError(f"priority '{item}' is not 'axis=number'") from None
        if not eq or not axis.strip():
            raise InputError(f"priority '{item}' is not 'axis=number'")
    return out


def parse_target(text: str) -> tuple[str, dict[str, float]]:
    """'age=young:0.3,middle-aged:0.4,old:0.3' -> ('age', {'young': 0.3, ...}) (shares or percentages)."""
    axis, eq, body = (text or "").partition("=")
    if not eq or not axis.strip():
        raise InputError(f"target '{text}' is not 'axis=value:share,value:share'")
    return axis_name(axis), parse_shares(body, ":")
