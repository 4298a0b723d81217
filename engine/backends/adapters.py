"""Fine-tunes as generators (issue 44): LoRAs and textual-inversion embeddings on a diffusers base, and
the identity each adds to the generator's id.

A generator names its adapters after its base model, each LoRA with its scale:

    diffusers:BASE+lora=REPO_OR_PATH[@SCALE][,weight_name=FILE][,revision=REV]+lora=...+ti=PATH[,trigger=WORD]

`parse_model` turns that into the base and the options {"lora": [...], "textual_inversion": [...]} of a
ModelSpec (so a spec built in code, or with --generator-option lora=[...] as JSON, is the same generator),
and `suffix` writes the options back ("+lora=...@0.8"), so a spec's label reads as it was typed.

Loading (`resolve`, `apply`): each adapter resolves to one local file, which is what diffusers loads and
what the id names: a local file by the sha256 of its bytes, a hub repository by the commit its file was
downloaded from (`weight_name` picks the file when the repository holds several). The generator's id is
the base's followed by "+lora=NAME@VERSION*SCALE" per LoRA and "+ti=NAME@VERSION:TRIGGER" per embedding
(`identity`), so an image cached for one adapter or scale is never reused for another. LoRAs load through
`load_lora_weights` (one adapter name each), `set_adapters` gives each its scale, and by default they are
fused into the base weights (`fuse_lora`) and their own weights dropped (`unload_lora_weights`): no extra
memory or compute per image; option fuse_lora=false keeps them as PEFT layers. A LoRA that does not fit
the base (another family, layers the base lacks) is refused in one sentence (`mismatch`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..common.errors import InputError, ModelLoadError

KEYS = ("lora", "textual_inversion")          # the spec options adapters live in
MARKERS = {"lora": "lora", "ti": "textual_inversion"}
FIELDS = {"lora": ("weight_name", "revision"), "textual_inversion": ("weight_name", "revision", "trigger")}
LORA_FILE = "pytorch_lora_weights.safetensors"      # diffusers' name for a LoRA it saved
_SPLIT = re.compile(r"\+(lora|ti)=")


@dataclass(frozen=True)
class Adapter:
    """One adapter as a spec names it: `kind` "lora" or "textual_inversion", `source` a hub repository or
    a local file or folder, `scale` (LoRAs), `weight_name` (the file of a repository or folder),
    `revision` (a hub branch, tag or commit), `trigger` (the word a prompt uses for an embedding)."""

    kind: str
    source: str
    scale: float = 1.0
    weight_name: str | None = None
    revision: str | None = None
    trigger: str | None = None

    def as_option(self) -> dict:
        out = {"source": self.source}
        if self.kind == "lora":
            out["scale"] = self.scale
        return out | {k: getattr(self, k) for k in FIELDS[self.kind] if getattr(self, k)}


def has_adapters(text: str) -> bool:
    """Whether a model text names adapters ('BASE+lora=...')."""
    return bool(_SPLIT.search(text))


def parse_model(text: str) -> tuple[str, dict]:
    """('BASE', {"lora": [...], "textual_inversion": [...]}) of 'BASE+lora=A@0.8,weight_name=f+ti=B';
    InputError for an adapter without a source, a scale that is not a number or an unknown field."""
    parts = _SPLIT.split(text)
    base, options = parts[0].strip(), {}
    if not base:
        raise InputError(f"'{text}' names adapters but no base model before '+lora=' / '+ti='")
    for marker, body in zip(parts[1::2], parts[2::2]):
        kind = MARKERS[marker]
        source, *extra = [p.strip() for p in body.split(",")]
        scale = 1.0
        head, at, tail = source.rpartition("@")
        if at and kind == "lora":
            try:
                scale, source = float(tail), head
            except ValueError:
                pass   # an '@' of the path itself
        fields = {}
        for item in extra:
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in FIELDS[kind]:
                raise InputError(f"'{item}' in '+{marker}={body}' is not one of {', '.join(f + '=' for f in FIELDS[kind])}")
            fields[key.strip()] = value.strip()
        if not source:
            raise InputError(f"'+{marker}=' needs a hub repository or a file, e.g. +{marker}=user/my-lora@0.8")
        options.setdefault(kind, []).append(Adapter(kind, source, scale, **fields).as_option())
    return base, options


def adapters_of(options: dict) -> list[Adapter]:
    """The adapters a spec's options name, LoRAs first; InputError for a malformed entry."""
    out = []
    for kind in KEYS:
        entries = options.get(kind) or []
        if isinstance(entries, (str, dict)):
            entries = [entries]
        for entry in entries:
            if isinstance(entry, str):
                entry = {"source": entry}
            if not isinstance(entry, dict) or not str(entry.get("source", "")).strip():
                raise InputError(f"option {kind}: each entry needs a 'source' (a hub repository or a file), not {entry!r}")
            unknown = set(entry) - {"source", "scale", *FIELDS[kind]}
            if unknown:
                raise InputError(f"option {kind}: unknown field(s) {', '.join(sorted(unknown))}")
            try:
                scale = float(entry.get("scale", 1.0))
            except (TypeError, ValueError):
                raise InputError(f"option {kind}: the scale of '{entry['source']}' must be a number") from None
            out.append(Adapter(kind, str(entry["source"]).strip(), scale,
                               **{k: str(entry[k]) for k in FIELDS[kind] if entry.get(k)}))
    return out


