"""Helpers of the ZeroGPU emulation test (tests/test_zerogpu.py): a ZeroGPU scheduler served on
127.0.0.1, and tiny models laid out in a Hugging Face hub cache as a download leaves them."""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Scheduler:
    """The ZeroGPU device API (what `spaces.zero.client` calls): /startup-report, /schedule (a GPU for
    every request, always the same idle one, so the worker process is reused), /allow and /release.
    `calls` lists (path, {parameter: value}) in order; the durations asked for are in the /schedule
    calls' `durationSeconds`."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        scheduler = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                url = urlparse(self.path)
                scheduler.calls.append((url.path, {k: v[0] for k, v in parse_qs(url.query).items()}))
                body = b""
                if url.path == "/schedule":
                    body = json.dumps({"idle": True, "nvidiaIndex": 0, "nvidiaUUID": "GPU-emulated",
                                       "allowToken": f"token-{len(scheduler.calls)}"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def scheduled(self) -> list[dict]:
        return [params for path, params in self.calls if path == "/schedule"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hub_cache(cache: Path, repo: str, folder: Path) -> Path:
    """Lays out `folder` as the hub cache's snapshot of `repo`: each file a blob named by its hash, the
    snapshot's files symbolic links to the blobs, refs/main naming the snapshot. Returns the snapshot."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = root / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(file.relative_to(folder).parts) + 1)) / "blobs" / digest)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def in_dtype(folder: Path, out: Path, dtype) -> Path:
    """A copy of a saved model whose floating-point weights are stored in `dtype` (what it runs in on a
    GPU), so loading maps them from the file as it is, as with the real checkpoints."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(folder, out, dirs_exist_ok=True)
    for file in out.rglob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}, str(file), metadata)
    return out


class InProcessGPU:
    """`spaces.GPU` as ZeroGPU runs a GPU function, in this process (for tests that drive the app in-process):
    the duration is asked for first, with the call's arguments (`scheduled`: the seconds each call asked for),
    then the arguments and every value returned or yielded cross a pickle round trip, as they cross spaces'
    process boundary. `made` lists every GPU function the app created. Install it with
    `monkeypatch.setattr(spaces, "GPU", gpu.GPU)` and SPACES_ZERO_GPU=true, set after `spaces` is imported
    (in this process it must not patch torch)."""

    def __init__(self):
        self.made: list = []
        self.scheduled: list[int] = []

    def GPU(self, task=None, *, duration=None, size=None):   # noqa: N802 - spaces' name
        import inspect
        import pickle

        def crossed(value):
            return pickle.loads(pickle.dumps(value))

        def wrap(task):
            self.made.append(task)

            def schedule(args, kwargs):
                self.scheduled.append(int(duration(*args, **kwargs) if callable(duration) else duration or 60))
                return crossed((args, kwargs))

            if inspect.isgeneratorfunction(task):
                def gpu_function(*args, **kwargs):
                    args, kwargs = schedule(args, kwargs)
                    for value in task(*args, **kwargs):
                        yield crossed(value)
            else:
                def gpu_function(*args, **kwargs):
                    args, kwargs = schedule(args, kwargs)
                    return crossed(task(*args, **kwargs))
            return gpu_function
        return wrap if task is None else wrap(task)
