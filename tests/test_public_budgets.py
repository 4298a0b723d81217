"""A public GapLens' budgets, storage shares and bounded inputs, in the engine (issue 27): every
request is charged the most it can generate, LLM calls are charged whatever the backend,
nothing a visitor does resets a budget, each visitor's runs fit their share of the store, and
study packs, answer files and searches are bounded before they are read."""
import csv
import io
import itertools
import json
import math
import random
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest

from engine.common import access
from engine.runs import history as runs
from engine.tools import study
from engine.core.engine import Engine
from engine.common.errors import InputError, OverBudgetError, StoreError
from engine.common.events import Warning
from engine.runs.imports import import_zip
from engine.hosting.limits import Budget
from engine.methods import compare_models, counterfactuals, generate, intersectional, mine, mitigate, single_prompt
from engine.report.export import export_zip
from engine.store.store import MAX_PUBLIC_RESULTS_BYTES

from runhelpers import done_event

A = access.Visitor("session:a", address="10.0.0.1")
B = access.Visitor("session:b", address="10.0.0.2")


def public_engine(tmp_path, name="store", **budget) -> Engine:
    return Engine("synthetic", data_dir=str(tmp_path / name), public=True, budget=Budget(**budget))


def charged(engine: Engine, visitor: access.Visitor) -> tuple[int, int]:
    """(images, LLM calls) charged to `visitor` in the last hour, from the ledger."""
    with engine.store.ledger() as ledger:
        rows = ledger.charges(0, visitor=visitor.id)
    return sum(r[1] for r in rows), sum(r[2] for r in rows)


def events_of(run) -> list:
    return list(run)


