"""Scale out: the image generation and evaluation of batch jobs across processes, GPUs and machines.

`python -m engine <method> ...` runs unchanged as one process. Started by a launcher that sets
the torch.distributed environment (`accelerate launch --multi_gpu --num_processes N`, `torchrun
--nproc_per_node N`, several machines with `--num_machines`) the same command becomes one job on N
processes; so it does under mpirun (`mpirun -np N accelerate launch -m engine ...`, or `mpirun -np N
python -m engine ...`), whose ranks are read from the MPI launcher's variables (`adopt_mpi_environment`;
on several machines export MASTER_ADDR, rank 0's host, to every rank). Each process on a GPU node
computes on its own GPU, cuda:LOCAL_RANK (`cli_join`):

- rank 0 runs the method exactly as a single process does (LLM calls, metrics, the run record)
  and is the only process that opens the SQLite database;
- every other rank loads the generator once, keeps it warm, and serves orders: image batches to
  generate and evaluation batches to answer, caption and embed with its own evaluators.

A method asks for every image set it will need with `distributed_image_sets(engine, sets)`, and
once it knows its questions for every answer, caption and embedding with
`distributed_evaluation(engine, sets, asks, caption, embed)` (use `yield from`; both return at once
in a single process). For each, rank 0
1. adopts the shards of interrupted jobs and `--shard` slices into the store (below);
2. lists the work units the store lacks: they are the store's cache keys (an image; an answer per
   (image, evaluator, question, choices), a caption per (image, evaluator), an embedding per
   (image, embedder)), de-duplicated across sets. Images are cut into the very batches a single
   process runs (a diffusers image depends on its batch's size); evaluation units into batches of
   images missing the same units;
3. deals the batches out to the ranks (greedy by work: deterministic and balanced) and broadcasts
   the order;
4. does its own share like the other ranks, through the engine's own cached calls (`images`,
   `ask`, `caption`, `embed_images`); after each batch every rank adds its counts to an all-reduce
   on a gloo group, and rank 0 turns the global count into Progress events with an ETA;
5. adopts this step's shards into the store and marks the step merged.
The method then runs on as in a single process, every image and every unit a cache hit. LLM calls
that depend on one another (axes, questions, a search's next prompts) stay on rank 0.

Shards. Each rank writes its PNGs straight into the store's image directory (content-addressed
names, a temporary file renamed into place, as the store itself does) and after each batch
appends one JSON line to its own manifest `<data dir>/shards/<session>/<step>/rank-NNNNN.jsonl`
(rank, host, pid, seconds, and the rows it made: `rows` of images, `answers`, `embeddings`). Plain
files with one writer each, appended and closed after every line: safe on NFS, where SQLite is
not. Only rank 0 opens the database, to read it and to adopt rows that check out: an image whose
file matches its sha256 (`Store.adopt_images`), an answer or embedding whose key is the key of
what the row says it is, about a stored image (`Store.adopt_artefacts`).

Resume. A job killed on any rank leaves a complete manifest line for every finished batch (a
half-written last line is ignored). Relaunched, rank 0 first adopts every unmerged shard, so the
plans hold only units nobody stored: no image is generated and no unit evaluated twice, and the
image batches left are the ones a single process would run. The manifests stay as the log of which
rank made what; delete `shards/` whenever no job is running.

Slices without a rendezvous. `--shard I/N` (`Shard`, `run_shard`) runs slice I of the job N ranks
would run, in one process with no process group (one Slurm array task per slice): it plans every
image as rank 0 would, makes the batches dealt to rank I and evaluates every unit of those images,
on a private scratch database, writing only its PNGs and its manifest into the data directory; it
stops there (ShardDone), since what follows needs every slice. A relaunched slice adopts only its own
earlier manifests (its sessions end in `slice_tag`). A later plain run adopts every slice's manifest
and finishes the method from the store.
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
from ..common.errors import GapLensError, InputError
from ..common.events import Progress
from ..models.sources import announce_api_calls
from ..store.store import CAPTION, ImageRecord, Store, answer_key, embedding_key, image_key

# Launchers' world-size variables (torchrun/accelerate; MPI as accelerate reads them).
WORLD_SIZE_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# torch.distributed's variables from an MPI launcher's (Open MPI; Intel MPI and MPICH's Hydra; MVAPICH), the
# ones accelerate's get_cpu_distributed_information reads: mpirun sets no LOCAL_RANK.
MPI_ENV = {"RANK": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"),
           "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"),
           "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"),
           "LOCAL_WORLD_SIZE": ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")}
MPI_DEFAULT_PORT = "29500"   # accelerate's, for a job whose ranks are all on this machine
# Rank 0 may compute (VQA, LLM, metrics) for hours while the others wait for their next order.
TIMEOUT_ENV = "GAPLENS_DIST_TIMEOUT_HOURS"
DEFAULT_TIMEOUT_HOURS = 72.0
SHARDS = "shards"
MERGED = ".merged"
# CLI commands whose worker ranks load the generator at start (in parallel with rank 0).
PRELOAD_COMMANDS = ("generate", "counterfactuals", "intersectional", "mine")
SHARD_COMMANDS = (*PRELOAD_COMMANDS, "mitigate")   # the methods that hand their work to distributed_*
EVAL_BATCH = 16   # images per evaluation batch (at least; a VQA's own larger batch_size wins)
RANK_DEVICES = ("auto", "cuda")   # --device values (and none) that become a rank's own GPU, cuda:LOCAL_RANK


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


def adopt_mpi_environment() -> None:
    """Under mpirun (a world size from the MPI launcher and no LOCAL_RANK), set torch.distributed's RANK,
    WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the launcher's variables (MPI_ENV), and MASTER_ADDR and
    MASTER_PORT when every rank is on this machine: accelerate then creates the process group (NCCL on GPUs,
    where without LOCAL_RANK it would answer DistributedType.NO and create none). Variables already set are
    kept. InputError, in one sentence, when the local rank is not given or the job spans machines without
    MASTER_ADDR."""
    if os.environ.get("LOCAL_RANK", "").strip() or launched_world_size() <= 1:
        return   # torchrun or accelerate set the environment, or one process
    found = {name: next((os.environ[v].strip() for v in names if os.environ.get(v, "").strip()), None)
             for name, names in MPI_ENV.items()}
    if found["LOCAL_RANK"] is None or found["RANK"] is None:
        raise InputError(f"this process is one of {launched_world_size()} launched, but no variable names its rank "
                         f"and local rank (RANK and LOCAL_RANK, or an MPI launcher's: "
                         f"{', '.join(MPI_ENV['LOCAL_RANK'])}); launch with accelerate launch --multi_gpu, torchrun "
                         "or mpirun")
    for name, value in found.items():
        if value is not None:
            os.environ.setdefault(name, value)
    if not os.environ.get("MASTER_ADDR"):
        if (found["LOCAL_WORLD_SIZE"] or found["WORLD_SIZE"]) != found["WORLD_SIZE"]:
            raise InputError("an MPI job on several machines needs MASTER_ADDR (rank 0's host name) exported to "
                             "every rank, e.g. mpirun -x MASTER_ADDR=node1 -x MASTER_PORT=29500")
        os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", MPI_DEFAULT_PORT)


class Cluster:
    """This process's view of the launched job: its rank, the world size, its device, and the
    few collectives the job needs, on a gloo group (CPU tensors; next to NCCL on GPUs)."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        from accelerate import PartialState

        timeout = timedelta(hours=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_HOURS)))
        adopt_mpi_environment()
        # cpu=True without CUDA: gloo, even when launched with `accelerate launch --multi_gpu`.
        self.state = PartialState(cpu=not torch.cuda.is_available(), timeout=timeout)
        self.rank = int(self.state.process_index)
        self.world = int(self.state.num_processes)
        self.device = str(self.state.device)  # cuda:LOCAL_RANK on GPUs
        self._dist, self._torch = dist, torch
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.busy = False  # rank 0 between broadcasting an order and its last collective
        self.shard = False

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


