"""Scale out: the image generation of batch jobs across processes, GPUs and machines.

`python -m engine <method> ...` runs unchanged as one process. Started by a launcher that sets
the torch.distributed environment (`accelerate launch --multi_gpu --num_processes N`, `torchrun
--nproc_per_node N`, accelerate with mpirun, several machines with `--num_machines`) the same
command becomes one job on N processes:

- rank 0 runs the method exactly as a single process does (LLM calls, VQA, metrics, the run
  record) and is the only process that opens the SQLite database;
- every other rank loads the generator once, keeps it warm, and serves generation orders.

A method asks for every image set it will need with `distributed_image_sets(engine, sets)`
(use `yield from`; it returns at once in a single process). Rank 0 then
1. adopts the shards of interrupted jobs into the store (below);
2. lists the images the store lacks (work units are the store's cache keys, de-duplicated
   across sets) and cuts each set's missing seeds into batches exactly as `Engine.images` does:
   the very batches a single process runs (a diffusers image depends on its batch's size);
3. deals the batches out to the ranks (greedy by image count: deterministic and balanced) and
   broadcasts the order;
4. generates its own share like the other ranks; after each generator call every rank adds
   its counts to an all-reduce on a gloo group, and rank 0 turns the global count into
   Progress events with an ETA (the CLI's progress bar);
5. adopts this step's shards into the store and marks the step merged.
The method then runs on as in a single process, every image a cache hit.

Shards. Each rank writes its PNGs straight into the store's image directory (content-addressed
names, a temporary file renamed into place, as the store itself does) and after each generator
call appends one JSON line to its own manifest
`<data dir>/shards/<session>/<step>/rank-NNNNN.jsonl` (rank, host, pid, seconds, and the
`images` rows of the call's images). Plain files with one writer each, appended and closed
after every line: safe on NFS, where SQLite is not. Only rank 0 opens the database, to read
it and to adopt rows whose file matches their sha256 (`Store.adopt_images`).

Resume. A job killed on any rank leaves a complete manifest line for every finished generator
call (a half-written last line is ignored). Relaunched, rank 0 first adopts every unmerged
shard, so the plan holds only images nobody made: no image is generated twice, and the batches
left are the ones a single process would run. The manifests stay as the log of which rank
generated what (one line per generator call); delete `shards/` whenever no job is running.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Iterable, Sequence

from ..backends.base import GenerationSettings
from ..common.errors import GapLensError
from ..common.events import Progress
from ..models.sources import announce_api_calls
from ..store.store import Store, image_key

# Launchers' world-size variables (torchrun/accelerate; MPI as accelerate reads them).
WORLD_SIZE_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# Rank 0 may compute (VQA, LLM, metrics) for hours while the others wait for their next order.
TIMEOUT_ENV = "GAPLENS_DIST_TIMEOUT_HOURS"
DEFAULT_TIMEOUT_HOURS = 72.0
SHARDS = "shards"
MERGED = ".merged"
# CLI commands whose worker ranks load the generator at start (in parallel with rank 0).
PRELOAD_COMMANDS = ("generate", "counterfactuals", "intersectional", "mine")


def launched_world_size() -> int:
    """The number of processes a launcher started for this job (1 without a launcher)."""
    for name in WORLD_SIZE_ENV:
        try:
            value = int(os.environ.get(name, ""))
        except ValueError:
            continue
        if value > 0:
            return value
    return 1


class Cluster:
    """This process's view of the launched job: its rank, the world size, its device, and the
    few collectives the job needs, on a gloo group (CPU tensors; next to NCCL on GPUs)."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        from accelerate import PartialState

        timeout = timedelta(hours=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_HOURS)))
        # cpu=True without CUDA: gloo, even when launched with `accelerate launch --multi_gpu`.
        self.state = PartialState(cpu=not torch.cuda.is_available(), timeout=timeout)
        self.rank = int(self.state.process_index)
        self.world = int(self.state.num_processes)
        self.device = str(self.state.device)  # cuda:LOCAL_RANK on GPUs
        self._dist, self._torch = dist, torch
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.busy = False  # rank 0 between broadcasting an order and its last collective

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj=None):
        """Rank 0's `obj` on every rank."""
        holder = [obj if self.is_main else None]
        self._dist.broadcast_object_list(holder, src=0, group=self.group)
        return holder[0]

    def sum(self, values: Sequence[int]) -> list[int]:
        """Element-wise sum over the ranks."""
        tensor = self._torch.tensor([int(v) for v in values], dtype=self._torch.int64)
        self._dist.all_reduce(tensor, group=self.group)
        return [int(v) for v in tensor.tolist()]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        out = [None] * self.world
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def shutdown(self) -> None:
        """Rank 0: release the workers. Every rank: leave the process group. When rank 0 stops in
        the middle of an order (an error), the workers sit in another collective: it leaves
        without a word and its non-zero exit makes the launcher stop them."""
        global _CLUSTER
        if self.is_main and not self.busy:
            self.broadcast({"kind": "stop"})
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
        _CLUSTER = None


