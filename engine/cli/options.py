"""Command-line options built from a request dataclass's fields (defaults written once).

A field becomes an option when its `metadata` has a "help" text; optional keys: "flag" (the
option's name when it is not `--field-name`; for a bool field that defaults to True, the flag
that turns it off, e.g. "--no-caption"), "short" (e.g. "-T"), "choices", "metavar". The
default is the field's, shown by argparse's `%(default)s`. Fields without "help" (tables such
as `axes` or `ideals`, internal knobs) are left to the command module's own options.
"""
from __future__ import annotations

import argparse
import json
import types
import typing
from dataclasses import Field, fields
from pathlib import Path

from ..common.errors import InputError
from ..methods import METHODS
from ..methods.cfsets import load_preset
from ..methods.options import field_default


def option_fields(request_type: type) -> list[Field]:
    """The request's fields that are command-line options (those with a help text)."""
    return [f for f in fields(request_type) if "help" in f.metadata]


def _plain_type(annotation) -> tuple[type, bool]:
    """(element type, is a list) of `int`, `int | None`, `list[str]` ..."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        return (typing.get_args(annotation) or (str,))[0], True
    return annotation, False


def request_options(parser: argparse.ArgumentParser, request_type: type, skip=()) -> None:
    """Add one option per field of `request_type` that has a help text (see the module docstring)."""
    hints = typing.get_type_hints(request_type)
    for f in option_fields(request_type):
        if f.name in skip:
            continue
        meta, default = f.metadata, field_default(f)
        names = [meta.get("flag") or "--" + f.name.replace("_", "-")] + ([meta["short"]] if "short" in meta else [])
        text = meta["help"].replace("%", "%%")
        kind, is_list = _plain_type(hints[f.name])
        kwargs: dict = {"dest": f.name, "default": default}
        if kind is bool:
            kwargs["action"] = "store_false" if default else "store_true"
        else:
            kwargs["type"] = kind
            if is_list:
                kwargs["nargs"] = "+"
            for key in ("choices", "metavar"):
                if key in meta:
                    kwargs[key] = list(meta[key]) if key == "choices" else meta[key]
            if default not in (None, "", []):
                text += " (default: %(default)s)"
        parser.add_argument(*names, help=text, **kwargs)


def request_from_args(request_type: type, args: argparse.Namespace, **given):
    """The request from the parsed options (`request_options`), with `given` fields on top."""
    values = {f.name: getattr(args, f.name) for f in option_fields(request_type) if hasattr(args, f.name)}
    return request_type(**{**values, **given})


def method_parser(sub, common_arguments, name: str, help: str, skip=(), **parser_kwargs) -> argparse.ArgumentParser:
    """The sub-command of METHODS[name]: the shared options, one per request field, and
    defaults `method` (the run function) and `make_request` (the request from the options);
    a command module adds its extras and may replace `make_request`."""
    method = METHODS[name]
    p = sub.add_parser(method.cli, help=help, **parser_kwargs)
    common_arguments(p)
    request_options(p, method.request, skip)
    p.set_defaults(method=method.run, make_request=lambda a: request_from_args(method.request, a))
    return p


# -- counterfactual sets (counterfactuals, intersectional, mitigate) ---------------------------------

def set_options(p: argparse.ArgumentParser) -> None:
    """The axes table of a `SetsRequest`: JSON (or @FILE), or a preset."""
    p.add_argument("--axes", default=None, metavar="JSON|@FILE",
                   help='{"axis": ["counterfactual prompt", ...]}; default: ask the LLM (TIBET meta-prompt)')
    p.add_argument("--axes-preset", default=None, choices=["occupations"],
                   help="Table 6.1's 8 axes (prompt 'A photo of a {occupation}' unless --prompt is given)")


def set_fields(a: argparse.Namespace) -> dict:
    """`prompt` and `axes` of a `SetsRequest` from --prompt, --axes and --axes-preset."""
    axes, prompt = None, a.prompt
    if a.axes_preset:
        preset = load_preset(a.axes_preset)
        axes, prompt = preset["axes"], prompt or preset["prompt"]
    if a.axes:
        try:
            text = Path(a.axes[1:]).read_text() if a.axes.startswith("@") else a.axes
            axes = json.loads(text)
        except (OSError, ValueError) as exc:
            raise InputError(f"--axes: {exc}") from None
        if not isinstance(axes, dict):
            raise InputError('--axes must be a JSON object {"axis": ["counterfactual prompt", ...]}')
    if not prompt:
        raise InputError("give --prompt (or --axes-preset)")
    return {"prompt": prompt, "axes": axes}