class ShardDone(Exception):
    """A `--shard` process has done its slice; `steps` are its steps' summaries."""

    def __init__(self, steps: list[dict]):
        super().__init__("this shard's slice is done")
        self.steps = steps


class Shard:
    """Slice `index` of `count` (`--shard index/count`): a job's rank without a process group. The
    plans are the job's (every slice computes the same), the collectives are this process's own
    values, and only this slice's batches are done; `images` are its image share's sets."""

    shard, busy, is_main = True, False, False

    def __init__(self, index: int, count: int):
        self.rank, self.world = index, count
        self.steps: list[dict] = []
        self.images: list | None = None

    def broadcast(self, obj=None):
        return obj

    def sum(self, values: Sequence[int]) -> list[int]:
        return [int(v) for v in values]

    def gather(self, obj) -> list:
        return [obj]


def parse_shard(text: str) -> Shard:
    """The Shard `--shard I/N` names; InputError unless 0 <= I < N."""
    index, _, count = str(text).partition("/")
    try:
        index, count = int(index), int(count)
    except ValueError:
        index = count = -1
    if not 0 <= index < count:
        raise InputError(f"--shard takes I/N with 0 <= I < N (slice I of N, counted from 0), not '{str(text)[:40]}'")
    return Shard(index, count)


# -- planning ------------------------------------------------------------------------------------