# -- what a request is charged -------------------------------------------------------------------
def test_until_is_charged_the_largest_set_and_llm_calls_are_charged_as_they_are_made(tmp_path):
    # a gap score's question may be asked three times (JSON_ATTEMPTS): a request is admitted when three fit
    engine = public_engine(tmp_path, hourly_images=200, hourly_llm_calls=5)
    with access.acting_as(A):
        made, calls = engine.stats.images_generated, engine.stats.llm_calls
        result = done_event(single_prompt.run(single_prompt.SinglePromptRequest(
            "a photo of a doctor", n=2, until_half_width=0.01, n_boot=100), engine))
        assert result.results["n"] == 64 == engine.budget.images          # grew to what one request may have
        assert charged(engine, A) == (64, engine.stats.llm_calls - calls) == (64, 1)
        assert engine.stats.images_generated - made == 64
        # every backend call is charged, the synthetic LLM's too; a cache hit is not a call
        done_event(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a nurse", n=2, n_boot=100), engine))
        done_event(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a nurse", n=2, n_boot=100), engine))
        assert charged(engine, A) == (68, 2)
        with pytest.raises(OverBudgetError, match=r"each visitor may make 5 LLM calls per hour; 3 are left this hour "
                                                  r"and this request needs up to 5"):
            # a gap score's worst case fits, a proposal's (three turns, the last asked up to three times) does not:
            # refused before any work
            events_of(counterfactuals.run(counterfactuals.CounterfactualsRequest("a photo of a judge", n=2), engine))
        done_event(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a judge", n=2, n_boot=100), engine))
        with pytest.raises(OverBudgetError, match=r"each visitor may make 5 LLM calls per hour; 2 are left .*needs up "
                                                  r"to 3; enough frees up at \d\d:\d\d UTC \(in (59|60) min\)"):
            events_of(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a chef", n=2), engine))
        # deleting runs gives nothing back
        runs.delete_runs(engine.store, [r["id"] for r in engine.store.list_runs()])
        assert charged(engine, A) == (70, 3)
    with access.acting_as(access.HOST):  # the host is never charged
        done_event(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a chef", n=2, n_boot=100), engine))
    assert engine.store.count("runs") == 1


@pytest.mark.slow
def test_proposed_axes_are_charged_a_whole_request_and_cut_to_fit_it(tmp_path):
    engine = public_engine(tmp_path, images=40)
    with access.acting_as(A):
        made = engine.stats.images_generated
        events = events_of(counterfactuals.run(counterfactuals.CounterfactualsRequest(
            "a photo of a doctor", n=8, n_boot=0), engine))
        generated = engine.stats.images_generated - made
        assert charged(engine, A)[0] == 40 and 0 < generated <= 40
        notes = [e.message for e in events if isinstance(e, Warning) and "left out the proposed axes" in e.message]
        assert notes and "more than the 40 images one request may generate here" in notes[0]
    with access.acting_as(access.HOST):   # the host's proposals are not cut
        made = engine.stats.images_generated
        events_of(counterfactuals.run(counterfactuals.CounterfactualsRequest(
            "a photo of a doctor", n=8, n_boot=0, seed=100), engine))
        assert engine.stats.images_generated - made > 40


def test_a_mine_resume_is_priced_with_its_runs_settings(tmp_path):
    engine = public_engine(tmp_path, images=16)
    request = mine.MineRequest(iterations=3, population=4, select=1, mutations=2, n=2, seed=1)
    with access.acting_as(A):
        with pytest.raises(OverBudgetError, match="can generate up to 24"):   # T·b·N = 3·4·2
            events_of(mine.run(request, engine))
    engine.budget.images = 24
    with access.acting_as(A):
        events, run_id = mine.run(request, engine), None
        for event in events:                 # stop once the first iteration is done
            if isinstance(event, mine.MineStarted):
                run_id = event.run_id
            if isinstance(event, mine.PromptScored) and event.iteration == 1:
                break
        events.close()
        engine.budget.images = 16            # the 2 iterations left: 2·4·2 = 16 (the defaults would price 384)
        before = charged(engine, A)[0]
        resumed = done_event(mine.run(mine.MineRequest(resume=run_id), engine))
        assert resumed.run_id == run_id and charged(engine, A)[0] - before == 16


@pytest.mark.slow
def test_a_comparison_is_charged_once_for_every_models_runs(tmp_path):
    engine = public_engine(tmp_path, images=64)
    request = compare_models.CompareModelsRequest(
        "counterfactuals", ["synthetic", "colour"],
        {"prompt": "a photo of a doctor", "n": 4, "n_boot": 0})
    with access.acting_as(A):
        made = engine.stats.images_generated
        done_event(compare_models.run(request, engine))
        assert charged(engine, A)[0] == 64 >= engine.stats.images_generated - made


METHOD_CASES = {
    "generate": (generate.run, generate.GenerateRequest("a photo of a cook", n=4, prompts=["a photo of a cook",
                                                                                          "a photo of a baker"])),
    "single_prompt": (single_prompt.run, single_prompt.SinglePromptRequest("a photo of a cook", n=3,
                                                                            until_half_width=0.2, n_boot=100)),
    "counterfactuals": (counterfactuals.run, counterfactuals.CounterfactualsRequest(
        "a photo of a {job}", n=3, n_boot=0, fill=["cook", "pilot"],
        axes={"gender": ["a photo of a male {job}", "a photo of a female {job}"]})),
    "intersectional": (intersectional.run, intersectional.IntersectionalRequest("a photo of a cook", n=4, n_boot=0)),
    "mitigate": (mitigate.run, mitigate.MitigateRequest(
        "a photo of a cook", n=8, n_boot=0, quality=False,
        axes={"gender": ["a photo of a male cook", "a photo of a female cook"],
              "age": ["a photo of a young cook", "a photo of an old cook"],
              "skin tone": ["a photo of a light-skinned cook", "a photo of a dark-skinned cook"]})),
    "mitigate_all": (mitigate.run, mitigate.MitigateRequest(
        "a photo of a cook", n=8, n_boot=0, quality=False, strategy="all",
        axes={"gender": ["a photo of a male cook", "a photo of a female cook"],
              "age": ["a photo of a young cook", "a photo of an old cook"]})),
    "mine": (mine.run, mine.MineRequest(iterations=2, population=4, select=1, mutations=2, n=2)),
}


@pytest.mark.parametrize("case", list(METHOD_CASES))
def test_no_method_generates_more_than_it_was_charged(tmp_path, case):
    method, request = METHOD_CASES[case]
    engine = public_engine(tmp_path, images=256, hourly_images=256)
    with access.acting_as(A):
        done_event(method(request, engine))
    images, _ = charged(engine, A)
    assert 0 < engine.stats.images_generated <= images, (case, engine.stats.images_generated, images)


def test_regenerating_an_image_is_charged(tmp_path):
    engine = public_engine(tmp_path, hourly_images=5)
    with access.acting_as(A):
        result = done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=4), engine))
        record = result.results["images"][0]
        assert engine.regenerate_check("a photo of a cook", record["seed"], engine.settings(), record["key"])[0]
        assert charged(engine, A)[0] == 5
        with pytest.raises(OverBudgetError, match="each visitor may generate 5 images per hour; 0 are left"):
            engine.regenerate_check("a photo of a cook", record["seed"], engine.settings(), record["key"])


def test_a_new_session_from_the_same_address_and_everyone_together_share_budgets(tmp_path):
    engine = public_engine(tmp_path, hourly_images=8, visitors_per_address=2, hourly_images_total=20)
    for session in ("s1", "s2"):
        with access.acting_as(access.Visitor(f"session:{session}", address="10.0.0.9")):
            done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=8, seed=len(session)), engine))
    with access.acting_as(access.Visitor("session:s3", address="10.0.0.9")):   # a fresh session, same address
        with pytest.raises(OverBudgetError, match="the visitors from one client address may generate 16 images per "
                                                  "hour together; 0 are left"):
            events_of(generate.run(generate.GenerateRequest("a photo of a cook", n=1), engine))
    with access.acting_as(access.Visitor("session:s4", address="10.0.0.10")):
        with pytest.raises(OverBudgetError, match="all visitors of this GapLens together may generate 20 images per "
                                                  "hour; 4 are left this hour and this request needs up to 8"):
            events_of(generate.run(generate.GenerateRequest("a photo of a cook", n=8), engine))
        done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=4, seed=50), engine))


