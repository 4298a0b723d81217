"""Issue 24: a tab's form starts where the CLI and the API start (its method's request defaults),
and lists the values the method accepts, read from the request, never retyped."""
from __future__ import annotations

import gradio as gr
import pytest

import app
from engine.metrics.biasconnect import OTHER_POLICIES
from engine.metrics.gap import COMBINATIONS
from engine.methods import counterfactuals, mine, mitigate, single_prompt


@pytest.fixture
def widgets(engine):
    demo = app.build_app(engine)
    return [block for block in demo.blocks.values() if isinstance(block, gr.components.Component)]


def by_id(widgets, elem_id):
    return next(w for w in widgets if w.elem_id == elem_id)


def test_mine_starts_at_its_requests_budget(engine, widgets):
    request = mine.MineRequest()
    form = {k: by_id(widgets, f"mine-{k}").value for k in ("T", "b", "s", "m", "n", "nvar")}
    assert form == {"T": mine.DEFAULT_ITERATIONS, "b": request.population, "s": request.select,
                    "m": request.mutations, "n": min(request.n, engine.max_images),
                    "nvar": min(request.n, engine.max_images)}
    assert (form["b"], form["s"], form["m"]) == (12, 3, 3)   # the tab used 8/2/3 while the request said 12/3/3


def test_every_list_of_options_is_the_requests(engine, widgets):
    combinations = [w for w in widgets if getattr(w, "label", None) == "Gap score combination"]
    assert len(combinations) == 2   # Single Prompt and Mine
    assert all([value for _, value in w.choices] == list(COMBINATIONS) for w in combinations)
    assert [v for _, v in by_id(widgets, "mine-strategy").choices] == list(mine.STRATEGIES)
    assert [v for _, v in by_id(widgets, "mt-strategy").choices] == list(mitigate.STRATEGIES)
    assert [v for _, v in by_id(widgets, "cf-mode").choices] == list(counterfactuals.MODES)
    assert [v for _, v in by_id(widgets, "ic-policy").choices] == list(OTHER_POLICIES)
    assert by_id(widgets, "sp-axes-pick").value == list(single_prompt.DEFAULT_AXES)
    assert by_id(widgets, "mt-epsilon").value == mitigate.DEFAULT_EPSILON