def plan_batches(engine, sets: Iterable[Sequence], skip_stored: bool = True
                 ) -> tuple[list[tuple[str, list[int], dict]], int]:
    """The generator calls that make every missing image of `sets` (each `(prompt, seeds,
    settings[, label])`), as `(prompt, seeds, settings dict)` in set order, and the number of
    distinct images asked for. An image already stored (unless not `skip_stored`: a shard's
    plan is the same whatever the others made), or planned for an earlier set, is left out; each
    set's missing seeds are cut into batches of the generator's batch size, as `Engine.images`
    cuts them."""
    gen_id = engine.model_id("generator")
    batch_size = max(1, int(getattr(engine.models.get(engine.generator_spec), "batch_size", 4)))
    items = []
    for entry in sets:
        prompt, seeds, settings = entry[0], [int(s) for s in entry[1]], entry[2] or engine.default_settings()
        items.append((prompt, seeds, settings, [image_key(gen_id, prompt, s, settings) for s in seeds]))
    wanted = [k for *_, keys in items for k in keys]
    claimed = engine.store.present_image_keys(wanted) if skip_stored else set()
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


def deal(batches: Sequence[tuple], world: int, size=lambda batch: len(batch[1])) -> list[list[tuple]]:
    """Each rank's share of `batches`: every batch in turn goes to the rank with the least work so
    far (`size` of its batches: images by default; the lowest rank on ties). Deterministic; loads
    differ by at most one batch."""
    shares: list[list[tuple]] = [[] for _ in range(world)]
    load = [0] * world
    for batch in batches:
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(batch)
        load[rank] += size(batch)
    return shares


def set_image_keys(engine, sets: Iterable[Sequence]) -> list[tuple[str, str, int]]:
    """(image key, prompt, seed) of every image of `sets`, de-duplicated, in set order."""
    gen_id = engine.model_id("generator")
    out = {}
    for entry in sets:
        settings = entry[2] or engine.default_settings()
        for seed in entry[1]:
            out.setdefault(image_key(gen_id, entry[0], int(seed), settings), (entry[0], int(seed)))
    return [(key, prompt, seed) for key, (prompt, seed) in out.items()]