def suffix(options: dict) -> str:
    """'+lora=A@0.8,weight_name=f+ti=B,trigger=<x>': the adapters of `options` as a spec text writes them
    ('' without adapters; malformed options are written as they are, for the loader to refuse)."""
    try:
        adapters = adapters_of(options)
    except InputError:
        return "".join(f"+{k}={json.dumps(options[k])}" for k in KEYS if options.get(k))
    text = ""
    for a in adapters:
        marker = "lora" if a.kind == "lora" else "ti"
        text += f"+{marker}={a.source}" + (f"@{a.scale:g}" if a.kind == "lora" else "")
        text += "".join(f",{k}={getattr(a, k)}" for k in FIELDS[a.kind] if getattr(a, k))
    return text


# -- resolving an adapter to one file -----------------------------------------------------------------

def pick_file(names: list[str], adapter: Adapter) -> str:
    """The weights file of a repository or folder holding `names`: `weight_name`, else diffusers' LoRA file
    (pytorch_lora_weights.safetensors), else its only top-level .safetensors (or .bin/.pt for an
    embedding); ModelLoadError naming the candidates when there are several or none."""
    if adapter.weight_name:
        if adapter.weight_name not in names:
            raise ModelLoadError(f"'{adapter.source}' has no file '{adapter.weight_name}'")
        return adapter.weight_name
    top = [n for n in names if "/" not in n and not any(w in n for w in ("optimizer", "scheduler", "checkpoint"))]
    if adapter.kind == "lora" and LORA_FILE in top:
        return LORA_FILE
    for suffixes in ((".safetensors",), (".bin", ".pt")):
        found = sorted(n for n in top if n.endswith(suffixes))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ModelLoadError(f"'{adapter.source}' holds several weight files ({', '.join(found[:6])}); pick one "
                                 f"with ',weight_name=FILE' after it")
    raise ModelLoadError(f"'{adapter.source}' holds no .safetensors (or .bin) weights file")


