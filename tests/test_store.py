"""The store and the engine's caching: hits, resume, concurrency, corruption, bad input."""
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.core.engine import Engine
from engine.common.errors import InputError, ModelLoadError
from engine.common.events import Images
from engine.methods.generate import GenerateRequest, run as generate

from runhelpers import done_event


def _run(engine, **kw):
    return list(generate(GenerateRequest(**kw), engine))


def test_repeat_request_is_served_from_the_store(engine):
    first = _run(engine, prompt="a photo of a doctor", n=8)
    calls = engine.stats.generator_calls
    assert engine.stats.images_generated == 8
    second = _run(engine, prompt="a photo of a doctor", n=8)
    assert engine.stats.generator_calls == calls  # no generator call at all
    assert engine.stats.image_cache_hits == 8
    keys = lambda events: [r["key"] for r in done_event(events).results["images"]]
    assert keys(first) == keys(second)


def test_interrupted_run_keeps_its_images_and_resumes(engine):
    engine.models.get(engine.generator_spec).batch_size = 2
    stream = generate(GenerateRequest("a photo of a nurse", n=8), engine)
    for event in stream:
        if isinstance(event, Images) and event.done >= 4:
            break
    stream.close()  # the user pressed stop
    runs = engine.store.list_runs("generate")
    assert runs[0]["status"] == "stopped"
    assert engine.stats.images_generated == 4
    _run(engine, prompt="a photo of a nurse", n=8)
    assert engine.stats.images_generated == 8  # only the 4 missing ones were generated
    assert engine.stats.image_cache_hits == 4


def test_two_threads_writing_at_once_lose_nothing(data_dir):
    engines = [Engine("synthetic", data_dir=data_dir) for _ in range(2)]
    errors = []

    def work(engine, prompt):
        try:
            for i in range(5):
                _run(engine, prompt=f"{prompt} {i}", n=6)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(e, p)) for e, p in zip(engines, ["a chef", "a farmer"])]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    store = engines[0].store
    assert store.count("images") == 2 * 5 * 6
    assert store.count("runs") == 10
    assert store.count("run_images") == 60
    assert all(r["status"] == "done" for r in store.list_runs())


def test_corrupt_or_missing_image_file_is_regenerated(engine):
    done = done_event(_run(engine, prompt="a photo of a chef", n=4))
    paths = [Path(r["path"]) for r in done.results["images"]]
    original = paths[0].read_bytes()
    paths[0].write_bytes(b"not a png")
    paths[1].unlink()
    before = engine.stats.images_generated
    done2 = _run(engine, prompt="a photo of a chef", n=4)[-1]
    assert engine.stats.images_generated == before + 2
    assert Path(done2.results["images"][0]["path"]).read_bytes() == original  # same seed, same pixels


@pytest.mark.parametrize("kw, needle", [
    ({"prompt": "", "n": 4}, "empty"),
    ({"prompt": "   ", "n": 4}, "empty"),
    ({"prompt": "x" * 2000, "n": 4}, "characters"),
    ({"prompt": "a doctor", "n": 10_000}, "maximum"),
    ({"prompt": "a doctor", "n": 0}, "at least 1"),
])
def test_bad_input_is_a_clear_error_and_keeps_earlier_results(engine, kw, needle):
    _run(engine, prompt="a photo of a teacher", n=4)
    with pytest.raises(InputError, match=needle):
        _run(engine, **kw)
    assert engine.store.count("images") == 4
    statuses = [r["status"] for r in engine.store.list_runs()]
    assert statuses == ["done"]      # bad input is refused before a run record exists (issue 17)


@pytest.mark.slow
def test_unknown_model_is_a_clear_error(data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator="diffusers:no-such-org/no-such-model")
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        _run(engine, prompt="a photo of a doctor", n=2)
    with pytest.raises(ModelLoadError, match="unknown backend"):
        Engine("synthetic", data_dir=data_dir, generator="nonsense:model").default_settings()
    with pytest.raises(InputError, match="unknown preset"):
        Engine("no-such-preset", data_dir=data_dir)


