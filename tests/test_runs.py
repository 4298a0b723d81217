"""Run history (engine/runs/history.py), export/import (engine/report/export.py) and the CLI `runs` commands."""
import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from engine.runs import imports, history as runs
from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.methods import generate, single_prompt
from engine.report import export
from engine.report import runs as runs_page

from runhelpers import done_event


def _single(engine, prompt, n=8, **kw):
    kw.setdefault("n_boot", 100)
    return done_event(single_prompt.run(single_prompt.SinglePromptRequest(prompt, n=n, **kw), engine)).run_id


def _generate(engine, prompt, n=4):
    return done_event(generate.run(generate.GenerateRequest(prompt, n=n), engine)).run_id


def _image_bytes(store, run_id):
    run = store.get_run(run_id)
    found = store.get_images([r["image_key"] for r in run["images"]])
    return {k: Path(r.path).read_bytes() for k, r in found.items()}


def test_export_delete_import_reopens_identical(engine, tmp_path):
    sp = _single(engine, "a photo of a doctor", n=8)
    gen = _generate(engine, "a photo of a doctor", n=4)  # shares seeds 0-3 with the Single Prompt run
    store = engine.store
    raw_before = store.run_rows([sp])[0]
    run_before = store.get_run(sp)
    bytes_before = _image_bytes(store, sp)
    html_before = runs_page.open_run(store, sp)["html"]
    answers_before = {k: store.answers_for_image(k) for k in bytes_before}
    assert len(bytes_before) == 8 and all(answers_before.values())

    manifest = export.export_zip(store, [sp], tmp_path / "sp.zip")
    assert manifest["counts"]["images"] == 8

    removed = runs.delete_runs(store, [sp])
    assert removed["runs"] == 1 and removed["images"] == 4  # the 4 the Generate run uses stay
    assert store.get_run(sp) is None and store.count("images") == 4
    assert store.get_run(gen) is not None and len(_image_bytes(store, gen)) == 4
    gone = [k for k in bytes_before if k not in _image_bytes(store, gen)]
    assert len(gone) == 4 and all(not store.answers_for_image(k) for k in gone)
    assert not any(store.image_path_for(k).exists() for k in gone)

    report = imports.import_zip(store, tmp_path / "sp.zip", trust=True)  # our own archive: trusted
    assert report["imported"] == [sp] and report["images_added"] == 4 and report["images_present"] == 4
    raw_after = store.run_rows([sp])[0]
    assert json.loads(raw_after.pop("models")) == {k: runs.short_model(v) for k, v in
                                                   json.loads(raw_before.pop("models")).items()}  # no host paths
    process = ("pid", "host", "cost", "ended")  # who ran it where, and when it ended it: not exported
    assert {k: v for k, v in raw_after.items() if k not in process} == \
        {k: v for k, v in raw_before.items() if k not in process}            # the same results JSON, byte for byte
    run_before["models"] = {k: runs.short_model(v) for k, v in run_before["models"].items()}
    assert store.get_run(sp) == run_before
    assert _image_bytes(store, sp) == bytes_before           # the same image bytes
    assert {k: store.answers_for_image(k) for k in bytes_before} == answers_before
    assert runs_page.open_run(store, sp)["html"] == html_before
    assert imports.import_zip(store, tmp_path / "sp.zip")["skipped"] == [sp]  # importing twice is a no-op

    # Into another store: same run, images found at that store's own paths.
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    report = imports.import_zip(other.store, tmp_path / "sp.zip", trust=True)
    assert report["imported"] == [sp] and report["paths_rewritten"] == 8
    moved = other.store.get_run(sp)
    assert {k: moved[k] for k in ("request", "summary", "models", "created", "images")} == \
        {k: run_before[k] for k in ("request", "summary", "models", "created", "images")}
    assert moved["results"]["axes"] == run_before["results"]["axes"]
    assert all(str(other.store.data_dir) in i["path"] for i in moved["results"]["images"])
    assert _image_bytes(other.store, sp) == bytes_before
    assert runs_page.open_run(other.store, sp)["html"] == html_before
    # ...and a rerun of the same request there is served entirely from the imported caches.
    _single(other, "a photo of a doctor", n=8)
    assert other.stats.images_generated == 0 and other.stats.answers_computed == 0
    assert other.stats.embeddings_computed == 0


