"""Safe to host (issue 13): untrusted imports, names on disk, visitors, budgets, a healthy store,
and what the HTTP server serves."""
import errno
import hashlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from engine.common import access
from engine.models import sources
from engine.runs import imports, history as runs
from engine.core.engine import Engine
from engine.common.errors import InputError, NotAllowedError, OverBudgetError, StoreError
from engine.common.events import Done
from engine.hosting.limits import Budget
from engine.methods import generate, single_prompt
from engine.report import export
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent


def _generate(engine, prompt, n=4, **kw):
    return [e for e in generate.run(generate.GenerateRequest(prompt, n=n, **kw), engine)
            if isinstance(e, Done)][0]


def _tamper(src: Path, dst: Path, files: dict | None = None, rows: dict | None = None) -> None:
    """Copy a zip, replacing whole entries (`files`: name -> bytes) and editing JSON-lines
    entries (`rows`: name -> fn(list of row dicts), which changes them in place)."""
    files, rows = files or {}, rows or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            data = files.get(name, zin.read(name))
            if name in rows:
                edited = _jsonl(data)
                rows[name](edited)
                data = "".join(json.dumps(r) + "\n" for r in edited).encode()
            zout.writestr(name, data)


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _pixels(path) -> bytes:
    with Image.open(path) as im:
        return im.convert("RGB").tobytes()


