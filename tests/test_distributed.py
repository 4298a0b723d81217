"""Scale out (engine/core/distributed.py): one CLI job on several processes under `accelerate launch`.

The launched tests start real jobs of 2 CPU processes (gloo) on the synthetic world and on the
tiny diffusers pipeline and compare their store with a 1-process run of the same job; the tiny
pipeline's job is killed on one rank midway through generation, a counterfactuals job midway through
evaluation, and both are relaunched. The in-process tests cover planning, dealing, the worker's shard,
the merge and `--shard` slices without a launcher.
"""
import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from engine.core import distributed
from engine.core.engine import Engine
from engine.core.distributed import deal, distributed_image_sets, merge_unmerged, plan_batches
from engine.backends.gpu_costs import call_seconds
from engine.common.errors import ModelLoadError
from tests import tiny_models

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [f"a photo of a {job}" for job in ("doctor", "nurse", "chef", "pilot", "farmer", "teacher", "judge", "baker")]
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
          "--dynamo_backend", "no"]


# -- helpers -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(data_dir) -> dict:
    """Offline, one thread per process (images then hash alike in 1- and 2-process runs), no GPU."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
            "GAPLENS_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}


def launch_cmd(args, processes: int, cpu_flag: bool = False) -> list[str]:
    """`accelerate launch` with 2+ processes: --multi_gpu, which on a machine without CUDA starts
    the processes through torchrun and the engine joins them over gloo (`accelerate launch --cpu`
    runs several processes only through mpirun)."""
    kind = ["--cpu"] if cpu_flag else ["--multi_gpu"]
    return [*LAUNCH, *kind, "--num_processes", str(processes), "--main_process_port", str(free_port()),
            "-m", "engine", *args]


def run(cmd, data_dir, timeout=300) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=ROOT, env=job_env(data_dir), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def generate_args(prompts_file, *extra) -> list[str]:
    return ["generate", "--preset", "synthetic", "--prompts-file", str(prompts_file), *extra, "--json"]


def snapshot(data_dir) -> dict:
    """What a job leaves in the store: image rows (with each file re-hashed), the done run's
    image links, every run's status."""
    db = sqlite3.connect(Path(data_dir) / "gaplens.sqlite")
    images = {}
    for key, prompt, seed, sha, path in db.execute("SELECT key, prompt, seed, sha256, path FROM images"):
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha, key
        images[key] = (prompt, seed, sha)
    done = [r[0] for r in db.execute("SELECT id FROM runs WHERE status='done'")]
    links = sorted(db.execute("SELECT image_key, label, position FROM run_images WHERE run_id=?", (done[-1],))
                   ) if done else []
    return {"images": images, "links": links, "statuses": sorted(r[0] for r in db.execute("SELECT status FROM runs")),
            "summary": json.loads(db.execute("SELECT summary FROM runs WHERE id=?", (done[-1],)).fetchone()[0])
            if done else None}


def manifest_lines(data_dir) -> dict[Path, list[dict]]:
    """Every shard manifest line by file (one line per generator call)."""
    return {m: distributed.read_manifest(m) for m in sorted(Path(data_dir).glob("shards/*/*/rank-*.jsonl"))}


def generated_keys(lines) -> list[str]:
    return [row["key"] for entries in lines for e in entries for row in e["rows"]]


def evaluated_keys(lines, rank=None) -> list[str]:
    """The answer and embedding keys of manifest lines (of one rank's, with `rank`), repeats kept."""
    return [row["key"] for entries in lines for e in entries if rank in (None, e["rank"])
            for kind in ("answers", "embeddings") for row in e[kind]]


AXES = json.dumps({"gender": ["a photo of a female doctor", "a photo of a male doctor"],
                   "age": ["a photo of an old doctor", "a photo of a young doctor"]})


def counterfactual_args(n: int, *extra) -> list[str]:
    """A counterfactuals job on the synthetic world: 5 sets of n images, 2 questions, a caption and
    an embedding per image."""
    return ["counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a doctor", "--axes", AXES,
            "-n", str(n), "--n-boot", "0", *extra, "--json", "--quiet"]