@pytest.mark.slow
def test_zip_is_an_imagefolder_dataset(engine, tmp_path):
    ids = [_single(engine, "a photo of a nurse", n=6), _generate(engine, "a photo of a nurse", n=8)]
    export.export_zip(engine.store, ids, tmp_path / "x.zip")
    with zipfile.ZipFile(tmp_path / "x.zip") as zf:
        names = set(zf.namelist())
        rows = [json.loads(line) for line in zf.read("metadata.jsonl").decode().splitlines()]
        # imagefolder: one metadata file next to (above) the images, a relative file_name per row
        assert [n for n in names if n.rsplit("/", 1)[-1].startswith("metadata.")] == ["metadata.jsonl"]
        assert len(rows) == 6 + 8
        assert all(list(r) == export.METADATA_COLUMNS for r in rows)  # the same columns in every row
        for r in rows:
            assert r["file_name"].startswith("images/") and ".." not in r["file_name"]
            assert hashlib.sha256(zf.read(r["file_name"])).hexdigest() == r["sha256"]
        assert {r["run_id"] for r in rows} == set(ids)
        sp_rows = [r for r in rows if r["method"] == "single_prompt"]
        assert all(any(a["question"].startswith("What is the gender") for a in r["vqa"]) for r in sp_rows)
        images = {n for n in names if n.endswith(".png")}
        assert images == {r["file_name"] for r in rows} and len(images) == 8  # shared images stored once
        assert {"gaplens/manifest.json", "gaplens/runs.jsonl", "scores.csv", "scores.json", "report.html",
                "README.md"} <= names
    try:  # the real loader, when the datasets library happens to be installed (it is not a dependency)
        import datasets  # noqa: F401
    except ImportError:
        return
    ds = datasets.load_dataset("imagefolder", data_files=str(tmp_path / "x.zip"), cache_dir=str(tmp_path / "c"))
    assert ds["train"].num_rows == 14 and ds["train"][0]["image"].size == (128, 128)


def test_scores_csv_and_json_hold_every_score_with_its_interval(engine):
    sp = _single(engine, "a photo of a firefighter", n=8)
    gen = _generate(engine, "a red balloon", n=2)
    rows = list(csv.DictReader(io.StringIO(export.scores_csv(engine.store, [sp, gen]))))
    assert list(rows[0]) == export.CSV_COLUMNS
    results = engine.store.get_run(sp)["results"]
    cbs = next(r for r in rows if r["run_id"] == sp and r["group"] == "gender" and r["metric"] == "composite_bias_score")
    assert float(cbs["value"]) == pytest.approx(results["axes"]["gender"]["composite_bias_score"])
    assert [float(cbs["ci_low"]), float(cbs["ci_high"])] == pytest.approx(results["axes"]["gender"]["ci"]["composite_bias_score"])
    assert any(r["metric"] == "share: male" for r in rows)
    assert any(r["group"] == "diversity" and r["metric"] == "vendi" for r in rows)
    assert any(r["group"] == "gap" and r["metric"] == "score" for r in rows)
    assert any(r["run_id"] == gen and r["metric"] == "n" and float(r["value"]) == 2 for r in rows)
    doc = export.scores_json(engine.store, [sp, gen])
    assert [r["id"] for r in doc["runs"]] == [sp, gen]
    assert str(engine.store.data_dir) not in json.dumps(doc)  # no host paths: images are named inside the store
    for image in results["images"]:
        image["path"] = "images/" + Path(image["path"]).relative_to(engine.store.image_dir).as_posix()
    assert doc["runs"][0]["results"] == results and len(doc["runs"][0]["scores"]) == \
        sum(r["run_id"] == sp for r in rows)