def plan_evaluation(engine, images: Sequence[tuple[str, str, int]], asks: Sequence, caption: bool, embed: bool
                    ) -> tuple[list[dict], dict]:
    """The evaluation batches that compute every missing unit of `images` ((key, prompt, seed)):
    an answer per (image, question, choices) of `asks`, a caption, an embedding; the work unit is
    the store's key (engine/store/keys.py). Images not stored, or flagged by the safety checker,
    are left out (methods measure neither). Images missing the same units are cut into batches of
    EVAL_BATCH; each batch is {"images": [[key, prompt, seed]], "asks": [[question, choices]],
    "caption", "embed", "answer_keys", "embedding_keys", "units"}. Returns (batches, the evaluator
    ids the units are keyed by)."""
    asks = [(str(q), list(c) if c else None) for q, c in asks]
    evaluators = {}
    if asks or caption:
        evaluators["vqa"] = engine.model_id("vqa")
    if embed:
        evaluators["embedder"] = engine.model_id("embedder")
    store = engine.store
    present = store.present_image_keys([k for k, _, _ in images])
    flagged = {r["key"] for r in store.image_rows(list(present)) if r["nsfw"]}
    images = [i for i in images if i[0] in present and i[0] not in flagged]
    units = {}
    scored = [engine.scores_classes(c) for _, c in asks]
    for key, _, _ in images:
        units[key] = ([answer_key(evaluators["vqa"], key, q, c, scored=s) for (q, c), s in zip(asks, scored)]
                      + ([answer_key(evaluators["vqa"], key, CAPTION)] if caption else []),
                      [embedding_key(evaluators["embedder"], key)] if embed else [])
    have = (store.stored_keys("answers", [k for a, _ in units.values() for k in a])
            | store.stored_keys("embeddings", [k for _, e in units.values() for k in e]))
    groups: dict[tuple, list] = {}
    for image in images:
        answers, embeddings = units[image[0]]
        missing = tuple(k not in have for k in answers + embeddings)
        if any(missing):
            groups.setdefault(missing, []).append(image)
    vqa = None
    if "vqa" in evaluators:   # its batch size (a CLIP VQA is loaded with the preset's embedder)
        spec, context = engine._spec_and_context("vqa")
        vqa = engine.models.peek(spec, **context)
    size = max(EVAL_BATCH, int(getattr(vqa, "batch_size", 0) or 0))
    batches = []
    for missing, members in groups.items():
        ask_missing = [a for a, m in zip(asks, missing) if m]
        caption_missing = caption and missing[len(asks)]
        embed_missing = embed and missing[-1]
        for i in range(0, len(members), size):
            chunk = members[i:i + size]
            answer_keys = [k for image in chunk for k, m in zip(units[image[0]][0], missing) if m]
            embedding_keys = [k for image in chunk for k in units[image[0]][1]] if embed_missing else []
            batches.append({"images": [list(x) for x in chunk], "asks": [list(a) for a in ask_missing],
                            "caption": bool(caption_missing), "embed": bool(embed_missing),
                            "answer_keys": answer_keys, "embedding_keys": embedding_keys,
                            "units": len(answer_keys) + len(embedding_keys)})
    return batches, evaluators


def missing_units(engine, images: Sequence[tuple[str, str, int]], asks: Sequence = (), caption: bool = False,
                  embed: bool = False) -> dict[str, int]:
    """{"answers", "captions", "embeddings"}: how many units evaluating `images` ((key, prompt, seed)) with
    `asks`, `caption` and `embed` computes, those the store lacks (`plan_evaluation`'s units): the work a
    GPU call that measures stored images does."""
    batches, _ = plan_evaluation(engine, images, asks, caption, embed)
    captions = sum(len(b["images"]) for b in batches if b["caption"])
    return {"answers": sum(len(b["answer_keys"]) for b in batches) - captions, "captions": captions,
            "embeddings": sum(len(b["embedding_keys"]) for b in batches)}


# -- shards --------------------------------------------------------------------------------------

def shards_root(store: Store) -> Path:
    return Path(getattr(store, "shards_dir", None) or store.data_dir / SHARDS)


def read_manifest(path: Path) -> list[dict]:
    """The complete lines of one rank's manifest (a line cut short by a kill is skipped), each with
    its lists of image `rows`, `answers` and `embeddings` (empty when it has none)."""
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
        if isinstance(entry, dict) and all(isinstance(entry.setdefault(k, []), list) for k in ARTEFACTS):
            lines.append(entry)
    return lines


ARTEFACTS = ("rows", "answers", "embeddings")   # a manifest line's lists: image rows first (the others need them)
_SEEN: dict[tuple[str, str], tuple[int, int]] = {}   # (database, manifest) -> (size, mtime) when last adopted


def merge_step(store: Store, step_dir: Path) -> int:
    """Adopt the images, answers and embeddings of every manifest in `step_dir` into the store
    (a manifest unchanged since this process last adopted it is skipped). Returns rows added."""
    entries = []
    for manifest in sorted(step_dir.glob("rank-*.jsonl")):
        try:
            stat = manifest.stat()
        except OSError:
            continue
        seen = (str(store.db_path), str(manifest))
        if _SEEN.get(seen) == (stat.st_size, stat.st_mtime_ns):
            continue
        entries += read_manifest(manifest)
        _SEEN[seen] = (stat.st_size, stat.st_mtime_ns)
    images = [row for entry in entries for row in entry["rows"]]
    added = store.adopt_images(images) if images else 0
    for kind in ("answers", "embeddings"):
        rows = [row for entry in entries for row in entry[kind]]
        added += store.adopt_artefacts(kind, rows) if rows else 0
    return added


