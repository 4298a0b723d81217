"""Counterfactuals in paper and reference mode (issue 23): a reference run equals the port on its
stored answers, the two modes agree without synonyms and captions, every run carries both modes
(recomputed from the store, never generated again), the page says when they rank the axes
differently, and the mode reaches the CLI, Runs compare, the export and the tab."""
import json
import math
import os

import numpy as np
import pytest

from engine.common.events import Warning
from engine.methods import cfsets
from engine.methods.cfsets import SetSpec
from engine.methods.counterfactuals import (CounterfactualsRequest, concept_set, in_mode, mode_scores, pair_cas,
                                            resampled_cas, run, scores)
from engine.metrics import tibet_reference
from engine.metrics.wordnet import DEFAULT_WORDNET_DIR
from engine.report import counterfactuals as page
from engine.report.export import scores_csv
from engine.runs.history import compare_runs

from runhelpers import done_event

needs_wordnet = pytest.mark.skipif(not os.path.isfile(os.path.join(DEFAULT_WORDNET_DIR, "index.noun")),
                                   reason="WordNet database (Debian wordnet-base) not installed")
AXES = {"gender": ["a photo of a male firefighter", "a photo of a female firefighter"],
        "age": ["a photo of a young firefighter", "a photo of a middle-aged firefighter", "a photo of an old firefighter"]}


def measure(engine, **kw):
    kw = {"n": 8, "axes": AXES, "n_boot": 100, **kw}
    events = list(run(CounterfactualsRequest("a photo of a firefighter", **kw), engine))
    return done_event(events), events


def answers_of(results, label):
    """[image][axis]: the stored answers of a set, in axis order."""
    return [[im["answers"][a] for a in results["axes"]] for im in results["sets"][label]["images"]]


@pytest.mark.slow
def test_a_reference_run_is_the_port_on_its_stored_answers(engine):
    done, _ = measure(engine, mode="reference")
    results = done.results
    assert results["mode"] == "reference" and done.summary["mode"] == "reference"
    for axis, cfs in AXES.items():
        expected = tibet_reference.axis_scores(answers_of(results, "initial"),
                                               [answers_of(results, f"axis={axis}|cf={cf}") for cf in cfs])
        assert [results["cas"][axis][cf] for cf in cfs] == expected["cas"]
        assert results["mad"][axis] == expected["mad"]
        assert list(results["mad_per_question"][axis].values()) == expected["mad_per_question"]
        assert list(results["mad_per_question"][axis]) == list(AXES)     # question q is axis q's
    # the stored point values are what Runs recomputes from the answers, in both modes
    assert mode_scores(results, "reference") == results["modes"]["reference"]
    assert {k: results["modes"]["reference"][k] for k in ("mad", "mad_order")} == {
        "mad": results["mad"], "mad_order": results["mad_order"]}
    no_captions = measure(engine, mode="reference", caption=False)[0].results
    assert (no_captions["mad"], no_captions["cas"]) == (results["mad"], results["cas"])   # never part of it (Q6)
    paper = measure(engine)[0].results                                     # the same images and answers
    assert results["modes"]["paper"]["mad"] == paper["mad"] and results["modes"]["paper"]["cas"] == paper["cas"]
    assert paper["modes"]["reference"] == results["modes"]["reference"]
    assert mode_scores(paper, "paper") == paper["modes"]["paper"]


def test_the_modes_agree_without_synonyms_and_captions(engine):
    results = measure(engine, synonyms=False, caption=False)[0].results
    other = results["modes"]["reference"]
    for axis in AXES:
        assert other["cas"][axis] == pytest.approx(results["cas"][axis], abs=1e-12)
        assert other["mad"][axis] == pytest.approx(results["mad"][axis], abs=1e-12)


def test_reference_options_and_a_single_counterfactual(engine):
    axes = {"gender": AXES["gender"], "age": ["a photo of an old firefighter"]}
    done, events = measure(engine, mode="reference", axes=axes, min_frequency=0.05)
    warnings = [e.message for e in events if isinstance(e, Warning)]
    assert any("reference mode computes as the released code does, so min_frequency" in w for w in warnings)
    results = done.results
    assert results["mad"]["age"] is None and results["mad_order"] == ["gender", "age"]   # 0/0 in the released code
    assert results["mad_ci"]["age"] == [None, None] and "mad_age" not in done.summary
    assert "(reference mode)" in page.mad_html(results) and "n/a" in page.page(results)


@needs_wordnet
def test_reference_resamples_with_every_image_once_reproduce_the_value():
    initial = [["a man", "male"], ["a guy", "man"], ["a woman", "young"], ["female", "old"]]
    cf = [["a man", "old"], ["male", "guy"], ["person", "young"], ["a man", "none"]]

    def concept_set_of(answers):
        n = len(answers)
        return concept_set(SetSpec("x", "p", 0), [None] * n, [[a[q] for a in answers] for q in range(2)], [],
                           np.eye(n, 4), np.ones((3, n)), "reference")

    a, b = concept_set_of(initial), concept_set_of(cf)
    request = CounterfactualsRequest("p", mode="reference")
    value = pair_cas(a, b, request)
    assert value == tibet_reference.cas(tibet_reference.concepts(initial), tibet_reference.concepts(cf))
    assert resampled_cas(a, b, request) == pytest.approx([value] * 3, abs=1e-12)