def test_list_search_sort_and_filter(engine):
    a = _single(engine, "a photo of a nurse", n=8)
    b = _single(engine, "a photo of a mechanic", n=8)
    c = _generate(engine, "a photo of a nurse", n=2)
    stream = generate.run(generate.GenerateRequest("a photo of a chef", n=4), engine)
    next(stream)
    stream.close()  # a stopped run
    rows = runs.list_runs(engine.store)
    assert [r["id"] for r in rows][1:] == [c, b, a]  # newest first
    assert {r["status"] for r in rows} == {"done", "stopped"}
    assert [r["id"] for r in runs.list_runs(engine.store, search="nurse")] == [c, a]
    assert [r["id"] for r in runs.list_runs(engine.store, search="NURSE single")] == [a]
    assert [r["id"] for r in runs.list_runs(engine.store, method="generate", status="done")] == [c]
    assert [r["prompt"] for r in runs.list_runs(engine.store, status="stopped")] == ["a photo of a chef"]
    by_score = [r for r in runs.list_runs(engine.store, method="single_prompt", sort="score")]
    assert by_score[0]["score"] >= by_score[1]["score"]
    assert "max Composite Bias Score" in by_score[0]["headline"] and by_score[0]["generator"].startswith("synthetic")
    assert [r["prompt"] for r in runs.list_runs(engine.store, sort="prompt")][0] == "a photo of a chef"
    with pytest.raises(InputError, match="unknown sort"):
        runs.list_runs(engine.store, sort="size")
    with pytest.raises(InputError, match="no run"):
        runs_page.open_run(engine.store, "no-such-run")


def test_compare_single_prompt_runs_side_by_side(engine):
    a = _single(engine, "a photo of a teacher", n=12)
    b = _single(engine, "a photo of a mechanic", n=12)
    comparison = runs.compare_runs(engine.store, [a, b])
    assert comparison["method"] == "single_prompt" and not comparison["note"]
    row = next(r for r in comparison["rows"] if r["group"] == "gender" and r["metric"] == "share: male")
    va, vb = row["values"]
    diff = row["differences"][0]
    assert diff["value"] == pytest.approx(vb["value"] - va["value"])
    assert va["low"] is not None and diff["low"] < diff["value"] < diff["high"]
    html = runs_page.compare_html(comparison, engine.store)
    assert html.count('data-chart="axis-gender"') == 2  # the two distributions side by side
    assert html.count("<img") == 24 and "B − A" in html
    with pytest.raises(InputError, match="at least two"):
        runs.compare_runs(engine.store, [a])