def merge_unmerged(store: Store) -> int:
    """Adopt the shards of every step not marked merged (interrupted jobs, `--shard` slices, or a
    job running now elsewhere: adopting is idempotent). A `--shard` slice adopts only its own
    earlier attempts' (the sessions `slice_tag` names): the other slices' images are no work of its,
    and reading and re-hashing them in every slice would cost slices² × images. Returns rows added."""
    root = shards_root(store)
    if not root.is_dir():
        return 0
    return sum(merge_step(store, step) for step in sorted(root.glob(f"*{slice_tag()}/*"))
               if step.is_dir() and not (step / MERGED).exists())


def slice_tag() -> str:
    """The end of a `--shard I/N` slice's session names ("-shard3of8"), so a relaunched slice finds its
    own manifests; '' in any other process."""
    cluster = active()
    return f"-shard{cluster.rank}of{cluster.world}" if cluster is not None and cluster.shard else ""


def _append_line(path: Path, entry: dict) -> None:
    """One manifest line, written, flushed and closed (close-to-open consistency on NFS)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, separators=(",", ":"), default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- running an order ----------------------------------------------------------------------------

def _generate(engine, batch) -> tuple[dict, int, int]:
    """One generator call of an images order: (its manifest entry, images made, calls)."""
    prompt, seeds, settings = batch
    before = engine.stats.generator_calls
    records = [r for b in engine.images(prompt, seeds, GenerationSettings(**settings)) for r in b]
    fresh = [r.key for r in records if not r.cached]
    return {"rows": engine.store.image_rows(fresh) if fresh else []}, len(fresh), engine.stats.generator_calls - before


def _evaluate(engine, batch) -> tuple[dict, int, int]:
    """One batch of an evaluation order, through the engine's own cached calls (ask, caption,
    embed_images; units already stored are cache hits): (its manifest entry, units made, evaluator calls)."""
    records = [ImageRecord(key, prompt, int(seed), str(engine.store.image_path_for(key)))
               for key, prompt, seed in batch["images"]]
    before = engine.stats.answers_computed + engine.stats.embeddings_computed
    calls = 0
    if batch["asks"]:   # every question of the batch at once: each image encoded once (Evaluation.ask_many)
        engine.ask_many(records, [(question, choices) for question, choices in batch["asks"]])
        calls += 1
    if batch["caption"]:
        engine.caption(records)
        calls += 1
    if batch["embed"]:
        engine.embed_images(records)
        calls += 1
    made = engine.stats.answers_computed + engine.stats.embeddings_computed - before
    return ({"answers": engine.store.artefact_rows("answers", batch["answer_keys"]),
             "embeddings": engine.store.artefact_rows("embeddings", batch["embedding_keys"])}, made, calls)


def _check_models(cluster, engine, order: dict) -> None:
    """GapLensError when this rank's models are not the ones rank 0 keyed the order's units by."""
    for role, wanted in order["models"].items():
        have = engine.model_id(role)
        if have != wanted:
            raise GapLensError(f"rank {cluster.rank} loaded {role} {have} but rank 0 has {wanted}: launch every "
                               f"process with the same --preset and --{role}")


def _run_order(cluster: Cluster, engine, order: dict):
    """Every rank: do this rank's share of the order's batches (an image order's generator calls,
    an evaluation order's units), in lockstep rounds of one batch; yields the global [units done,
    calls] after each round. Returns this rank's stats."""
    share = order["shares"][cluster.rank]
    _check_models(cluster, engine, order)
    if not cluster.is_main:  # a worker's own store is scratch: its PNGs go to the job's store
        engine.store.image_dir = Path(order["images_dir"])
    manifest = Path(order["dir"]) / f"rank-{cluster.rank:05d}.jsonl"
    work = _generate if order["kind"] == "images" else _evaluate
    made = calls = 0
    busy = 0.0
    for round_ in range(order["rounds"]):
        if round_ < len(share):
            start = time.perf_counter()
            entry, units, n_calls = work(engine, share[round_])
            seconds = time.perf_counter() - start
            busy += seconds
            if any(entry.values()):
                _append_line(manifest, {"session": order["session"], "step": order["step"], "rank": cluster.rank,
                                        "host": socket.gethostname(), "pid": os.getpid(), "calls": n_calls,
                                        "seconds": round(seconds, 4), "created": time.time(), **entry})
            made += units
            calls += n_calls
        yield cluster.sum([made, calls])
    return {"rank": cluster.rank, "host": socket.gethostname(), order["unit"]: made, "calls": calls,
            "busy_seconds": round(busy, 3)}