_CLUSTER: Cluster | None = None


def active() -> Cluster | None:
    """The job this process belongs to, or None (a single process: everything runs locally)."""
    return _CLUSTER


def join() -> Cluster | None:
    """Join the launched job (once); None when no launcher started several processes."""
    global _CLUSTER
    if _CLUSTER is None and launched_world_size() > 1:
        _CLUSTER = Cluster()
    return _CLUSTER


# -- planning ------------------------------------------------------------------------------------

def plan_batches(engine, sets: Iterable[Sequence]) -> tuple[list[tuple[str, list[int], dict]], int]:
    """The generator calls that make every missing image of `sets` (each `(prompt, seeds,
    settings[, label])`), as `(prompt, seeds, settings dict)` in set order, and the number of
    distinct images asked for. An image already stored, or planned for an earlier set, is left
    out; each set's missing seeds are cut into batches of the generator's batch size, as
    `Engine.images` cuts them."""
    gen_id = engine.model_id("generator")
    batch_size = max(1, int(getattr(engine.models.get(engine.generator_spec), "batch_size", 4)))
    items = []
    for entry in sets:
        prompt, seeds, settings = entry[0], [int(s) for s in entry[1]], entry[2] or engine.default_settings()
        items.append((prompt, seeds, settings, [image_key(gen_id, prompt, s, settings) for s in seeds]))
    wanted = [k for *_, keys in items for k in keys]
    claimed = engine.store.present_image_keys(wanted)
    batches = []
    for prompt, seeds, settings, keys in items:
        missing = []
        for seed, key in zip(seeds, keys):
            if key not in claimed:
                missing.append(seed)
                claimed.add(key)
        batches += [(prompt, missing[i:i + batch_size], asdict(settings))
                    for i in range(0, len(missing), batch_size)]
    return batches, len(set(wanted))


def deal(batches: Sequence[tuple], world: int) -> list[list[tuple]]:
    """Each rank's share of `batches`: every batch in turn goes to the rank with the fewest
    images so far (the lowest rank on ties). Deterministic; loads differ by at most one batch."""
    shares: list[list[tuple]] = [[] for _ in range(world)]
    load = [0] * world
    for batch in batches:
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(batch)
        load[rank] += len(batch[1])
    return shares


# -- shards --------------------------------------------------------------------------------------

def shards_root(store: Store) -> Path:
    return store.data_dir / SHARDS


def read_manifest(path: Path) -> list[dict]:
    """The complete lines of one rank's manifest (a line cut short by a kill is skipped)."""
    lines = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return lines
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("rows"), list):
            lines.append(entry)
    return lines