# -- storage ---------------------------------------------------------------------------------------
def _export_with_results(tmp_path, name: str, mib: float) -> str:
    """An export of one run whose results hold `mib` MiB of incompressible text."""
    source = Engine("synthetic", data_dir=str(tmp_path / f"src-{name}"))
    run = done_event(generate.run(generate.GenerateRequest(f"a photo of a {name}", n=2), source))
    blob = "".join(random.Random(name).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=int(mib * 2**20)))
    source.store.update_run(run.run_id, results={**run.results, "notes": blob})
    path = tmp_path / f"{name}.zip"
    export_zip(source.store, [run.run_id], path)
    return str(path)


@pytest.mark.slow
def test_one_visitors_imports_past_their_share_leave_another_visitors_runs_working(tmp_path):
    engine = public_engine(tmp_path, storage_mb=9)
    engine.store.quota_bytes = 24 * 2**20
    # ~6 MiB each unpacked: the results twice (JSON and report) and the report's offline chart runtime
    archives = [_export_with_results(tmp_path, name, 2.5) for name in ("weaver", "potter", "smith")]
    with access.acting_as(A):
        for archive in archives[:2]:
            assert len(import_zip(engine.store, archive)["imported"]) == 1
        assert engine.store.visitor_usage(A.id) > 5 * 2**20
        with pytest.raises(InputError, match=r"unpacks to 6 MiB; at most \d MiB are accepted \(what is left of your share"):
            import_zip(engine.store, archives[2])
        with pytest.raises(OverBudgetError, match="each visitor's runs may hold 9 MiB of this GapLens' store; yours"):
            events_of(generate.run(generate.GenerateRequest("a photo of a cook", n=64), engine))
    with access.acting_as(B):
        done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=8), engine))
        assert len(runs.list_runs(engine.store)) == 1