# A step's summary keys, by order kind: units done, calls, rows merged, seconds working, units per second.
STEP_KEYS = {"images": ("images_generated", "generator_calls", "images_merged", "generate_seconds",
                        "images_per_second"),
             "evaluation": ("units_computed", "evaluator_calls", "units_merged", "evaluate_seconds",
                            "units_per_second")}


def _run_step(cluster, engine, kind: str, batches: list, shares: list, summary: dict, models: dict):
    """Rank 0 (or a shard): broadcast an order of `shares` of `batches`, do this rank's share with
    the others and adopt theirs (use `yield from`: Progress with the global count and an ETA).
    Updates `summary` under the kind's STEP_KEYS and returns it (`_finish_step` then closes the step)."""
    store = engine.store
    session = _session_id()
    step_dir = shards_root(store) / session["id"] / f"{session['step']:05d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    session["step"] += 1
    unit, what = ("images", "images generated") if kind == "images" else ("units", "answers and embeddings computed")
    total = sum(len(b[1]) for b in batches) if kind == "images" else sum(b["units"] for b in batches)
    order = {"kind": kind, "unit": unit, "session": session["id"], "step": step_dir.name, "dir": str(step_dir),
             "images_dir": str(store.image_dir), "models": models, "shares": shares,
             "rounds": max(len(s) for s in shares)}
    started = time.perf_counter()
    cluster.broadcast(order)
    cluster.busy = True
    where = _where(cluster)
    yield Progress(0, total, kind, f"0/{total} {unit} to make {where}")
    work = _run_order(cluster, engine, order)
    done = calls = 0
    while True:
        try:
            done, calls = next(work)
        except StopIteration as stop:
            mine = stop.value
            break
        elapsed = time.perf_counter() - started
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else None
        yield Progress(done, total, kind, f"{done}/{total} {what} {where}"
                       + (f" ({rate:.2f}/s)" if rate else ""), eta)
    work_seconds = time.perf_counter() - started
    per_rank = cluster.gather(mine)
    cluster.busy = False
    merged = merge_step(store, step_dir)  # the other ranks' work (rank 0's is stored already)
    done_key, calls_key, merged_key, seconds_key, rate_key = STEP_KEYS[kind]
    summary.update({done_key: done, calls_key: calls, "per_rank": per_rank, "shards": str(step_dir),
                    merged_key: merged, seconds_key: round(work_seconds, 3),
                    rate_key: round(done / work_seconds, 3) if work_seconds > 0 else None})
    return summary


def _where(cluster) -> str:
    """Where a step's work runs, for its progress line: 'on N processes' for a launched job, 'in
    this process (slice I/N)' for a `--shard` process, which is one process whatever N is."""
    return f"in this process (slice {cluster.rank}/{cluster.world})" if cluster.shard else f"on {cluster.world} processes"


def _step_summary(cluster, store: Store) -> dict:
    """A step's first summary keys: its start, the processes doing it (1 for a `--shard` process,
    with its `slice` I/N) and `rows_from_earlier_shards`, the rows (images, answers and embeddings
    together) adopted first from shards left by earlier runs (merge_unmerged)."""
    where = {"processes": 1, "slice": f"{cluster.rank}/{cluster.world}"} if cluster.shard else {"processes": cluster.world}
    return {"_started": time.perf_counter(), **where, "rows_from_earlier_shards": merge_unmerged(store)}