def merge_step(store: Store, step_dir: Path) -> int:
    """Adopt the images of every manifest in `step_dir` into the store. Returns rows added."""
    rows = [row for manifest in sorted(step_dir.glob("rank-*.jsonl"))
            for entry in read_manifest(manifest) for row in entry["rows"]]
    return store.adopt_images(rows) if rows else 0


def merge_unmerged(store: Store) -> int:
    """Adopt the shards of every step not marked merged (interrupted jobs, or one running
    now elsewhere: adopting is idempotent). Returns rows added."""
    root = shards_root(store)
    if not root.is_dir():
        return 0
    return sum(merge_step(store, step) for step in sorted(root.glob("*/*"))
               if step.is_dir() and not (step / MERGED).exists())


def _append_line(path: Path, entry: dict) -> None:
    """One manifest line, written, flushed and closed (close-to-open consistency on NFS)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, separators=(",", ":"), default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- running an order ----------------------------------------------------------------------------

def _run_order(cluster: Cluster, engine, order: dict):
    """Every rank: make this rank's share of the order's batches, in lockstep rounds of one
    generator call; yields the global [images generated, generator calls] after each round.
    Returns this rank's stats."""
    share = order["shares"][cluster.rank]
    gen_id = engine.model_id("generator")
    if gen_id != order["generator"]:
        raise GapLensError(f"rank {cluster.rank} loaded generator {gen_id} but rank 0 has {order['generator']}: "
                           "launch every process with the same --preset and --generator")
    if not cluster.is_main:  # a worker's own store is scratch: its PNGs go to the job's store
        engine.store.image_dir = Path(order["images_dir"])
    manifest = Path(order["dir"]) / f"rank-{cluster.rank:05d}.jsonl"
    made = calls = 0
    busy = 0.0
    for round_ in range(order["rounds"]):
        if round_ < len(share):
            prompt, seeds, settings = share[round_]
            before = engine.stats.generator_calls
            start = time.perf_counter()
            records = [r for batch in engine.images(prompt, seeds, GenerationSettings(**settings)) for r in batch]
            seconds = time.perf_counter() - start
            busy += seconds
            fresh = [r.key for r in records if not r.cached]
            if fresh:
                rows = engine.store.image_rows(fresh)
                _append_line(manifest, {"session": order["session"], "step": order["step"], "rank": cluster.rank,
                                        "host": socket.gethostname(), "pid": os.getpid(),
                                        "calls": engine.stats.generator_calls - before,
                                        "seconds": round(seconds, 4), "created": time.time(), "rows": rows})
            made += len(fresh)
            calls += engine.stats.generator_calls - before
        yield cluster.sum([made, calls])
    return {"rank": cluster.rank, "host": socket.gethostname(), "images": made, "calls": calls,
            "busy_seconds": round(busy, 3)}