# -- untrusted imports ----------------------------------------------------------------------
def test_an_archive_with_swapped_images_and_rewritten_checksums_does_not_poison_the_cache(engine, tmp_path, capsys):
    done = _generate(engine, "a photo of a nurse", n=4)
    honest = {r["seed"]: _pixels(r["path"]) for r in done.results["images"]}
    assert honest[0] != honest[1]
    export.export_zip(engine.store, [done.run_id], tmp_path / "honest.zip")
    # The attack: image files of seeds 0 and 1 trade bytes; every checksum is rewritten to agree.
    rows = _jsonl(zipfile.ZipFile(tmp_path / "honest.zip").read("gaplens/images.jsonl"))
    by_seed = {r["seed"]: r for r in rows}
    k0, k1 = by_seed[0]["key"], by_seed[1]["key"]
    with zipfile.ZipFile(tmp_path / "honest.zip") as zf:
        b0, b1 = zf.read(f"images/{k0}.png"), zf.read(f"images/{k1}.png")
    sha = {k0: hashlib.sha256(b1).hexdigest(), k1: hashlib.sha256(b0).hexdigest()}

    def agree(rows):
        for r in rows:
            if (r.get("key") or r.get("image_key")) in sha:
                r["sha256"] = sha[r.get("key") or r.get("image_key")]

    _tamper(tmp_path / "honest.zip", tmp_path / "poisoned.zip", files={f"images/{k0}.png": b1, f"images/{k1}.png": b0},
            rows={"gaplens/images.jsonl": agree, "metadata.jsonl": agree})

    victim = Engine("synthetic", data_dir=str(tmp_path / "victim"))
    report = imports.import_zip(victim.store, tmp_path / "poisoned.zip")
    assert report["imported"] == [done.run_id] and not report["trusted"]
    # The imported run keeps what it was given (planted bytes included), marked as imported...
    imported = victim.store.get_run(done.run_id)
    rows = victim.store.image_rows([link["image_key"] for link in imported["images"]])
    assert {r["provenance"] for r in rows} == {"imported"} and len(rows) == 4
    # ...but a new generation of the same prompt and seeds is made afresh, not served the plants.
    fresh = _generate(victim, "a photo of a nurse", n=4)
    assert victim.stats.image_cache_hits == 0 and victim.stats.images_generated == 4
    assert {r["seed"]: _pixels(r["path"]) for r in fresh.results["images"]} == honest
    assert runs.run_records(victim.store, runs.get_run(victim.store, done.run_id))  # the imported run still opens

    # An archive the user trusts (`runs import --trust`) does serve the cache.
    from engine.cli import main

    assert main(["runs", "import", str(tmp_path / "honest.zip"), "--trust", "--data-dir", str(tmp_path / "trusting"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trusted"] is True
    trusting = Engine("synthetic", data_dir=str(tmp_path / "trusting"))
    _generate(trusting, "a photo of a nurse", n=4)
    assert trusting.stats.images_generated == 0 and trusting.stats.image_cache_hits == 4


def _store_files(engine) -> list[Path]:
    return sorted(p for p in engine.store.image_dir.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_zip_bomb_is_refused_before_it_is_unpacked_and_nothing_is_written(engine, tmp_path):
    done = _generate(engine, "a photo of a pilot", n=2)
    export.export_zip(engine.store, [done.run_id], tmp_path / "ok.zip")
    _tamper(tmp_path / "ok.zip", tmp_path / "bomb.zip")
    with zipfile.ZipFile(tmp_path / "bomb.zip", "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("gaplens/padding.bin", bytes(64 * 2**20))  # 64 MiB of zeros: about 1000:1
    info = zipfile.ZipFile(tmp_path / "bomb.zip").getinfo("gaplens/padding.bin")
    assert info.file_size / info.compress_size > 500
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    with pytest.raises(InputError, match="zip bomb"):
        imports.import_zip(other.store, tmp_path / "bomb.zip")
    assert other.store.count("runs") == 0 and other.store.count("images") == 0 and not _store_files(other)


@pytest.mark.parametrize("side", [12_000, 5_000])  # above Pillow's own guard, and above GapLens' 4096² only
def test_a_pixel_bomb_image_is_refused_and_nothing_is_written(engine, tmp_path, side):
    done = _generate(engine, "a photo of a baker", n=2)
    export.export_zip(engine.store, [done.run_id], tmp_path / "ok.zip")
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, format="PNG")  # up to 144 megapixels, a few kB on disk
    bomb = buf.getvalue()
    key = _jsonl(zipfile.ZipFile(tmp_path / "ok.zip").read("gaplens/images.jsonl"))[0]["key"]
    _tamper(tmp_path / "ok.zip", tmp_path / "pixels.zip", files={f"images/{key}.png": bomb},
            rows={"gaplens/images.jsonl": lambda rows: [r.update(sha256=hashlib.sha256(bomb).hexdigest())
                                                        for r in rows if r["key"] == key]})
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    with pytest.raises(InputError, match="pixels"):
        imports.import_zip(other.store, tmp_path / "pixels.zip")
    assert other.store.count("runs") == 0 and not _store_files(other)


def test_rows_outside_the_schema_are_refused_before_anything_is_written(engine, tmp_path):
    done = _generate(engine, "a photo of a judge", n=2)
    export.export_zip(engine.store, [done.run_id], tmp_path / "ok.zip")
    _tamper(tmp_path / "ok.zip", tmp_path / "bad.zip", rows={"gaplens/runs.jsonl": lambda rows: rows[0].update(
        status="<script>")})
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    with pytest.raises(InputError, match="'status' is not valid"):
        imports.import_zip(other.store, tmp_path / "bad.zip")
    assert other.store.count("runs") == 0 and not _store_files(other)


@pytest.mark.parametrize("evil_id", ["../../../escaped", "..", "/tmp/escaped", "a/../../escaped", "x\\..\\escaped"])
def test_path_characters_in_imported_run_ids_never_write_outside_the_export_folder(engine, tmp_path, evil_id, capsys):
    done = _generate(engine, "a photo of a chef", n=2)
    export.export_zip(engine.store, [done.run_id], tmp_path / "ok.zip")
    _tamper(tmp_path / "ok.zip", tmp_path / "evil.zip",
            rows={"gaplens/runs.jsonl": lambda rows: [r.update(id=evil_id) for r in rows],
                  "gaplens/run_images.jsonl": lambda rows: [r.update(run_id=evil_id) for r in rows]})
    other = Engine("synthetic", data_dir=str(tmp_path / "work" / "store"))
    report = imports.import_zip(other.store, tmp_path / "evil.zip")
    new_id = report["renamed"][evil_id]
    assert report["imported"] == [new_id] and "/" not in new_id and "\\" not in new_id and not new_id.startswith(".")
    out = tmp_path / "work" / "exports"
    from engine.cli import main

    assert main(["runs", "export", new_id, "--data-dir", str(other.store.data_dir), "--format", "all",
                 "--out", str(out)]) == 0
    written = [Path(p) for p in capsys.readouterr().out.split()]
    assert len(written) == 4 and all(p.resolve().parent == out.resolve() for p in written)
    assert not list(tmp_path.rglob("*escaped*"))


def test_exports_carry_no_host_paths(engine, tmp_path):
    from engine.models.presets import ASSETS

    sp = [e for e in single_prompt.run(single_prompt.SinglePromptRequest("a photo of a poet", n=4, n_boot=100), engine)
          if isinstance(e, Done)][0].run_id
    written = export.export_files(engine.store, [sp], "all", tmp_path / "out")
    texts = [Path(p).read_bytes() for p in written]
    with zipfile.ZipFile(next(p for p in written if p.endswith(".zip"))) as zf:
        texts += [zf.read(n) for n in zf.namelist() if not n.startswith("images/")]
    for host_path in (str(engine.store.data_dir), str(ASSETS), str(tmp_path)):
        assert not [t for t in texts if host_path.encode() in t], host_path
    # ...and the archive still imports into another store, its images found there
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    imports.import_zip(other.store, next(p for p in written if p.endswith(".zip")))
    assert len(runs.run_records(other.store, runs.get_run(other.store, sp))) == 4
    assert all(Path(i["path"]).is_file() for i in other.store.get_run(sp)["results"]["images"])


# -- a healthy store ------------------------------------------------------------------------
def test_out_of_range_numbers_are_one_sentence_and_store_nothing(engine):
    for request, message in [
        (generate.GenerateRequest("a cat", n=2, seed=2**70), "between 0 and 4294967295"),
        (generate.GenerateRequest("a cat", n=4, seed=2**32 - 2), "between 0 and 4294967295"),
        (generate.GenerateRequest("a cat", n=2, steps=10**6), "steps must be between 1 and"),
        (generate.GenerateRequest("a cat", n=2, width=100_000), "multiple of 8"),
        (single_prompt.SinglePromptRequest("a cat", n=4, n_boot=0), "n_boot"),
        (generate.GenerateRequest("x" * 20_000_000, n=2), "characters long"),
    ]:
        method = generate.run if isinstance(request, generate.GenerateRequest) else single_prompt.run
        with pytest.raises(InputError, match=message):
            list(method(request, engine))
    assert engine.store.count("runs") == 0


@pytest.mark.slow
def test_a_run_whose_process_was_killed_is_marked_interrupted_at_start_up(tmp_path):
    data = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "generate", "--prompt", "a photo of a farmer", "-n", "50000",
                             "--max-images", "50000", "--preset", "synthetic", "--data-dir", str(data), "--quiet"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def running():
            try:
                with sqlite3.connect(data / "gaplens.sqlite") as db:
                    row = db.execute("SELECT id FROM runs WHERE status='running'").fetchone()
                    return row and db.execute("SELECT COUNT(*) FROM run_images").fetchone()[0] > 0 and row[0]
            except sqlite3.Error:
                return None
        run_id = wait_until(running, 120, "the generate run to start storing images")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    engine = Engine("synthetic", data_dir=str(data))
    run = engine.store.get_run(run_id)
    assert engine.store.interrupted == [run_id] and run["status"] == "interrupted" and "run it again" in run["error"]
    assert runs.list_runs(engine.store, status="interrupted")[0]["id"] == run_id
    assert not list(data.rglob("*.tmp"))  # no half-written image left behind by the kill
    # What it stored is kept and serves a rerun ("resume"): the images made before the kill are cache hits.
    made = len(run["images"])
    _generate(engine, "a photo of a farmer", n=min(made, 8))
    assert engine.stats.image_cache_hits == min(made, 8)


def test_a_run_of_another_host_is_left_alone_locally_and_interrupted_on_a_public_server(data_dir):
    engine = Engine("synthetic", data_dir=data_dir)
    run_id = engine.store.create_run("generate", {"prompt": "x"}, {}, "test")
    with engine.store._write() as db:   # as if another machine sharing the store were running it
        db.execute("UPDATE runs SET host='another-machine', pid=1 WHERE id=?", (run_id,))
    assert Engine("synthetic", data_dir=data_dir).store.get_run(run_id)["status"] == "running"
    restarted = Engine("synthetic", data_dir=data_dir, public=True)  # a Space restarts on a new host name
    assert restarted.store.interrupted == [run_id]


def test_gc_removes_least_recently_used_images_no_run_needs(engine):
    kept = _generate(engine, "a photo of a dentist", n=3)
    a = _generate(engine, "a photo of a welder", n=2)
    b = _generate(engine, "a photo of a tailor", n=2)
    runs.delete_runs(engine.store, [a.run_id, b.run_id], keep_images=True)   # 4 images no run needs
    a_keys = [r["key"] for r in a.results["images"]]
    b_keys = [r["key"] for r in b.results["images"]]
    engine.store.touch(a_keys)           # the welder images were used last: they go last
    usage = engine.store.usage()
    b_bytes = sum(r["bytes"] for r in engine.store.image_rows(b_keys))
    removed = engine.store.gc(quota_bytes=usage["image_bytes"] - b_bytes)
    assert removed["images"] == 2 and removed["over_quota"] == 0
    assert set(engine.store.get_images(a_keys)) == set(a_keys) and not engine.store.get_images(b_keys)
    assert not any(engine.store.image_path_for(k).exists() for k in b_keys)
    from engine.cli import main

    assert main(["runs", "gc", "--data-dir", str(engine.store.data_dir), "--json"]) == 0
    assert not engine.store.get_images(a_keys)
    assert len(runs.run_records(engine.store, runs.get_run(engine.store, kept.run_id))) == 3     # a kept run loses nothing


def test_a_damaged_database_is_one_sentence_saying_what_to_do(tmp_path):
    data = tmp_path / "store"
    data.mkdir()
    (data / "gaplens.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="is damaged: move it"):
        Engine("synthetic", data_dir=str(data))


def test_a_full_disk_is_one_sentence_saying_what_to_do():
    from engine.store.store import store_error

    for exc in (OSError(errno.ENOSPC, "No space left on device"), sqlite3.OperationalError("database or disk is full")):
        assert "disk holding the GapLens store is full: free some space" in str(store_error(exc))


def test_the_runs_tab_pages_through_many_runs(engine):
    for i in range(60):
        engine.store.create_run("generate", {"prompt": f"a {'quiet' if i % 3 else 'loud'} prompt"}, {}, "test")
    first = runs.list_page(engine.store, page=1, per_page=25)
    assert first["total"] == 60 and first["pages"] == 3 and len(first["rows"]) == 25
    everything = runs.list_runs(engine.store)
    assert [r["id"] for r in first["rows"]] == [r["id"] for r in everything[:25]]
    last = runs.list_page(engine.store, page=9, per_page=25)   # past the end: the last page
    assert last["page"] == 3 and [r["id"] for r in last["rows"]] == [r["id"] for r in everything[50:]]
    oldest = runs.list_page(engine.store, sort="oldest", page=1, per_page=25)
    assert [r["id"] for r in oldest["rows"]] == [r["id"] for r in runs.list_runs(engine.store, sort="oldest")[:25]]
    found = runs.list_page(engine.store, search="loud", per_page=25)
    assert found["total"] == 20 and found["methods"] == ["generate"]


# -- visitors and budgets -------------------------------------------------------------------
def test_public_visitors_see_only_their_runs_and_budgets_are_checked_before_work(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True,
                    budget=Budget(images=8, hourly_images=12))
    a, b = access.Visitor("session:a"), access.Visitor("session:b")
    with access.acting_as(a):
        mine = _generate(engine, "a photo of a clerk", n=8).run_id
        image = engine.store.run_image_rows([mine])[0]["image_key"]
        assert engine.store.put_labels([(mine, image, "gender", "male", "a")]) == 1
        with pytest.raises(OverBudgetError, match="over budget: one request may generate at most 8"):
            list(generate.run(generate.GenerateRequest("a photo of a clerk", n=9), engine))
        with pytest.raises(OverBudgetError, match="over budget: each visitor may generate 12 images per hour; 4"):
            list(generate.run(generate.GenerateRequest("a photo of a clerk", n=8), engine))
        assert [r["id"] for r in runs.list_runs(engine.store)] == [mine]
    with access.acting_as(b):
        assert runs.list_runs(engine.store) == [] and engine.store.get_run(mine) is None
        # another visitor's run is deleted like a missing one: nothing, and no word of its existence
        assert engine.store.delete_run(mine) == engine.store.delete_run("no-such-run") == {
            "runs": 0, "images": 0, "answers": 0, "embeddings": 0}
        with pytest.raises(NotAllowedError, match="host"):
            engine.set_preset("colour")
        with pytest.raises(NotAllowedError, match="host"):
            engine.unload()
        with pytest.raises(NotAllowedError, match="host"):   # a model swap would change it for everyone
            sources.use_model(engine, "generator", "synthetic_colour_generator:x")
        with pytest.raises(NotAllowedError, match="spot-check only their own runs"):
            engine.store.put_labels([(mine, "0" * 64, "gender", "female", "b")])
        _generate(engine, "a photo of a clerk", n=8)   # b's budget is b's own
    with access.acting_as(access.Visitor("session:c")):  # a's labels are a's: not used for c's images
        assert engine.store.label_rows(image_keys=[image]) == []
    with access.acting_as(access.HOST):
        assert engine.store.set_published([mine]) == 1
    with access.acting_as(b):
        assert len(runs.list_runs(engine.store)) == 2 and engine.store.get_run(mine) is not None
        with pytest.raises(NotAllowedError, match="published"):   # published is read-only
            engine.store.delete_run(mine)
    assert engine.store.count("runs") == 2     # the refused requests stored nothing


def test_public_mode_cleans_the_store_when_it_passes_its_quota(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True)
    with access.acting_as(access.HOST):
        kept = _generate(engine, "a photo of a mason", n=2).run_id
        spare = _generate(engine, "a photo of a potter", n=2)
        runs.delete_runs(engine.store, [spare.run_id], keep_images=True)
    spare_keys = [r["key"] for r in spare.results["images"]]
    engine.store.quota_bytes = engine.store.usage()["total_bytes"] - 1   # images and database together
    with access.acting_as(access.Visitor("session:v")):
        _generate(engine, "a photo of a mason", n=2)            # admitted after an automatic clean-up
        assert len(engine.store.get_images(spare_keys)) == 1     # one unneeded image was enough
        engine.store.quota_bytes = 1                            # the runs need every byte: refuse, clearly
        with pytest.raises(StoreError, match="store is full"):
            list(generate.run(generate.GenerateRequest("a photo of a weaver", n=2), engine))
        with pytest.raises(NotAllowedError):
            engine.store.gc()
    with access.acting_as(access.HOST):
        assert len(runs.run_records(engine.store, runs.get_run(engine.store, kept))) == 2