def resolve(adapter: Adapter, token: str | None = None, cache_dir: str | None = None) -> tuple[str, str]:
    """(local file, version) of an adapter: a local file (or the file picked in a local folder) with
    version "sha256-" + 12 hex digits of its bytes; a hub repository's file, downloaded (or read from the
    cache), with the commit it came from. ModelLoadError naming the adapter when it cannot be found."""
    path = local_file(adapter)
    if path.is_file():
        return str(path), file_version(path)
    from . import device as devices

    if devices.looks_like_local_path(adapter.source):
        raise ModelLoadError(f"no such LoRA or embedding file or folder: '{adapter.source}'")
    from huggingface_hub import HfApi, hf_hub_download

    try:
        names = [] if adapter.weight_name else (_cached_files(adapter.source) if devices.hub_offline() else HfApi().list_repo_files(
            adapter.source, revision=adapter.revision, token=token))
        name = adapter.weight_name or pick_file(names, adapter)
        local = hf_hub_download(adapter.source, name, revision=adapter.revision, token=token, cache_dir=cache_dir)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unknown repository, no network, a gated one: one sentence
        from . import hub_access_problem

        raise ModelLoadError(hub_access_problem(exc, adapter.source) or
                             f"cannot fetch the adapter '{adapter.source}': {type(exc).__name__}: {exc}") from exc
    return local, devices.hub_commit_from_path(local) or adapter.revision or "main"


def _cached_files(repo: str) -> list[str]:
    """The file names of a hub repository's cached snapshot (offline), [] when none is cached."""
    try:
        from huggingface_hub import scan_cache_dir

        for cached in scan_cache_dir().repos:
            if cached.repo_id == repo:
                return sorted({f.file_name for rev in cached.revisions for f in rev.files})
    except Exception:  # noqa: BLE001 - no cache folder
        return []
    return []


def local_file(adapter: Adapter) -> Path:
    """The adapter's source as a path: a local folder's weights file (`pick_file`; ModelLoadError when it
    has none or several), else the source itself (a file, or a hub repository that is no path)."""
    path = Path(adapter.source).expanduser()
    if path.is_dir():
        path = path / pick_file(sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()), adapter)
    return path


def file_version(path: str | Path) -> str:
    """"sha256-" + 12 hex digits of a local file's bytes: the version an id names it by (`file_sha256`,
    hashed once per path, size and modification time)."""
    stat = Path(path).stat()
    return "sha256-" + file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)[:12]