def distributed_image_sets(engine, sets: Iterable[Sequence], final: bool = False):
    """Make sure the store holds every image of `sets` (each `(prompt, seeds, settings[, label])`),
    generating the missing ones across all ranks of a launched job (or this `--shard`'s slice of
    them); use with `yield from`. Yields Progress events (global count, ETA) and returns a summary
    dict. In a single process it only adopts shards left in the data directory (`--shard` slices,
    interrupted jobs) and returns {}: the method generates as it always does. An images API's total
    number of calls is announced and checked against the budget first (core.announce_api_calls).
    `final`: the method evaluates nothing a slice could, so a `--shard` process stops after it."""
    sets = list(sets)
    yield from announce_api_calls(engine, sets)
    cluster = active()
    if cluster is None:
        merge_unmerged(engine.store)
        return {}
    if cluster.shard and cluster.steps:
        raise ShardDone(cluster.steps)   # the method's next step depends on every shard's results
    summary = _step_summary(cluster, engine.store)
    batches, wanted = plan_batches(engine, sets, skip_stored=not cluster.shard)
    shares = deal(batches, cluster.world)
    if cluster.shard:  # this slice's share, less what an earlier attempt of it stored
        own = shares[cluster.rank]
        cluster.images = [(p, seeds, GenerationSettings(**st)) for p, seeds, st in own]
        gen_id = engine.model_id("generator")
        keys = [[image_key(gen_id, p, s, settings) for s in seeds] for p, seeds, settings in cluster.images]
        stored = engine.store.present_image_keys([k for batch in keys for k in batch])
        own = [(p, [s for s, k in zip(seeds, batch) if k not in stored], st)
               for (p, seeds, st), batch in zip(own, keys)]
        shares[cluster.rank] = batches = [b for b in own if b[1]]
    total = sum(len(b[1]) for b in batches)
    summary.update(images_wanted=wanted, images_planned=total, images_generated=0, generator_calls=0)
    if batches:
        summary = yield from _run_step(cluster, engine, "images", batches, shares, summary,
                                       {"generator": engine.model_id("generator")})
    result = _finish_step(cluster, summary)
    if cluster.shard and final:
        raise ShardDone(cluster.steps)
    return result


def distributed_evaluation(engine, sets: Iterable[Sequence], asks: Sequence = (), caption: bool = False,
                           embed: bool = False):
    """Make sure the store holds every answer to `asks` (each `(question, choices or None)`), every
    caption (`caption`) and every image embedding (`embed`) of the stored images of `sets`
    (as `distributed_image_sets` takes them), computing the missing units across all ranks of a
    launched job (or this `--shard`'s: those of its own images); use with `yield from` after the
    method knows its questions, before it asks them. Each rank evaluates its share with its own
    loaded evaluator through the engine's cached calls; rank 0 adopts the other ranks' rows
    (checked: Store.adopt_artefacts), so the method then runs on with every unit a cache hit.
    Yields Progress; returns a summary dict ({} in a single process, which evaluates as it always
    does). A `--shard` process stops after it (ShardDone): what follows needs every slice's units."""
    cluster = active()
    if cluster is None:
        return {}
    images = set_image_keys(engine, sets)
    if cluster.shard:
        share = set(set_image_keys(engine, cluster.images or []))
        images = [i for i in images if i in share]
    summary = _step_summary(cluster, engine.store)
    batches, evaluators = plan_evaluation(engine, images, asks, caption, embed)
    if cluster.shard:  # every unit of this slice's images is its own
        shares = [batches if r == cluster.rank else [] for r in range(cluster.world)]
    else:
        shares = deal(batches, cluster.world, size=lambda b: b["units"])
    summary.update(units_planned=sum(b["units"] for b in batches), units_computed=0, evaluator_calls=0)
    if batches:
        summary = yield from _run_step(cluster, engine, "evaluation", batches, shares, summary, evaluators)
    result = _finish_step(cluster, summary)
    if cluster.shard:
        raise ShardDone(cluster.steps)
    return result


def _finish_step(cluster, summary: dict) -> dict:
    """The step's summary, its start time replaced by its seconds. A job's step is marked merged
    (its record: `.merged` beside the manifests); a shard's is left for the final run to adopt,
    and kept for ShardDone."""
    summary["seconds"] = round(time.perf_counter() - summary.pop("_started"), 3)
    if cluster.shard:
        cluster.steps.append(summary)
    elif "shards" in summary:
        (Path(summary["shards"]) / MERGED).write_text(json.dumps(summary, default=str))
    return summary


