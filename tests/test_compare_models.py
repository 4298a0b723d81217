"""Compare models (issue 17): the same audit on two generators, side by side, one generator loaded
at a time; checked against the synthetic world's planted biases (a second world table plants the
opposite gender bias for "doctor")."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.common.events import Done, Progress
from engine.methods import compare_models
from engine.models.presets import SYNTHETIC_TABLE


@pytest.fixture(scope="module")
def flipped_world(tmp_path_factory) -> str:
    """The synthetic world with doctors 20% male (the default plants 80%)."""
    table = json.loads(Path(SYNTHETIC_TABLE).read_text())
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.2, "female": 0.8}
    table["rules"] = [r for r in table["rules"] if not (r["subject"] == "doctor" and "gender" in r["then"])]
    path = tmp_path_factory.mktemp("world") / "flipped_world.json"
    path.write_text(json.dumps(table))
    return str(path)


@pytest.fixture
def engine(tmp_path):
    return Engine("synthetic", data_dir=str(tmp_path / "store"))


def finish(events, seen=None):
    for event in events:
        if seen is not None:
            seen.append(event)
        if isinstance(event, Done):
            return event
    raise AssertionError("no Done")


@pytest.mark.slow
def test_single_prompt_on_two_generators_recovers_the_planted_difference(engine, flipped_world):
    other = f"synthetic_generator:{flipped_world}"
    loaded = []
    real_get = engine.models.get

    def spy(spec, **context):      # which generators are in memory whenever one is asked for
        backend = real_get(spec, **context)
        loaded.append({m["model"] for m in engine.models.loaded()})
        return backend

    engine.models.get = spy
    events = []
    done = finish(compare_models.run(compare_models.CompareModelsRequest(
        "single_prompt", ["synthetic", other],
        {"prompt": "a photo of a doctor", "n": 48, "n_boot": 200, "gap": False, "axes": ["gender"]}), engine), events)
    r = done.results
    assert len(r["runs"]) == 2 and r["generators"] == ["synthetic", other]
    rows = {(row["group"], row["metric"]): row for row in r["comparison"]["rows"]}
    male = rows[("gender", "share: male")]
    a, b = (v["value"] for v in male["values"])
    assert a > 0.6 and b < 0.4                                  # planted 0.8 vs 0.2 at N = 48
    d = male["differences"][0]
    assert d["significant"] and d["high"] < 0 and d["low"] < d["value"] < d["high"]
    # each model's audit is an ordinary run, its generator recorded (Runs groups by it)
    gens = [engine.store.get_run(i)["models"]["generator"] for i in r["runs"]]
    assert gens[0] != gens[1] and flipped_world in gens[1]
    assert engine.store.get_run(done.run_id)["method"] == "compare_models"
    # one generator in memory at a time: never both synthetic generators loaded together
    generators = [{m for m in s if m.startswith("synthetic_generator")} for s in loaded]
    assert max(len(g) for g in generators) == 1
    assert any(isinstance(e, Progress) and e.message.startswith(other) for e in events)
    assert [e.generator for e in events if isinstance(e, compare_models.ModelDone)] == ["synthetic", other]


@pytest.mark.slow
def test_counterfactuals_use_one_set_of_axes_for_every_model(engine, flipped_world):
    axes = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
            "age": ["a photo of a young doctor", "a photo of an old doctor"]}
    done = finish(compare_models.run(compare_models.CompareModelsRequest(
        "counterfactuals", ["synthetic", f"synthetic_generator:{flipped_world}"],
        {"prompt": "a photo of a doctor", "n": 16, "n_boot": 100, "axes": axes}), engine))
    r = done.results
    assert [res["axes"] for res in r["results"]] == [axes, axes]
    rows = {(row["group"], row["metric"]) for row in r["comparison"]["rows"]}
    assert ("gender", "mad") in rows and ("age", "mad") in rows


def test_bad_requests_name_the_problem_and_leave_no_run(engine):
    for request, words in [(compare_models.CompareModelsRequest("single_prompt", ["synthetic"], {"prompt": "a cat"}),
                            "two or more"),
                           (compare_models.CompareModelsRequest("single_prompt", ["synthetic", "nonsense"],
                                                                {"prompt": "a cat"}), "neither a preset"),
                           (compare_models.CompareModelsRequest("mine", ["synthetic", "colour"], {}), "not 'mine'"),
                           (compare_models.CompareModelsRequest("single_prompt", ["synthetic", "colour"],
                                                                {"prompt": ""}), "empty")]:
        with pytest.raises(InputError, match=words):
            list(compare_models.run(request, engine))
    assert engine.store.count("runs") == 0


@pytest.mark.slow
def test_cli_generators_flag_compares_side_by_side(tmp_path, flipped_world, capsys):
    from engine.__main__ import main

    axes = json.dumps({"gender": ["a photo of a male doctor", "a photo of a female doctor"],
                       "age": ["a photo of a young doctor", "a photo of an old doctor"]})
    data = str(tmp_path / "cli")
    assert main(["intersectional", "--preset", "synthetic", "--data-dir", data, "--prompt", "a photo of a doctor",
                 "-n", "12", "--axes", axes, "--generators", "synthetic", f"synthetic_generator:{flipped_world}",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "intersectional" and len(out["runs"]) == 2
    groups = {row["group"] for row in out["comparison"]["rows"]}
    assert "IS gender → age" in groups and "graph" in groups
    assert main(["counterfactuals", "--preset", "synthetic", "--data-dir", data, "--prompt", "a photo of a doctor",
                 "--axes", axes, "--generators", "synthetic"]) == 2
    assert "two or more" in capsys.readouterr().err
    assert main(["single-prompt", "--preset", "synthetic", "--data-dir", data, "--prompt", "a photo of a doctor",
                 "-n", "24", "--generators", "synthetic", f"synthetic_generator:{flipped_world}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    male = next(r for r in out["comparison"]["rows"] if r["group"] == "gender" and r["metric"] == "share: male")
    assert male["values"][0]["value"] > male["values"][1]["value"] and male["differences"][0]["value"] < 0


@pytest.mark.slow
def test_the_page_shows_models_side_by_side_with_escaped_names(engine, flipped_world):
    from engine.report.compare_models import page

    hostile = "a photo of a <b>doctor</b>"
    done = finish(compare_models.run(compare_models.CompareModelsRequest(
        "single_prompt", ["synthetic", f"synthetic_generator:{flipped_world}"],
        {"prompt": hostile, "n": 8, "n_boot": 100, "gap": False, "axes": ["gender"]}), engine))
    html = str(page(done.results))
    assert "<b>doctor</b>" not in html and "&lt;b&gt;doctor&lt;/b&gt;" in html
    assert html.count("data-chart=\"axis-gender\"") + html.count("data-chart='axis-gender'") == 2
    assert "B − A" in html and "share male" in html


@pytest.mark.slow
def test_runs_compare_groups_runs_by_model_and_opens_a_compare_run(engine, flipped_world):
    from engine.runs import history as runs

    done = finish(compare_models.run(compare_models.CompareModelsRequest(
        "single_prompt", ["synthetic", f"synthetic_generator:{flipped_world}"],
        {"prompt": "a photo of a doctor", "n": 6, "n_boot": 100, "gap": False, "axes": ["gender"]}), engine))
    comparison = runs.compare_runs(engine.store, done.results["runs"])
    assert [len(g["runs"]) for g in comparison["by_model"]] == [1, 1]
    from engine.report.runs import compare_html

    assert "By model:" in str(compare_html(comparison))
    row = next(r for r in runs.list_runs(engine.store) if r["id"] == done.run_id)
    assert row["headline"].startswith("Single Prompt on synthetic vs synthetic_generator:")
    from engine.report.runs import results_html

    assert 'id="cm-page"' in str(results_html("compare_models", engine.store.get_run(done.run_id)["results"]))
