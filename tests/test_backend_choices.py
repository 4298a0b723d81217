"""Public mode in the engine (issue 26): a visitor's request names only the backends the host
offers and no file, refusals say nothing about what exists, and what a run's results name
(an imported archive's words) never reaches other visitors' images, embeddings or runs.
The same through the app: tests/test_app_public_reach.py."""
import json
import zipfile

import pytest

from engine.common import access
from engine.hosting import backend_choices
from engine.runs import imports
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.common.errors import InputError, ModelLoadError, NotAllowedError
from engine.common.events import Done
from engine.hosting.limits import Budget
from engine.methods import compare_models, mine, mitigate, single_prompt, validate
from engine.models.presets import PRESETS, SYNTHETIC_TABLE
from engine.report import export
from engine.store.store import is_key

A, B = access.Visitor("session:a"), access.Visitor("session:b")
OFFERED_PATH = "/models/private-sd"


def _done(events) -> Done:
    return [e for e in events if isinstance(e, Done)][0]


def _public(tmp_path, **options) -> Engine:
    return Engine("synthetic", data_dir=str(tmp_path / "store"), public=True, max_images=64,
                  budget=Budget(hourly_images=10**6), **options)


def _compare(engine, *generators):
    request = compare_models.CompareModelsRequest("single_prompt", list(generators),
                                                  {"prompt": "a photo of a cat", "n": 2, "axes": ["gender"],
                                                   "n_boot": 100})
    return list(compare_models.run(request, engine))


@pytest.mark.slow
def test_a_researchers_own_gaplens_still_takes_any_backend(engine, tmp_path):
    """Local mode: nothing changes; a folder, a path or a server is the user's to name."""
    assert backend_choices.resolve(engine, "generator", "folder:/no/such/dir") == ModelSpec("folder", "/no/such/dir")
    assert backend_choices.resolve(engine, "generator", "sd15") == PRESETS["sd15"].generator
    assert backend_choices.resolve(engine, "vqa", "clip_vqa:synthetic") == ModelSpec("clip_vqa", "synthetic")
    with pytest.raises(ModelLoadError, match="no such folder"):   # the backend's own words, path included
        _compare(engine, "synthetic", "folder:/no/such/dir")


def test_a_visitor_picks_only_what_the_host_offers_under_labels_without_host_paths(tmp_path):
    engine = _public(tmp_path, public_generators=f"private-sd=diffusers:{OFFERED_PATH}, openai:http://10.0.0.5:8000/v1?x=1",
                     public_evaluators="clip_vqa:synthetic")
    with access.acting_as(A):
        generators = backend_choices.offered(engine, "generator")
        assert list(generators)[:len(PRESETS)] == list(PRESETS)
        assert generators["private-sd"] == ModelSpec("diffusers", OFFERED_PATH)
        assert ModelSpec("openai_images", "http://10.0.0.5:8000/v1?x=1") in generators.values()
        assert not any(OFFERED_PATH in label for label in generators)
        evaluators = backend_choices.offered(engine, "vqa")
        assert evaluators["clip_vqa:synthetic"] == ModelSpec("clip_vqa", "synthetic")
        assert "synthetic_vqa:synthetic_world.json" in evaluators   # the preset's, its path cut

        refusals = set()
        for name in ("folder:/etc", "folder:/no/such/dir", f"diffusers:{OFFERED_PATH}", "openai:http://127.0.0.1:9/v1",
                     "hf-dataset:someone/data", ""):
            with pytest.raises(NotAllowedError) as refused:
                backend_choices.resolve(engine, "generator", name)
            refusals.add(str(refused.value))
        (refusal,) = refusals   # one sentence, whatever was named (the offered spec itself included)
        assert "private-sd" in refusal and OFFERED_PATH not in refusal and str(engine.store.data_dir) not in refusal
        with pytest.raises(NotAllowedError):
            backend_choices.resolve(engine, "vqa", ModelSpec("labels", "/etc/passwd"))
        assert backend_choices.resolve(engine, "vqa", ModelSpec("clip_vqa", "synthetic")) == ModelSpec("clip_vqa", "synthetic")

        # refused where the request is admitted: before any run, model or file
        runs_before = engine.store.count("runs")
        with pytest.raises(NotAllowedError, match="offers these generators"):
            _compare(engine, "synthetic", "folder:/etc")
        with pytest.raises(NotAllowedError, match="reads and writes no file"):
            engine.admit("mitigate", mitigate.MitigateRequest("a photo of a cat", export=str(tmp_path / "x.json")),
                         mitigate.estimate)
        assert engine.store.count("runs") == runs_before and engine.models.loaded() == []
        run_id = _done(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=4, gap=False,
                                                                           n_boot=100), engine)).run_id
        with pytest.raises(NotAllowedError, match="offers these evaluators"):
            validate.compare_evaluators(engine, run_id, "labels:/etc/passwd")
        assert validate.compare_evaluators(engine, run_id, "clip_vqa:synthetic")["second"] == "clip_vqa:synthetic"
    with access.acting_as(access.HOST):   # the host may name anything, as on their own machine
        assert backend_choices.resolve(engine, "generator", "folder:/etc") == ModelSpec("folder", "/etc")