def test_methods_without_a_scorer_or_renderer_fall_back_to_their_numbers(engine):
    """Counterfactuals/intersectional/mine/mitigate runs are compared and rendered from their
    flattened numbers until they register a scorer and a renderer."""
    store = engine.store

    def fake(cas, mad_low):
        run_id = store.create_run("counterfactuals_demo", {"prompt": "a photo of a ceo"}, {"generator": "x:y"}, "0")
        results = {"prompt": "a photo of a ceo",
                   "axes": [{"name": "gender", "mad": {"value": 0.4, "low": mad_low, "high": 0.6}},
                            {"name": "age", "mad": {"value": 0.2, "low": 0.1, "high": 0.3}}],
                   "cas": {"mean": cas, "ci": {"mean": [cas - 0.1, cas + 0.1]}, "per_prompt": [0.1, 0.2, cas]},
                   "mad": {"gender": 0.3, "age": 0.1}, "mad_ci": {"gender": [0.2, 0.4], "age": [0.0, 0.2]},
                   "sensitivity": {"axes": ["gender", "age"], "matrix": [[1.0, cas], [0.0, 1.0]],
                                   "ci_low": [[1.0, 0.1], [-0.2, 1.0]], "ci_high": [[1.0, 0.9], [0.2, 1.0]]},
                   "images": [{"path": "/nowhere", "seed": 1}], "note": "text is skipped"}
        store.update_run(run_id, status="done", results=results, summary={"mean_cas": cas, "seconds": 3})
        return run_id

    a, b = fake(0.5, 0.3), fake(0.8, 0.35)
    rows = {s.name: s for s in runs.scores(store.get_run(a))}
    assert rows["axes[gender] / mad"].low == 0.3 and rows["cas / mean"].high == pytest.approx(0.6)
    assert "summary / mean_cas" in rows and "cas / per_prompt[2]" in rows
    assert (rows["mad / gender"].low, rows["mad / gender"].high) == (0.2, 0.4)  # parallel "<name>_ci" dict
    cell = rows["sensitivity / matrix[gender → age]"]                        # labelled matrix + ci_low/ci_high
    assert (cell.value, cell.low, cell.high) == (0.5, 0.1, 0.9)
    assert not any("seconds" in name or "images" in name for name in rows)
    comparison = runs.compare_runs(store, [a, b])
    mean = next(r for r in comparison["rows"] if r["group"] == "cas" and r["metric"] == "mean")
    assert mean["differences"][0]["value"] == pytest.approx(0.3)
    assert mean["differences"][0]["significant"] is True
    html = runs_page.open_run(store, a)["html"]
    assert "generic-scores" in html and "axes[gender]" in html and "All results (JSON)" in html
    # Different methods: only the summaries are compared.
    sp = _single(engine, "a photo of a ceo", n=4)
    mixed = runs.compare_runs(store, [a, sp])
    assert mixed["method"] is None and "different methods" in mixed["note"]


def test_cli_lists_shows_exports_deletes_and_imports(engine, tmp_path, capsys):
    from engine.__main__ import main

    data = str(engine.store.data_dir)
    assert main(["generate", "--preset", "synthetic", "--data-dir", data, "--prompt", "a photo of a chef",
                 "-n", "3", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["runs", "list", "--data-dir", data, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == 1 and listed[0]["method"] == "generate" and listed[0]["prompt"] == "a photo of a chef"
    run_id = listed[0]["id"]
    assert main(["runs", "show", run_id, "--data-dir", data, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == run_id
    out = tmp_path / "out"
    assert main(["runs", "export", run_id, "--data-dir", data, "--format", "all", "--out", str(out)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in written) == sorted(f"{run_id}.{e}" for e in ("scores.json", "scores.csv",
                                                                                      "zip", "html"))
    assert main(["runs", "delete", run_id, "--data-dir", data]) == 0
    assert main(["runs", "list", "--data-dir", data, "--json"]) == 0
    assert "deleted 1 run" in capsys.readouterr().out
    assert main(["runs", "import", str(out / f"{run_id}.zip"), "--data-dir", data, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == [run_id]
    assert main(["runs", "show", "no-such-run", "--data-dir", data]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


def test_damaged_or_foreign_zips_are_clear_errors_and_write_nothing(engine, tmp_path):
    sp = _generate(engine, "a photo of a judge", n=2)
    export.export_zip(engine.store, [sp], tmp_path / "ok.zip")
    with pytest.raises(InputError, match="not a readable zip"):
        imports.import_zip(engine.store, tmp_path / "missing.zip")
    plain = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(InputError, match="not a GapLens export"):
        imports.import_zip(engine.store, plain)
    # An image key that tries to name a path outside the store is refused before anything is written.
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(tmp_path / "ok.zip") as src, zipfile.ZipFile(evil, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name in ("gaplens/images.jsonl", "gaplens/run_images.jsonl"):
                rows = [json.loads(line) for line in data.decode().splitlines()]
                for r in rows:
                    for field in ("key", "image_key"):
                        if field in r:
                            r[field] = "../../escaped"
                data = "".join(json.dumps(r) + "\n" for r in rows).encode()
            dst.writestr(name, data)
    runs.delete_runs(engine.store, [sp])
    with pytest.raises(InputError, match="expected a key"):
        imports.import_zip(engine.store, evil)
    assert engine.store.get_run(sp) is None and not list(tmp_path.glob("**/escaped*"))