def exhaust(generator):
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
        _SESSION.update(id=time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6] + slice_tag(), step=0)
    return _SESSION


# -- command line --------------------------------------------------------------------------------

def cli_join(args) -> Cluster | Shard | None:
    """For `python -m engine`: join the launched job, this process's slice (`--shard I/N`), or
    None in a single process (with a note when `accelerate launch --cpu --num_processes N` started
    one process only). In a job on GPUs, `--device` unset, auto or cuda becomes the rank's own GPU
    (cuda:LOCAL_RANK, accelerate's device for the rank); an explicit cuda:N or cpu is kept."""
    global _CLUSTER
    if getattr(args, "shard", None):
        if getattr(args, "command", None) not in SHARD_COMMANDS:
            raise InputError(f"--shard slices the work of {', '.join(SHARD_COMMANDS)}; "
                             f"{getattr(args, 'command', 'this command')} runs as one process")
        if launched_world_size() > 1:
            raise InputError("--shard runs one slice in one process: start it without a launcher (one Slurm array "
                             "task per slice), or drop --shard under accelerate/torchrun")
        _CLUSTER = parse_shard(args.shard)
        return _CLUSTER
    if launched_world_size() <= 1:
        if (os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1") and os.environ.get("MASTER_ADDR")
                and not getattr(args, "quiet", False)):
            sys.stderr.write(
                "note: this is one process. `accelerate launch --cpu` runs several CPU processes only through "
                "mpirun (--mpirun_hostfile); on a machine without CUDA use `accelerate launch --multi_gpu "
                "--num_processes N` (gloo) or `torchrun --nproc_per_node N -m engine ...`\n")
        return None
    cluster = join()
    if cluster.device.startswith("cuda") and str(getattr(args, "device", None) or "auto") in RANK_DEVICES:
        args.device = cluster.device  # one GPU per local rank: cuda:LOCAL_RANK, never every rank on GPU 0
    return cluster


def cli_run(cluster: Cluster | Shard, args, run_command, make_engine) -> int:
    """One CLI command as a job: rank 0 runs it (`run_command(args)`), the others serve; a shard
    runs its slice (run_shard)."""
    if cluster.shard:
        return run_shard(cluster, args, run_command)
    try:
        if not cluster.is_main:
            return serve(cluster, args, make_engine)
        code = run_command(args)
        return code or (1 if cluster.busy else 0)
    finally:
        cluster.shutdown()


def run_shard(shard: Shard, args, run_command) -> int:
    """A `--shard` process's life: the method runs on a private scratch store whose images and
    manifests are the data directory's (`attach`), until its slice is done (ShardDone); the data
    directory's database is never opened. Prints the slice's steps (JSON with --json)."""
    from .engine import default_data_dir

    shared = Path(args.data_dir or default_data_dir()).expanduser()
    scratch = tempfile.mkdtemp(prefix=f"gaplens-shard{shard.rank}-")
    _SESSION.clear()   # the slice's own session (slice_tag), even after another ran in this process
    shard.shared = shared
    slice_args = copy.copy(args)
    slice_args.data_dir = scratch
    try:
        return run_command(slice_args)
    except ShardDone as done:
        report = {"shard": f"{shard.rank}/{shard.world}", "data_dir": str(shared), "steps": done.steps}
        if args.json:
            print(json.dumps(report, indent=2, default=str))
        elif not args.quiet:
            print(f"shard {shard.rank}/{shard.world} done: {json.dumps(done.steps, default=str)}", file=sys.stderr)
        return 0
    finally:
        global _CLUSTER
        _CLUSTER = None
        _SESSION.clear()
        shutil.rmtree(scratch, ignore_errors=True)


def attach(engine) -> None:
    """A `--shard` process's engine writes its images and manifests to the shared data directory
    (its database stays the scratch one); nothing otherwise."""
    shard = active()
    if shard is not None and shard.shard:
        engine.store.image_dir = shard.shared / "images"
        engine.store.image_dir.mkdir(parents=True, exist_ok=True)
        engine.store.shards_dir = shard.shared / SHARDS


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
            cluster.gather(exhaust(_run_order(cluster, engine, order)))
    except GapLensError as exc:
        print(f"error: rank {cluster.rank}: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