def test_the_page_says_when_the_modes_rank_the_axes_differently(engine):
    results = measure(engine, mode="reference")[0].results
    differ = results["modes"]["paper"]["mad_order"] != results["mad_order"]
    assert ('id="cf-modes-differ"' in page.mad_html(results)) == differ
    results["modes"]["paper"]["mad_order"] = ["<b>age</b>", "gender"]
    html = str(page.mad_html(results))
    order = " &gt; ".join(results["mad_order"])
    assert ('id="cf-modes-differ"' in html and "paper mode gives &lt;b&gt;age&lt;/b&gt; &gt; gender" in html
            and f"reference mode (the released code) gives {order}." in html)
    results["modes"]["paper"]["mad_order"] = list(results["mad_order"])
    assert 'id="cf-modes-differ"' not in str(page.mad_html(results))
    full = str(page.page(results))
    assert 'id="cf-modes"' in full and "reference mode (the authors&#39; released code)" in full


def test_switching_the_mode_rescores_the_shown_run_from_its_stored_answers(engine):
    results = measure(engine)[0].results          # paper mode, with intervals and a headline
    shown = in_mode(results, "reference")
    other = results["modes"]["reference"]
    assert shown["mode"] == "reference" and shown["rescored_from"] == "paper"
    assert shown["mad"] == other["mad"] and shown["mad_order"] == other["mad_order"]
    assert {(c["axis"], c["prompt"]): c["cas"] for c in shown["counterfactuals"]} == {
        (a, cf): v for a, cas in other["cas"].items() for cf, v in cas.items()}
    # point values only: the intervals and the headline are the paper run's
    assert all(ci == [None, None] for ci in shown["mad_ci"].values()) and shown["headline"] is None
    html = str(page.mad_html(shown))
    assert 'id="cf-rescored"' in html and "(reference mode)" in html and 'data-metric="mad"' in html
    assert in_mode(results, "paper") is results and "rescored_from" not in results   # the stored run is untouched


def test_runs_compare_and_export_show_both_modes_of_each_run(engine):
    paper = measure(engine)[0]
    reference = measure(engine, mode="reference")[0]
    comparison = compare_runs(engine.store, [paper.run_id, reference.run_id])
    rows = {(r["group"], r["metric"]): r["values"] for r in comparison["rows"]}
    for axis in AXES:
        for mode in ("paper", "reference"):
            a, b = rows[axis, f"MAD ({mode})"]
            assert a["value"] == b["value"]                      # the same answers, the same numbers
            own = a if mode == "paper" else b
            assert own["low"] is not None and (b if mode == "paper" else a)["low"] is None
    assert rows["gender: a photo of a male firefighter", "CAS (reference)"][1]["value"] == \
        reference.results["cas"]["gender"]["a photo of a male firefighter"]
    # a run stored before both modes were kept: the other mode comes from its stored answers
    older = {k: v for k, v in paper.results.items() if k not in ("modes", "mode")}
    assert {(s.group, s.metric): s.value for s in scores(older, {})} == {
        (s.group, s.metric): s.value for s in scores(paper.results, {})}
    csv = scores_csv(engine.store, [reference.run_id])
    assert "MAD (reference)" in csv and "MAD (paper)" in csv
    assert engine.store.get_run(reference.run_id)["results"]["mode"] == "reference"


@pytest.mark.slow
def test_cli_mode_flag(tmp_path):
    from test_cli import cli

    axes = json.dumps(AXES)
    out = cli("counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a firefighter", "--axes", axes,
              "-n", "6", "--n-boot", "0", "--mode", "reference", "--json", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["mode"] == "reference" and set(result["modes"]) == {"paper", "reference"}
    assert all(math.isfinite(v) for v in result["mad"].values())
    bad = cli("counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a firefighter", "--mode", "released",
              data_dir=tmp_path)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr


def test_an_unknown_mode_is_one_sentence(engine):
    from engine.common.errors import InputError

    with pytest.raises(InputError, match="mode must be one of paper, reference"):
        list(run(CounterfactualsRequest("a photo of a firefighter", axes=AXES, mode="thesis"), engine))


@pytest.mark.slow
def test_the_tab_runs_in_reference_mode(engine):
    from gradio_client import Client

    from apphelpers import running_app
    from test_app_counterfactuals import cf_args

    table = {"headers": ["axis", "counterfactual"], "data": cfsets.rows_from_axes({"gender": AXES["gender"]})}
    with running_app(engine) as url:
        client = Client(url, verbose=False)
        progress, mad, *_ = client.predict(*cf_args("a photo of a firefighter", table, n=6), "reference",
                                           api_name="/counterfactuals")
    assert "Done" in progress and "reference mode" in mad
    stored = engine.store.list_runs("counterfactuals")[0]
    assert stored["request"]["mode"] == "reference" and stored["summary"]["mode"] == "reference"