@lru_cache(maxsize=64)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """The sha256 of a file's bytes (cached per path, size and modification time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def identity(adapter: Adapter, version: str) -> str:
    """'+lora=NAME@VERSION*SCALE' or '+ti=NAME@VERSION:TRIGGER': one adapter's part of the generator id
    (NAME: the repository, or a local file's name; VERSION: the commit or the sha256 of the file)."""
    local = Path(adapter.source).expanduser().exists()
    name = Path(adapter.source).name if local else adapter.source
    if adapter.weight_name:
        name += "/" + adapter.weight_name
    if adapter.kind == "lora":
        return f"+lora={name}@{version}*{adapter.scale:g}"
    return f"+ti={name}@{version}" + (f":{adapter.trigger}" if adapter.trigger else "")


def weight_bytes(adapter: Adapter, bytes_per_param: int) -> int | None:
    """The bytes an adapter's weights take at `bytes_per_param`, from its safetensors header (a local file
    or folder, or the cached file of a repository), None when that is not readable without a download."""
    try:
        path = local_file(adapter)
        if not path.is_file():
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(adapter.source, adapter.weight_name or LORA_FILE, revision=adapter.revision)
            if not isinstance(cached, str):
                return None
            path = Path(cached)
        params = sum(math.prod(shape) for shape in safetensors_shapes(path).values())
    except (ModelLoadError, OSError, ValueError, struct.error):
        return None
    return params * bytes_per_param


def safetensors_shapes(path: str | Path) -> dict[str, list[int]]:
    """{tensor name: shape} from a safetensors file's header (no weights read); OSError, ValueError or
    struct.error when it is not readable."""
    with open(path, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(length))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


# -- loading them into a pipeline ---------------------------------------------------------------------

def mismatch(adapter: Adapter, base: str, family: str, reason: str) -> ModelLoadError:
    """The one sentence for an adapter that does not fit its base model."""
    what = "LoRA" if adapter.kind == "lora" else "textual-inversion embedding"
    return ModelLoadError(f"the {what} '{adapter.source}' does not fit the base model '{base}' ({family}): {reason}; "
                          f"an adapter only works on the model family it was trained for (its model card names it)")


class _Captured(logging.Handler):
    """Keeps the warnings diffusers logs while an adapter loads (unexpected or missing LoRA keys)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _reason(exc: BaseException) -> str:
    text = str(exc)
    if "size mismatch" in text or "shape" in text.lower():
        return "its layers have other shapes than the base's"
    if "not found in the base model" in text or "Target modules" in text:
        return "none of the layers it changes exist in the base"
    if "Invalid LoRA checkpoint" in text:
        return "the file holds no LoRA weights"
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def load_lora(pipe, adapter: Adapter, path: str, name: str, base: str, family: str) -> None:
    """`pipe.load_lora_weights(path, adapter_name=name)`; ModelLoadError (`mismatch`) when diffusers refuses
    it, reports keys the base lacks, or attaches it to no component."""
    captured = _Captured()
    loggers = [logging.getLogger(n) for n in ("diffusers.utils.peft_utils", "diffusers.loaders.peft",
                                              "diffusers.loaders.lora_base", "diffusers.loaders.lora_pipeline")]
    kept = [(logger, logger.propagate) for logger in loggers]
    for logger in loggers:   # diffusers' own report (pages of shapes) is replaced by the sentence below
        logger.addHandler(captured)
        logger.propagate = False
    try:
        pipe.load_lora_weights(path, adapter_name=name)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise mismatch(adapter, base, family, _reason(exc)) from exc
    finally:
        for logger, propagate in kept:
            logger.removeHandler(captured)
            logger.propagate = propagate
    odd = [m for m in captured.messages if "unexpected keys" in m or "missing keys" in m]
    if odd:
        raise mismatch(adapter, base, family, "some of its layers do not exist in the base")
    if not any(name in names for names in pipe.get_list_adapters().values()):
        raise mismatch(adapter, base, family, "none of its weights name a layer of the base")


def apply(pipe, adapters: list[Adapter], *, base: str, family: str, fuse: bool = True, token: str | None = None,
          cache_dir: str | None = None) -> str:
    """Loads `adapters` into the diffusers pipeline `pipe` (LoRAs with their scales, fused by default;
    embeddings under their trigger word); returns their part of the generator id (`identity`, in order)."""
    if not adapters:
        return ""
    lora, ti = [a for a in adapters if a.kind == "lora"], [a for a in adapters if a.kind == "textual_inversion"]
    if lora and not hasattr(pipe, "load_lora_weights"):
        raise ModelLoadError(f"'{base}' ({type(pipe).__name__}) cannot load LoRAs")
    if ti and (not hasattr(pipe, "load_textual_inversion") or getattr(pipe, "text_encoder_2", None) is not None):
        raise ModelLoadError("textual-inversion embeddings load into Stable Diffusion 1.x/2.x pipelines (one text "
                             f"encoder); '{base}' is {family}")
    ids = []
    names = []
    for i, adapter in enumerate(lora):
        path, version = resolve(adapter, token, cache_dir)
        names.append(f"gaplens_{i}")
        load_lora(pipe, adapter, path, names[-1], base, family)
        ids.append(identity(adapter, version))
    if lora:
        pipe.set_adapters(names, adapter_weights=[a.scale for a in lora])
        if fuse:
            pipe.fuse_lora(adapter_names=names, lora_scale=1.0)
            pipe.unload_lora_weights()   # the fused weights stay; the LoRA layers and their memory go
    for adapter in ti:
        path, version = resolve(adapter, token, cache_dir)
        try:
            pipe.load_textual_inversion(path, token=adapter.trigger)
        except (ValueError, RuntimeError, KeyError) as exc:
            raise mismatch(adapter, base, family, _reason(exc)) from exc
        ids.append(identity(adapter, version))
    return "".join(ids)