def evaluation(data_dir) -> tuple[dict, dict]:
    """The store's answers (key -> answer) and embeddings (key -> vector bytes)."""
    db = sqlite3.connect(Path(data_dir) / "gaplens.sqlite")
    return (dict(db.execute("SELECT key, answer FROM answers")), dict(db.execute("SELECT key, vector FROM embeddings")))


def logged_rows_are_stored(data_dir, lines) -> bool:
    """Whether the store holds each answer and embedding of manifest `lines` as that rank made it
    (its `created` time): adopted, not computed again by the process that finished the method."""
    db = sqlite3.connect(Path(data_dir) / "gaplens.sqlite")
    stored = dict(db.execute("SELECT key, created FROM answers UNION ALL SELECT key, created FROM embeddings"))
    return all(stored.get(row["key"]) == row["created"] for entries in lines for e in entries
               for kind in ("answers", "embeddings") for row in e[kind])


def without_paths(results):
    """A run's JSON without what names its store (image paths, the run id)."""
    if isinstance(results, dict):
        return {k: without_paths(v) for k, v in results.items() if k not in ("path", "run_id")}
    return [without_paths(v) for v in results] if isinstance(results, list) else results


def single_process(args, data_dir, capsys) -> dict:
    """The job's results in this process (main(), one process)."""
    from engine.__main__ import main

    capsys.readouterr()
    assert main([*args, "--data-dir", str(data_dir)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def tiny_sd(tiny_root):
    return tiny_models.build_tiny_sd(tiny_root)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("# occupations\n" + "\n".join(PROMPTS) + "\n\n")
    return path


@pytest.fixture(scope="module")
def tiny_job(tiny_sd, prompts_file, tmp_path_factory):
    """The tiny-pipeline job (8 prompts x 2 images, 2 steps) and its store after a 1-process run:
    the CLI's main() in this process, with one torch thread like each launched rank."""
    import torch

    from engine.__main__ import main

    args = generate_args(prompts_file, "-n", "2", "--steps", "2", "--generator", f"diffusers:{tiny_sd.model}")
    baseline = tmp_path_factory.mktemp("tiny-1proc")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args, "--data-dir", str(baseline), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return args, snapshot(baseline)


# -- launched jobs -------------------------------------------------------------------------------

def test_synthetic_job_on_two_processes_matches_one_process(prompts_file, tmp_path):
    args = generate_args(prompts_file, "-n", "4")
    # The command, verbatim: accelerate starts ONE process for --cpu without mpirun (noted on stderr).
    one = run(launch_cmd(args, 2, cpu_flag=True), tmp_path / "cpu-flag")
    assert "this is one process" in one.stderr
    two = run(launch_cmd(args, 2), tmp_path / "two")
    a, b = snapshot(tmp_path / "cpu-flag"), snapshot(tmp_path / "two")
    assert len(a["images"]) == len(PROMPTS) * 4 and a["statuses"] == ["done"]
    assert b["images"] == a["images"] and b["links"] == a["links"] and b["statuses"] == ["done"]
    assert sorted({p for p, _, _ in b["images"].values()}) == sorted(PROMPTS)  # every prompt's images, once
    job = b["summary"]["distributed"]
    assert job["processes"] == 2 and job["images_generated"] == 32 and all(r["images"] > 0 for r in job["per_rank"])
    assert job["images_merged"] == job["per_rank"][1]["images"]  # rank 1's rows, adopted from its shard
    result = json.loads(two.stdout)
    assert [(i["prompt"], i["seed"]) for i in result["images"]] == [(p, s) for p in PROMPTS for s in range(4)]


def test_a_job_mpirun_started_runs_on_every_rank(prompts_file, tmp_path):
    """mpirun sets only the MPI launcher's variables (Open MPI's here: no LOCAL_RANK, RANK or MASTER_ADDR, which
    accelerate needs to create a process group): the two processes still join one job, each generating its
    share, and the store equals the 1-process run's (issue 41)."""
    args = generate_args(prompts_file, "-n", "4")
    env = {k: v for k, v in job_env(tmp_path / "mpi").items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank),
                                   "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                                   "MASTER_PORT": port})   # mpirun -x MASTER_PORT
             for rank in (0, 1)]
    try:
        outputs = [rank.communicate(timeout=300) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], [err[-2000:] for _, err in outputs]
    run([sys.executable, "-m", "engine", *args], tmp_path / "one")
    job, one = snapshot(tmp_path / "mpi"), snapshot(tmp_path / "one")
    assert job["images"] == one["images"] and job["links"] == one["links"]
    shares = job["summary"]["distributed"]["per_rank"]
    assert len(shares) == 2 and all(r["images"] > 0 for r in shares)


def test_killed_rank_relaunched_finishes_without_generating_an_image_twice(tiny_job, tmp_path):
    """Rank 1 is SIGKILLed after its first generator call; the launcher stops rank 0. The relaunch
    adopts rank 1's shard, generates only what neither attempt made, and the store ends identical
    (sha256 of every image, run links) to the 1-process run."""
    args, baseline = tiny_job
    proc = subprocess.Popen(launch_cmd(args, 2), cwd=ROOT, env=job_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    def rank1_pid():  # rank 1 finished its first generator call (or the job ended: fail below)
        first = [e[0] for e in manifest_lines(tmp_path).values() if e and e[0]["rank"] == 1]
        return first[0]["pid"] if first else proc.poll() is not None and -1

    try:
        victim = wait_until(rank1_pid, 240, "rank 1's first generator call")
        assert victim != -1, "the job ended before rank 1 finished a generator call"
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, "the job finished before rank 1 was killed"
    first_lines = manifest_lines(tmp_path)
    stored = set(snapshot(tmp_path)["images"])
    made_first = stored | set(generated_keys(first_lines.values()))
    assert 0 < len(made_first) < 16

    run(launch_cmd(args, 2), tmp_path)
    final = snapshot(tmp_path)
    second_lines = {m: e for m, e in manifest_lines(tmp_path).items() if m not in first_lines}
    made_second = generated_keys(second_lines.values())
    assert not set(made_second) & made_first  # nothing generated twice
    assert len(made_second) == len(set(made_second)) and made_first | set(made_second) == set(baseline["images"])
    job = final["summary"]["distributed"]
    assert job["rows_from_earlier_shards"] == len(set(generated_keys(first_lines.values())) - stored)
    assert job["images_generated"] == 16 - len(made_first) == len(made_second)
    assert job["generator_calls"] == sum(e["calls"] for entries in second_lines.values() for e in entries)
    assert all(r["calls"] > 0 for r in job["per_rank"])
    assert final["images"] == baseline["images"] and final["links"] == baseline["links"]
    # the killed attempt's record: "failed" when rank 0 saw its peer vanish, else "interrupted" (killed
    # while running: the next process to open the store marks it so)
    assert final["statuses"][0] == "done" and final["statuses"][1] in ("failed", "interrupted")


def test_rank_killed_mid_evaluation_relaunched_redoes_nothing_and_every_unit_is_made_once(tmp_path, capsys):
    """Evaluation on every rank: rank 1 is SIGKILLed after its first evaluation batch (the VQA made
    slow by the cost model, which changes no answer); the relaunch evaluates only the units neither
    attempt stored, rank 1 again makes some, no unit is made twice, and the answers, captions,
    embeddings and results equal a single process's."""
    slow = ["--vqa-option", "seconds_per_question=0.05", "--vqa-option", "seconds_per_caption=0.05"]
    args = counterfactual_args(16, *slow)
    proc = subprocess.Popen(launch_cmd(args, 2), cwd=ROOT, env=job_env(tmp_path / "two"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def rank1_evaluated():
        lines = [e for entries in manifest_lines(tmp_path / "two").values() for e in entries
                 if e["rank"] == 1 and e["answers"]]
        return lines[0]["pid"] if lines else proc.poll() is not None and -1

    try:
        victim = wait_until(rank1_evaluated, 240, "rank 1's first evaluation batch")
        assert victim != -1, "the job ended before rank 1 evaluated a batch"
        os.kill(victim, signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, "the job finished before rank 1 was killed"
    first_lines = manifest_lines(tmp_path / "two")
    answers, embeddings = evaluation(tmp_path / "two")
    made_first = set(answers) | set(embeddings) | set(evaluated_keys(first_lines.values()))
    assert 0 < len(made_first) < 80 * 4

    out = run(launch_cmd(args, 2), tmp_path / "two")
    second = [e for m, e in manifest_lines(tmp_path / "two").items() if m not in first_lines]
    made_second = evaluated_keys(second)
    assert not set(made_second) & made_first                       # nothing stored was made again
    assert len(made_second) == len(set(made_second)) and evaluated_keys(second, rank=1)   # once each; rank 1 made some
    assert len(evaluated_keys(first_lines.values())) == len(set(evaluated_keys(first_lines.values())))
    answers, embeddings = evaluation(tmp_path / "two")
    assert set(answers) | set(embeddings) == made_first | set(made_second)
    assert logged_rows_are_stored(tmp_path / "two", second)   # rank 0 adopted rank 1's units, computed none again
    expected = single_process(counterfactual_args(16), tmp_path / "one", capsys)
    assert evaluation(tmp_path / "one") == (answers, embeddings) and len(answers) == 80 * 3
    assert without_paths(json.loads(out.stdout)) == without_paths(expected)


def test_shards_then_a_final_run_equal_one_process(tmp_path, capsys):
    """`--shard 0/2` and `--shard 1/2` each make their slice of the images and of their units, write
    only shards (no database), and the final plain run adopts them (a forged row is not) and computes
    nothing itself: the same results as one process."""
    from engine.__main__ import main

    args = counterfactual_args(6)
    data = tmp_path / "shared"
    reports = [single_process([*args, "--shard", f"{i}/2"], data, capsys) for i in range(2)]
    assert not (data / "gaplens.sqlite").exists()
    per_slice = [sum(s.get("images_generated", 0) for s in r["steps"]) for r in reports]
    assert per_slice[0] > 0 and per_slice[1] > 0 and sum(per_slice) == 5 * 6
    made = evaluated_keys(manifest_lines(data).values())
    assert len(made) == len(set(made)) == 5 * 6 * 4   # each unit by one slice
    manifest = sorted(manifest_lines(data))[-1]
    line = distributed.read_manifest(manifest)[-1]
    forged = {**line["answers"][0], "answer": "forged", "key": "e" * 64}   # a key that is not its row's
    with open(manifest, "a") as f:
        f.write(json.dumps({**line, "answers": [forged], "embeddings": [{**line["embeddings"][0], "dim": 3}]}) + "\n")
    final = single_process(args, data, capsys)
    answers, embeddings = evaluation(data)
    assert set(answers) | set(embeddings) == set(made) and "forged" not in answers.values()
    assert logged_rows_are_stored(data, [[e for e in entries if e["answers"] != [forged]]
                                         for entries in manifest_lines(data).values()])
    expected = single_process(args, tmp_path / "one", capsys)
    assert evaluation(tmp_path / "one") == (answers, embeddings)
    assert without_paths(final) == without_paths(expected)
    assert main([*args, "--data-dir", str(data), "--shard", "2/2"]) == 2
    assert "--shard takes I/N" in capsys.readouterr().err


def test_a_shard_says_it_is_one_process_and_counts_what_it_adopted_as_rows(tmp_path, capsys):
    """Issue 42.19: a `--shard` process is one process (its slice of N), not "N processes", and what it
    adopted from earlier shards is rows of every kind, not images beside the images it wants."""
    from engine.__main__ import main

    args = [a for a in counterfactual_args(4) if a not in ("--json", "--quiet")]
    data = tmp_path / "shared"
    capsys.readouterr()
    assert main([*args, "--data-dir", str(data), "--shard", "1/2"]) == 0
    err = capsys.readouterr().err
    assert "images generated in this process (slice 1/2)" in err and "in this process (slice 1/2)" in err
    assert "on 2 processes" not in err
    steps = json.loads(err.split("shard 1/2 done: ", 1)[1])
    assert [(s["processes"], s["slice"]) for s in steps] == [(1, "1/2")] * 2
    assert all("rows_from_earlier_shards" in s and not any(k.endswith("_from_earlier_shards") and k != "rows_from_"
                                                                "earlier_shards" for k in s) for s in steps)


def test_a_slice_reads_and_hashes_only_its_own_manifests(tmp_path, capsys, monkeypatch):
    """Three slices, one after another, then slice 1 again (a relaunch): no slice reads or re-hashes another
    slice's manifests or images (that cost slices² × images over NFS); the relaunched slice adopts its own
    earlier attempt's rows and makes nothing again (issue 41)."""
    from engine.store.store import Store

    read, hashed = [], []
    reader, adopter = distributed.read_manifest, Store.adopt_images
    monkeypatch.setattr(distributed, "read_manifest", lambda path: read.append(path) or reader(path))
    monkeypatch.setattr(Store, "adopt_images", lambda self, rows: hashed.append(len(rows)) or adopter(self, rows))
    args, data = counterfactual_args(6), tmp_path / "shared"

    written: dict[int, set] = {}   # the manifests each slice wrote

    def slice_(i: int) -> dict:
        before = set(data.glob("shards/*/*/rank-*.jsonl"))
        read.clear(), hashed.clear()
        report = single_process([*args, "--shard", f"{i}/3"], data, capsys)
        written.setdefault(i, set()).update(set(data.glob("shards/*/*/rank-*.jsonl")) - before)
        others = [path for path in read if path not in written[i]]
        assert not others, f"slice {i} read other slices' manifests: {others}"
        return report

    made = []
    for i in range(3):
        made.append(sum(s.get("images_generated", 0) for s in slice_(i)["steps"]))
        assert sum(hashed) <= made[-1]                                  # at most its own images, once
    assert all(made) and sum(made) == 5 * 6
    own = set(written[1])
    again = slice_(1)
    assert own and set(read) == own                                     # its own earlier manifests
    assert sum(hashed) == made[1]                                       # its own images, hashed once
    assert sum(s.get("images_generated", 0) + s.get("units_computed", 0) for s in again["steps"]) == 0


def test_mining_run_on_two_processes_finds_what_one_process_finds(tmp_path):
    """Mine Prompts sends two orders per GA iteration (its images, then their embeddings); the workers
    serve them all."""
    from engine.__main__ import main

    args = ["mine", "--preset", "synthetic", "--iterations", "3", "-n", "4", "--population", "6", "--select", "2",
            "--mutations", "2", "--quiet"]
    assert main([*args, "--data-dir", str(tmp_path / "one")]) == 0
    run(launch_cmd([*args, "--json"], 2), tmp_path / "two")
    one, two = snapshot(tmp_path / "one"), snapshot(tmp_path / "two")
    assert two["images"] == one["images"] and two["links"] == one["links"] and len(one["images"]) == 3 * 6 * 4
    db = [sqlite3.connect(tmp_path / d / "gaplens.sqlite") for d in ("one", "two")]
    results = [json.loads(c.execute("SELECT results FROM runs").fetchone()[0]) for c in db]
    for key in ("archive", "nodes", "iterations", "best_per_iteration"):
        assert results[0][key] == results[1][key], key
    steps = sorted(Path(tmp_path / "two").glob("shards/*/*"))
    assert len(steps) == 2 * 3 and all((s / distributed.MERGED).exists() for s in steps)  # images, embeddings
    embedded = [e for m, entries in manifest_lines(tmp_path / "two").items() for e in entries if e["embeddings"]]
    assert {e["rank"] for e in embedded} == {0, 1}   # every iteration's embeddings on both ranks
    made_by = {m.name for m, e in manifest_lines(tmp_path / "two").items() if e}
    assert made_by == {"rank-00000.jsonl", "rank-00001.jsonl"}


# -- in process ----------------------------------------------------------------------------------

class OneRank:
    """A stand-in for rank `rank` of a job whose other ranks contribute nothing."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.busy = rank, world, False

    is_main = property(lambda self: self.rank == 0)

    def sum(self, values):
        return list(values)

    def gather(self, obj):
        return [obj]


def test_single_process_is_unchanged(engine):
    stream = distributed_image_sets(engine, [("a photo of a doctor", range(4), None)])
    with pytest.raises(StopIteration) as stop:
        next(stream)
    assert stop.value.value == {} and engine.stats.generator_calls == 0


def test_plan_is_the_batches_a_single_process_runs(engine, data_dir):
    engine.models.get(engine.generator_spec).batch_size = 3
    settings = engine.default_settings()
    engine.image_set("a photo of a nurse", [1], settings)
    sets = [("a photo of a doctor", range(7), settings), ("a photo of a nurse", range(4), settings, "label"),
            ("a photo of a doctor", range(5, 9), settings)]
    batches, wanted = plan_batches(engine, sets)
    assert wanted == 7 + 4 + 2
    assert [(p, s) for p, s, _ in batches] == [("a photo of a doctor", [0, 1, 2]), ("a photo of a doctor", [3, 4, 5]),
                                               ("a photo of a doctor", [6]), ("a photo of a nurse", [0, 2, 3]),
                                               ("a photo of a doctor", [7, 8])]
    calls = []
    gen = engine.models.get(engine.generator_spec)
    original = gen.generate
    gen.generate = lambda prompt, seeds, s: calls.append((prompt, list(seeds))) or original(prompt, seeds, s)
    for prompt, seeds, s, *_ in sets:
        engine.image_set(prompt, seeds, s)
    assert calls == [(p, s) for p, s, _ in batches]


def test_deal_balances_images_deterministically():
    batches = [("p", list(range(k)), {}) for k in (8, 8, 3, 8, 1, 8, 8)]
    shares = deal(batches, 3)
    assert shares == deal(batches, 3)
    assert sorted(b for share in shares for b in share) == sorted(batches)
    loads = [sum(len(b[1]) for b in share) for share in shares]
    assert max(loads) - min(loads) <= 8 and sum(loads) == 44


def test_a_workers_shard_is_adopted_once_and_a_damaged_line_is_not(data_dir, tmp_path):
    main = Engine("synthetic", data_dir=data_dir)
    worker = Engine("synthetic", data_dir=str(tmp_path / "scratch"))  # a worker's private scratch store
    settings = main.default_settings()
    batches, _ = plan_batches(main, [("a photo of a judge", range(6), settings)])
    step = Path(data_dir) / "shards" / "session" / "00000"
    step.mkdir(parents=True)
    order = {"kind": "images", "unit": "images", "session": "session", "step": "00000", "dir": str(step),
             "images_dir": str(main.store.image_dir), "models": {"generator": main.model_id("generator")},
             "shares": [[], batches], "rounds": len(batches)}
    work = distributed._run_order(OneRank(1, 2), worker, order)
    assert list(work) == [[6, 1]]
    manifest = step / "rank-00001.jsonl"
    (entry,) = distributed.read_manifest(manifest)
    assert entry["rank"] == 1 and entry["calls"] == 1 and len(entry["rows"]) == 6
    forged = {**entry, "rows": [{**entry["rows"][0], "key": "f" * 64},  # no such file
                                {**entry["rows"][1], "key": "../" + entry["rows"][1]["key"]}]}  # not a key
    with open(manifest, "a") as f:
        f.write(json.dumps(forged) + "\n" + json.dumps(entry)[:50])  # and a line cut short by a kill
    assert main.store.count("images") == 0
    assert merge_unmerged(main.store) == 6 and merge_unmerged(main.store) == 0
    records = main.image_set("a photo of a judge", range(6), settings)
    assert all(r.cached for r in records) and main.stats.generator_calls == 0
    direct = Engine("synthetic", data_dir=str(tmp_path / "direct")).image_set("a photo of a judge", range(6), settings)
    assert [Path(r.path).read_bytes() for r in records] == [Path(r.path).read_bytes() for r in direct]
    (step / distributed.MERGED).write_text("{}")
    assert merge_unmerged(main.store) == 0


def test_gpu_cost_model_reads_the_table_and_changes_no_output(tmp_path):
    assert call_seconds("vqa", {"gpu": "vlm"}) == {"question": 0.25, "image_share": 0.73, "caption": 1.0}
    assert call_seconds("generator", {"gpu": "1", "seconds_per_image": "0.5"}) == {"step": 0.012, "decode": 0.02,
                                                                                   "image": 0.5}
    assert call_seconds("embedder", {"gpu": "off"}) == {}
    for bad in ({"gpu": "tpu"}, {"seconds_per_question": "fast"}, {"seconds_per_caption": -1}, {"image_share": 1.5}):
        with pytest.raises(ModelLoadError):
            call_seconds("vqa", bad)
    plain = Engine("synthetic", data_dir=str(tmp_path / "plain"))
    timed = Engine("synthetic", data_dir=str(tmp_path / "timed"), options={
        "generator": {"seconds_per_image": "0.001"}, "vqa": {"gpu": "clip_vqa"}, "embedder": {"gpu": "1"}})
    for role in ("generator", "vqa", "embedder"):
        assert timed.model_id(role) == plain.model_id(role)   # same cache keys: it changes no output
    a, b = (e.image_set("a photo of a nurse", range(3)) for e in (plain, timed))
    assert [r.key for r in a] == [r.key for r in b]
    assert timed.ask(b, "what is the gender?", ["male", "female"]) == plain.ask(a, "what is the gender?", ["male", "female"])


def test_the_synthetic_generator_takes_a_gpus_batch_size_and_changes_no_output(tmp_path):
    plain = Engine("synthetic", data_dir=str(tmp_path / "plain"))
    batched = Engine("synthetic", data_dir=str(tmp_path / "batched"), options={"generator": {"batch_size": "4"}})
    assert batched.model_id("generator") == plain.model_id("generator")
    a, b = (e.image_set("a photo of a nurse", range(10)) for e in (plain, batched))
    assert [Path(r.path).read_bytes() for r in a] == [Path(r.path).read_bytes() for r in b]
    assert (plain.stats.generator_calls, batched.stats.generator_calls) == (1, 3)
    for bad in ("0", "65", "2.5", "four"):
        with pytest.raises(ModelLoadError, match="batch_size"):
            Engine("synthetic", data_dir=str(tmp_path / bad), options={"generator": {"batch_size": bad}}).image_set(
                "a photo of a nurse", range(1))


def test_an_answer_outside_the_classes_is_adopted_from_a_workers_shard(data_dir, tmp_path):
    """Asked for class scores, the synthetic VQA says "other" (no probabilities) when no choice names what it
    sees; a worker's such answers were refused on adoption, so rank 0 asked them all again alone."""
    main = Engine("synthetic", data_dir=data_dir)
    worker = Engine("synthetic", data_dir=str(tmp_path / "scratch"))
    worker.store.image_dir = main.store.image_dir      # a worker's PNGs go to the job's store
    records = worker.image_set("a photo of a judge", range(3))
    assert main.store.adopt_images(worker.store.image_rows([r.key for r in records])) == 3
    asks = [("What is the age of the person in the image?", ["robot", "statue"]),     # no choice is an age
            ("What is the gender (male, female) of the person in the image?", ["male", "female"])]
    worker.ask_many(records, asks)
    rows = worker.store.artefact_rows("answers", [row["key"] for row in worker.store._read("SELECT key FROM answers")])
    assert any(not row["probs"] for row in rows) and any(row["probs"] for row in rows)
    assert main.store.adopt_artefacts("answers", rows) == 6
    main.ask_many(records, asks)
    assert main.stats.answers_computed == 0       # every answer a hit: none asked again on rank 0