@pytest.mark.slow
def test_a_model_the_host_offers_from_a_path_runs_and_its_path_stays_home(tmp_path):
    world = tmp_path / "host-only" / "world.json"
    world.parent.mkdir()
    world.write_text(open(SYNTHETIC_TABLE).read())
    engine = _public(tmp_path, public_generators=f"world-copy=synthetic_generator:{world}")
    with access.acting_as(A):
        done = _done(_compare(engine, "synthetic", "world-copy"))
        assert done.results["generators"] == ["synthetic", "world-copy"]
        export.export_files(engine.store, [done.run_id, *done.results["runs"]], "all", tmp_path / "out")
    written = [p.read_bytes() for p in (tmp_path / "out").iterdir()]
    (archive,) = (tmp_path / "out").glob("*.zip")
    with zipfile.ZipFile(archive) as zf:
        written += [zf.read(name) for name in zf.namelist() if name.endswith((".json", ".jsonl", ".html", ".csv"))]
    assert str(world.parent) not in json.dumps(done.results) and not any(str(world.parent).encode() in w for w in written)


def test_a_host_allow_list_is_checked_when_the_app_starts(tmp_path):
    assert backend_choices.parse_allow_list("a=openai:http://h/v1?k=v, synthetic_generator:x", "generator") == [
        ("a", ModelSpec("openai_images", "http://h/v1?k=v")), ("", ModelSpec("synthetic_generator", "x"))]
    with pytest.raises(InputError, match="must look like 'backend:model"):
        _public(tmp_path, public_evaluators="not-a-spec")


def test_refusals_read_the_same_for_another_visitors_run_and_a_missing_one(tmp_path):
    engine = _public(tmp_path)
    with access.acting_as(A):
        theirs = _done(mine.run(mine.MineRequest(iterations=1, population=2, select=1, mutations=1, n=2), engine)).run_id
    missing = "20000101-000000-abcdef"
    with access.acting_as(B):
        for call in (lambda r: engine.store.require_run(r), lambda r: mine.load_resumable(engine, r),
                     lambda r: validate.validate_run(engine.store, r)):
            texts = []
            for run_id in (theirs, missing):
                with pytest.raises(InputError) as refused:
                    call(run_id)
                texts.append(str(refused.value).replace(run_id, "ID"))
            assert texts[0] == texts[1] and str(engine.store.data_dir) not in texts[0]
    local = Engine("synthetic", data_dir=str(tmp_path / "local"))
    with pytest.raises(InputError, match="in the store at .*local"):   # the researcher is told where they looked
        mine.load_resumable(local, missing)