def test_embeddings_answers_and_llm_replies_are_cached(engine):
    records = engine.image_set("a photo of a doctor", range(4))
    e1 = engine.embed_images(records)
    e2 = engine.embed_images(records)
    assert np.array_equal(e1, e2) and engine.stats.embeddings_computed == 4
    a1 = engine.ask(records, "What is the gender of the person?", ["male", "female"])
    a2 = engine.ask(records, "What is the gender of the person?", ["male", "female"])
    assert a1 == a2 and engine.stats.answers_computed == 4
    messages = [{"role": "user", "content": "hello"}]
    r1 = engine.llm.chat(messages, seed=1)
    r2 = engine.llm.chat(messages, seed=1)
    assert r1 == r2 and engine.stats.llm_calls == 1 and engine.stats.llm_cache_hits == 1


# -- SQLite on a network filesystem (issue 41) ----------------------------------------------------------------
MOUNTS = """sysfs /sys sysfs rw,nosuid 0 0
/dev/sda1 / ext4 rw,relatime 0 0
systemd-1 /shared autofs rw,relatime,fd=45 0 0
node0:/export /shared nfs4 rw,relatime,vers=4.2 0 0
/dev/sdb1 /shared/scratch xfs rw,relatime 0 0
10.0.0.1@tcp:/lustre /lustre lustre rw,flock 0 0
//nas/team\\040audits /mnt/team\\040audits cifs rw,vers=3.0 0 0
"""


def test_the_filesystem_is_read_from_the_mount_table(tmp_path):
    """The longest mount point holding a path (the later line for a point mounted twice: an automount's NFS
    over its autofs entry), with the table's escaped spaces; statvfs has no filesystem type."""
    from engine.store.filesystem import filesystem_type, on_network_filesystem

    table = tmp_path / "mounts"
    table.write_text(MOUNTS)
    kinds = {path: filesystem_type(path, str(table)) for path in
             ("/home/me/gaplens", "/shared/gaplens", "/shared/scratch/gaplens", "/sharedother", "/lustre/p/gaplens",
              "/mnt/team audits/gaplens")}
    assert kinds == {"/home/me/gaplens": "ext4", "/shared/gaplens": "nfs4", "/shared/scratch/gaplens": "xfs",
                     "/sharedother": "ext4", "/lustre/p/gaplens": "lustre", "/mnt/team audits/gaplens": "cifs"}
    assert [on_network_filesystem(p, str(table)) for p in kinds] == [False, True, False, False, True, True]
    assert filesystem_type("/anything", str(tmp_path / "no-such-table")) is None   # no /proc: unknown, local


@pytest.mark.parametrize("kind, journal", [("nfs4", "delete"), ("lustre", "delete"), ("ext4", "wal")])
def test_a_store_on_a_network_filesystem_keeps_the_rollback_journal(kind, journal, tmp_path, monkeypatch):
    """SQLite's WAL needs every connection on one host (https://www.sqlite.org/wal.html): a data directory on
    NFS or Lustre, where a multi-node job's rank 0 and the final --shard run open gaplens.sqlite, uses
    journal_mode=DELETE, and leaves no -wal or -shm file; a local disk keeps WAL."""
    from engine.store import filesystem
    from engine.store.store import Store

    table = tmp_path / "mounts"
    table.write_text(f"/dev/sda1 / ext4 rw 0 0\nnode0:/export {tmp_path / 'shared'} {kind} rw 0 0\n")
    monkeypatch.setattr(filesystem, "MOUNTS", str(table))
    store = Store(tmp_path / "shared" / "gaplens")
    store.put_labels([("run", "a" * 64, "gender", "male", "me")])
    assert store._conn().execute("PRAGMA journal_mode").fetchone()[0] == journal
    files = {p.name for p in (tmp_path / "shared" / "gaplens").iterdir()}
    assert ("gaplens.sqlite-wal" in files) == (journal == "wal")
    store.close()
