"""Which backends, files and servers a request may name (issue 26).

On the researcher's own machine (local mode, and the host of a public GapLens) a request names
any backend: a preset's name or 'backend:model' with a hub id, a local path or a server URL. A
visitor of a public GapLens names only what the host fixed when the app started: the presets'
models, the models the app runs (`--generator`, `--vqa`, ...) and the host's allow-lists
(`--public-generators` for Compare models, `--public-evaluators` for Compare evaluators), each
under a label that shows no host path; and no request field that names a file. Anything else is
refused before a model is loaded, a file read or a server called, in one sentence that is the
same whatever was named, so a refusal tells nothing about the host's files or network.
"""
from __future__ import annotations

import re
from dataclasses import fields, is_dataclass

from ..backends import uses_device
from ..backends.base import ModelSpec
from ..common import access
from ..common.errors import InputError, NotAllowedError
from ..common.names import short_label
from ..models.presets import PRESETS, parse_model_override

ROLES = {"generator": "generators", "vqa": "evaluators"}   # the roles a request may pick per run


def parse_allow_list(items, role: str) -> list[tuple[str, ModelSpec]]:
    """(label, spec) per entry of a host's allow-list: comma-separated (or a list of) 'backend:model'
    or 'LABEL=backend:model' (the label visitors see; '' for the default, `offered`'s), a diffusers generator
    with its LoRAs ('doctor-lora=diffusers:BASE+lora=REPO@0.8,weight_name=FILE': the host lists adapters
    as it lists generators).
    InputError for an entry that is not a backend:model."""
    if isinstance(items, str):   # a comma before 'LABEL=backend:' or 'backend:' starts an entry (',weight_name=' does not)
        items = re.split(r",\s*(?=(?:[^=,:]+=)?[\w-]+:)", items)
    out = []
    for item in items or []:
        item = str(item).strip()
        if not item:
            continue
        label, sep, text = item.partition("=")
        if not sep or ":" in label:   # 'backend:model' (its URL may hold '=')
            label, text = "", item
        spec = parse_model_override(text.strip(), role)
        out.append((label.strip(), spec))
    return out


def offered(engine, role: str, *, runnable: bool = True) -> dict[str, ModelSpec]:
    """{label: spec} a visitor may pick for `role` (generator or vqa): each preset's (generators
    under the preset's name), the engine's own at start and now, then the host's allow-list; with
    `runnable`, on hardware without a GPU (a CPU Space: `engine.hardware_note`) only those that
    need none or are loaded or preloaded already."""
    choices: dict[str, ModelSpec] = {}
    named = [(name if role == "generator" else "", preset.specs()[role]) for name, preset in PRESETS.items()]
    named += [("", engine.started_with[role]), ("", engine.preset.specs()[role]), *engine.public_choices[role]]
    for label, spec in named:
        if spec in choices.values():
            continue
        label = label or short_label(spec.label)
        if label in choices:   # the same model with other options
            label = short_label(spec.full_label)
        choices.setdefault(label, spec)
    if runnable and engine.hardware_note:
        choices = {label: spec for label, spec in choices.items() if not uses_device(spec) or engine.models.holds(spec)}
    return choices


def free(engine) -> bool:
    """Whether the current user may name any backend or file (local mode, or the host)."""
    return access.visitor_for(engine.public).host


def resolve(engine, role: str, name: str | ModelSpec) -> ModelSpec:
    """The spec `name` stands for in `role`. Free users: 'backend:model', or for the generator a
    preset's name (its generator). Visitors of a public GapLens: a label of `offered`, else NotAllowedError,
    the same sentence whatever `name` was."""
    if isinstance(name, ModelSpec):   # a spec from code: a visitor's must still be offered
        if free(engine) or name in offered(engine, role).values():
            return name
        name = ""
    name = str(name or "").strip()
    if free(engine):
        if role != "generator":
            return parse_model_override(name)
        if name in PRESETS:
            return PRESETS[name].generator
        if ":" not in name:
            raise InputError(f"'{name}' is neither a preset ({', '.join(PRESETS)}) nor a 'backend:model' generator")
        return parse_model_override(name)
    choices = offered(engine, role)
    if name in choices:
        return choices[name]
    if engine.hardware_note and name in offered(engine, role, runnable=False):   # offered on a GPU
        raise NotAllowedError(f"{engine.hardware_note}: this public GapLens offers these {ROLES[role]}: "
                              f"{', '.join(choices)}")
    raise NotAllowedError(f"this public GapLens offers these {ROLES[role]}: {', '.join(choices)}; pick one of "
                          f"them (GapLens on your own machine takes any model)")


def check(engine, request) -> None:
    """Refuse, before any work, a visitor's request whose fields name a backend that is not
    offered (fields with metadata {"backend": role}) or any file (metadata {"metavar": "PATH"})."""
    if free(engine) or not is_dataclass(request):
        return
    for f in fields(request):
        value = getattr(request, f.name)
        if f.metadata.get("backend") and value:
            for name in ([value] if isinstance(value, str) else value):
                resolve(engine, f.metadata["backend"], name)
        if f.metadata.get("metavar") == "PATH" and value:
            raise NotAllowedError("this public GapLens reads and writes no file a request names; download "
                                  "results from the app instead")