def test_a_visitors_import_never_tells_which_run_ids_exist(tmp_path):
    engine = _public(tmp_path)
    with access.acting_as(A):
        theirs = _done(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a cook", n=2, gap=False,
                                                                           n_boot=100), engine)).run_id
    with access.acting_as(B):
        mine_id = _done(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a cook", n=2, gap=False,
                                                                            n_boot=100), engine)).run_id
        archive = tmp_path / "b.zip"
        export.export_zip(engine.store, [mine_id], archive)
        for wanted in (theirs, "20000101-000000-abcdef"):   # an id that exists (A's) and one that does not
            crafted = tmp_path / f"{wanted}.zip"
            with zipfile.ZipFile(archive) as zin, zipfile.ZipFile(crafted, "w") as zout:
                for item in zin.infolist():
                    zout.writestr(item, zin.read(item).replace(mine_id.encode(), wanted.encode()))
            report = imports.import_zip(engine.store, crafted)
            assert list(report["renamed"]) == [wanted] and report["imported"] != [wanted]
        assert imports.import_zip(engine.store, archive)["skipped"] == [mine_id]   # B's own: already there
    with access.acting_as(A):
        assert engine.store.get_run(theirs)["results"]["prompt"] == "a photo of a cook"


def test_what_a_runs_results_name_never_reaches_other_images(tmp_path):
    """Spot-checks and a mined prompt's images read what the run holds; a visitor's export carries
    no text embedding an imported run's results name."""
    engine = _public(tmp_path)
    with access.acting_as(A):
        a_mine = _done(mine.run(mine.MineRequest(iterations=1, population=2, select=1, mutations=1, n=2), engine))
        node = a_mine.results["archive"][0]["id"]
        assert mine.prompt_details(engine, a_mine.results, node, a_mine.run_id)["images"]
        a_sp = _done(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a nurse", n=4, n_boot=100),
                                       engine))
        a_text = a_sp.results["gap"]["variations"][0]
    with access.acting_as(B):
        b_sp = _done(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=4, gap=False,
                                                                         n_boot=100), engine))
        # A's results replayed under B's run id: the keys they name are not B's run's images
        assert mine.prompt_details(engine, a_mine.results, node, b_sp.run_id)["images"] == []
        run = engine.store.get_run(b_sp.run_id)
        planted = {**run, "results": {**run["results"], "images": a_sp.results["images"] + run["results"]["images"],
                                      "axes": {k: {**m, "labels": a_sp.results["axes"][k]["labels"] + m["labels"]}
                                               for k, m in run["results"]["axes"].items()}}}
        held = {link["image_key"] for link in run["images"]}
        assert all(set(item.keys) <= held and len(item.keys) == 4 for item in validate.checkable_axes(planted).values())
        # an imported run whose results name A's text: B's export of it carries no embedding of it
        archive, crafted = tmp_path / "b.zip", tmp_path / "crafted.zip"
        export.export_zip(engine.store, [b_sp.run_id], archive)
        with zipfile.ZipFile(archive) as zin, zipfile.ZipFile(crafted, "w") as zout:
            for item in zin.infolist():
                data = zin.read(item).replace(b_sp.run_id.encode(), b"crafted")
                if item.filename == "gaplens/runs.jsonl":
                    row = json.loads(data)
                    row["results"] = json.dumps({**json.loads(row["results"]), "planted": [a_text]})
                    data = json.dumps(row).encode()
                zout.writestr(item, data)
        (imported,) = imports.import_zip(engine.store, crafted)["imported"]
        assert export._embedded_texts(engine.store, [engine.store.get_run(imported)]) == []
        own = export._embedded_texts(engine.store, [engine.store.get_run(b_sp.run_id)])
        assert own and a_text not in own and not any(is_key(t) for t in own)
    with access.acting_as(access.HOST):   # the host's export of the same run keeps its texts, as before
        assert a_text in export._embedded_texts(engine.store, [engine.store.get_run(imported)])