def test_a_full_store_removes_idle_visitor_runs_before_refusing_anyone(tmp_path, monkeypatch):
    engine = public_engine(tmp_path)
    with access.acting_as(access.HOST):
        host_run = done_event(generate.run(generate.GenerateRequest("a photo of a host", n=4), engine)).run_id
    with access.acting_as(A):
        old = done_event(generate.run(generate.GenerateRequest("a photo of a mason", n=8), engine)).run_id
    engine.store.quota_bytes = engine.store.usage()["total_bytes"] - 1
    with access.acting_as(B):    # A's run is fresh: nothing may go, so B is refused
        with pytest.raises(StoreError, match="store is full"):
            events_of(generate.run(generate.GenerateRequest("a photo of a clerk", n=2), engine))
    monkeypatch.setattr("engine.hosting.storage.IDLE_S", 0)   # ... an hour later, A's run is idle
    with access.acting_as(B):
        done_event(generate.run(generate.GenerateRequest("a photo of a clerk", n=2), engine))
    with access.acting_as(access.HOST):
        assert engine.store.get_run(old) is None and engine.store.get_run(host_run) is not None


def test_a_visitors_run_keeps_results_up_to_the_public_cap(tmp_path):
    engine = public_engine(tmp_path)
    with access.acting_as(A):
        run = done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=2), engine))
        with pytest.raises(InputError, match="a public GapLens keeps at most 8 MiB per run"):
            engine.store.update_run(run.run_id, results={"blob": "x" * (MAX_PUBLIC_RESULTS_BYTES + 1)})


# -- bounded inputs ----------------------------------------------------------------------------------
def test_a_search_is_bounded_at_the_text_limit(tmp_path):
    engine = public_engine(tmp_path)
    with pytest.raises(InputError, match="the search is 1001 characters long; the maximum is 1000"):
        runs.list_page(engine.store, search="a" * 1001)


def _bomb(path, member: str, mib: int, level=zipfile.ZIP_DEFLATED) -> str:
    with zipfile.ZipFile(path, "w", level) as zf:
        with zf.open(member, "w", force_zip64=True) as f:
            chunk = b" " * 2**20
            for _ in range(mib):
                f.write(chunk)
    return str(path)


@pytest.mark.slow
def test_study_packs_are_bounded_before_anything_is_inflated(tmp_path):
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="looks like a zip bomb"):
            study.load_key(_bomb(tmp_path / "bomb.zip", "researcher/answer_key.json", 200))
        with pytest.raises(InputError, match="answer key unpacks to 6 MiB; a GapLens key is at most 4 MiB"):
            study.load_key(_bomb(tmp_path / "big.zip", "researcher/answer_key.json", 6, zipfile.ZIP_STORED))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    key = tmp_path / "answer_key.json"
    key.write_bytes(b"{" + b" " * (5 * 2**20) + b"}")
    with pytest.raises(InputError, match="is 5 MiB; a GapLens answer key is at most 4 MiB"):
        study.load_key(key)


def _key(kind: str, sets: int, options=None) -> dict:
    ids = [f"S{i}" for i in range(sets)]
    info = {"run_id": "r", "label": "", "prompt": "p", "method": "generate", "generator": "g",
            "auto_score": None, "auto_score_name": "x"}
    items = ([{"item": f"Q{i}", "kind": "trial", "sets": [s], "expected": None} for i, s in enumerate(ids)]
             if kind == "rating" else
             [{"item": f"Q{i}", "kind": "trial", "sets": [ids[i], ids[(i + 1) % sets]], "expected": None}
              for i in range(sets)])
    return {"format": study.KEY_FORMAT, "question_type": kind, "axis": "gender", "question": "q",
            "options": options or study.QUESTION_OPTIONS[kind], "sets": {s: dict(info) for s in ids},
            "forms": [{"form": 1, "items": items}]}