def distributed_image_sets(engine, sets: Iterable[Sequence]):
    """Make sure the store holds every image of `sets` (each `(prompt, seeds, settings[, label])`),
    generating the missing ones across all ranks of a launched job; use with `yield from`.
    Yields Progress events (global count, ETA) and returns a summary dict. In a single process
    it does nothing and returns {}: the method generates as it always does. An images API's
    total number of calls is announced and checked against the budget first (core.announce_api_calls)."""
    sets = list(sets)
    yield from announce_api_calls(engine, sets)
    cluster = active()
    if cluster is None:
        return {}
    started = time.perf_counter()
    store = engine.store
    adopted = merge_unmerged(store)
    batches, wanted = plan_batches(engine, list(sets))
    total = sum(len(b[1]) for b in batches)
    summary = {"processes": cluster.world, "images_wanted": wanted, "images_planned": total,
               "images_from_earlier_shards": adopted, "images_generated": 0, "generator_calls": 0}
    if not batches:
        return summary
    shares = deal(batches, cluster.world)
    session = _session_id()
    step_dir = shards_root(store) / session["id"] / f"{session['step']:05d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    session["step"] += 1
    order = {"kind": "images", "session": session["id"], "step": step_dir.name, "dir": str(step_dir),
             "images_dir": str(store.image_dir), "generator": engine.model_id("generator"),
             "shares": shares, "rounds": max(len(s) for s in shares)}
    cluster.broadcast(order)
    cluster.busy = True
    yield Progress(0, total, "images", f"0/{total} images to generate on {cluster.world} processes")
    gen_start = time.perf_counter()
    work = _run_order(cluster, engine, order)
    done = calls = 0
    while True:
        try:
            done, calls = next(work)
        except StopIteration as stop:
            mine = stop.value
            break
        elapsed = time.perf_counter() - gen_start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else None
        yield Progress(done, total, "images", f"{done}/{total} images generated on {cluster.world} processes"
                       + (f" ({rate:.2f}/s)" if rate else ""), eta)
    generate_seconds = time.perf_counter() - gen_start
    per_rank = cluster.gather(mine)
    cluster.busy = False
    merged = merge_step(store, step_dir)  # the other ranks' images (rank 0's are stored already)
    summary.update(images_generated=done, generator_calls=calls, images_merged=merged,
                   generate_seconds=round(generate_seconds, 3), seconds=round(time.perf_counter() - started, 3),
                   images_per_second=round(done / generate_seconds, 3) if generate_seconds > 0 else None,
                   per_rank=per_rank, shards=str(step_dir))
    (step_dir / MERGED).write_text(json.dumps(summary, default=str))
    return summary


def _exhaust(generator):
    """Run a generator to its end; return its return value."""
    while True:
        try:
            next(generator)
        except StopIteration as stop:
            return stop.value


_SESSION: dict = {}


def _session_id() -> dict:
    """This process's shard session: one directory per launched job, one step per order."""
    if not _SESSION:
        _SESSION.update(id=time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6], step=0)
    return _SESSION


# -- command line --------------------------------------------------------------------------------

def cli_join(args) -> Cluster | None:
    """For `python -m engine`: join the launched job, or None in a single process (with a note
    when `accelerate launch --cpu --num_processes N` started one process only)."""
    if launched_world_size() <= 1:
        if (os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1") and os.environ.get("MASTER_ADDR")
                and not getattr(args, "quiet", False)):
            sys.stderr.write(
                "note: this is one process. `accelerate launch --cpu` runs several CPU processes only through "
                "mpirun (--mpirun_hostfile); on a machine without CUDA use `accelerate launch --multi_gpu "
                "--num_processes N` (gloo) or `torchrun --nproc_per_node N -m engine ...`\n")
        return None
    cluster = join()
    if getattr(args, "device", None) is None and cluster.device.startswith("cuda"):
        args.device = cluster.device  # one GPU per local rank
    return cluster


def cli_run(cluster: Cluster, args, run_command, make_engine) -> int:
    """One CLI command as a job: rank 0 runs it (`run_command(args)`), the others serve."""
    try:
        if not cluster.is_main:
            return serve(cluster, args, make_engine)
        code = run_command(args)
        return code or (1 if cluster.busy else 0)
    finally:
        cluster.shutdown()


def serve(cluster: Cluster, args, make_engine) -> int:
    """A worker rank's whole life: build an engine whose store is a private scratch directory
    (the job's store is rank 0's), load the generator, serve orders until rank 0 says stop."""
    scratch = tempfile.mkdtemp(prefix=f"gaplens-rank{cluster.rank}-")
    try:
        worker_args = copy.copy(args)
        worker_args.data_dir = scratch
        engine = make_engine(worker_args)
        if getattr(args, "command", None) in PRELOAD_COMMANDS:
            engine.model_id("generator")
        while True:
            order = cluster.broadcast()
            if order["kind"] == "stop":
                return 0
            cluster.gather(_exhaust(_run_order(cluster, engine, order)))
    except GapLensError as exc:
        print(f"error: rank {cluster.rank}: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