@pytest.mark.slow
def test_a_key_with_8000_options_is_refused_and_an_8000_set_study_answers_in_linear_memory(tmp_path):
    crafted = _key("rating", 2, options=[str(i) for i in range(8000)])
    with pytest.raises(InputError, match="answer key is damaged: a rating question's options are 1, 2, 3, 4, 5"):
        study.load_key(json.dumps(crafted))
    # 8,000 sets, 8,000 raters each choosing differently: the alpha's values are the 8,000 set ids
    key = study.load_key(json.dumps(_key("pair", 8000)))
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(study.ANSWER_COLUMNS)
    for i in range(8000):   # two raters who never agree: each set wins once and loses once
        writer.writerow(["L", 1, 1, f"Q{i}", "", "", "left", 1])
        writer.writerow(["R", 1, 1, f"Q{i}", "", "", "right", 1])
    result = {}
    tracemalloc.start()
    worker = threading.Thread(target=lambda: result.update(study.analyse(key, [out.getvalue()])))
    worker.start()
    worker.join(120)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not worker.is_alive(), "the analysis of 8,000 sets did not finish"
    expected = (16000**2 - 8000 * 2**2) / (16000 * 15999)   # D_o = 1; D_e = (n² − Σ n_c²) / (n(n − 1)), n = 16,000
    assert result["agreement"]["units"] == 8000 and result["agreement"]["alpha"] == pytest.approx(1 - 1 / expected)
    assert peak < 200 * 2**20   # the quadratic version needed an 8000² matrix (0.5 GB) and more


def test_answer_files_are_bounded_by_bytes_rows_and_participants(tmp_path, monkeypatch):
    big = tmp_path / "big.csv"
    big.write_bytes(b"participant,item,answer\n" + b"p,q,1\n" * (6 * 2**20))
    with pytest.raises(InputError, match="the answer files are 36 MiB together; at most 32 MiB"):
        study.read_answers([big])
    monkeypatch.setattr(study, "MAX_ANSWER_ROWS", 10)
    with pytest.raises(InputError, match="more than 10 rows"):
        study.parse_answers("participant,item,answer\n" + "p,q,1\n" * 11)
    with pytest.raises(InputError, match="a cell over 1000 characters"):
        study.parse_answers("participant,item,answer\n" + "p,q," + "1" * 1001 + "\n")


def _alpha_by_matrix(units, level):
    """Krippendorff's alpha straight from the coincidence matrix and the metric (the definition)."""
    units = [u for u in units if len(u) >= 2]
    values = sorted({v for u in units for v in u})
    index = {v: i for i, v in enumerate(values)}
    o = np.zeros((len(values), len(values)))
    for u in units:
        for i, j in itertools.permutations(range(len(u)), 2):
            o[index[u[i]], index[u[j]]] += 1 / (len(u) - 1)
    n_c, x = o.sum(1), np.asarray(values, float)
    n = n_c.sum()
    if level == "nominal":
        delta = 1 - np.eye(len(values))
    elif level == "interval":
        delta = (x[:, None] - x[None, :]) ** 2
    else:
        lo, hi = np.minimum.outer(range(len(values)), range(len(values))), np.maximum.outer(range(len(values)),
                                                                                             range(len(values)))
        cum = np.concatenate([[0], np.cumsum(n_c)])
        delta = (cum[hi + 1] - cum[lo] - (n_c[:, None] + n_c[None, :]) / 2) ** 2
    return 1 - ((o * delta).sum() / n) / ((np.outer(n_c, n_c) * delta).sum() / (n * (n - 1)))


@pytest.mark.parametrize("level", ["nominal", "interval", "ordinal"])
def test_linear_alpha_equals_the_coincidence_matrix_definition(level):
    rng = random.Random(level)
    for _ in range(20):
        units = [[rng.randint(1, 6) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(3, 30))]
        if len({v for u in units if len(u) > 1 for v in u}) < 2:
            continue
        assert study.krippendorff_alpha(units, level) == pytest.approx(_alpha_by_matrix(units, level), abs=1e-9)
    assert math.isnan(study.krippendorff_alpha([[1, 1], [1, 1]], level))


def test_exports_are_charged_the_bytes_their_runs_hold(tmp_path):
    engine = public_engine(tmp_path, hourly_export_mb=1)
    with access.acting_as(A):
        run = done_event(generate.run(generate.GenerateRequest("a photo of a cook", n=4), engine))
        size = engine.store.runs_usage([run.run_id])
        assert 0 < size < 2**20 and size == engine.store.visitor_usage(A.id)
        for _ in range(2**20 // size):
            engine.charge(what="export zip", export_bytes=size)
        with pytest.raises(OverBudgetError, match=r"each visitor may export 1 MiB per hour; 0 are left this hour and "
                                                  r"this request needs up to 1"):
            engine.charge(what="export zip", export_bytes=size)
