"""`python -m engine runs list|show|compare|delete|export|import|study ...`: the run history
(engine/runs/history.py's queries) on the command line; output goes to stdout."""
import json
import sys

from ..common.encoding import json_default
from ..common.errors import InputError
from ..runs.history import (SORTS, STATUSES, compare_runs, delete_runs, get_run, headline, list_runs, run_prompt,
                            scores)


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("runs", help="list, show, compare, delete, export and import runs; build user studies")
    rsub = p.add_subparsers(dest="runs_command", required=True)

    def cmd(name, help_text):
        q = rsub.add_parser(name, help=help_text)
        common_arguments(q)
        q.set_defaults(preset="synthetic", method=run_command, make_request=lambda a: a)
        return q

    q = cmd("list", "every run in the store (newest first)")
    q.add_argument("--search", default="", help="words that must all appear (id, method, prompt, model, status)")
    q.add_argument("--method", dest="only_method", default=None, help="only runs of this method")
    q.add_argument("--status", default=None, choices=STATUSES)
    q.add_argument("--sort", default="newest", choices=SORTS)

    q = cmd("show", "one run: header and scores (--json: the whole stored run; --html FILE: its report)")
    q.add_argument("run_id")
    q.add_argument("--html", default=None, metavar="FILE", help="write the run's one-page HTML report")

    q = cmd("compare", "two or more runs side by side (scores, intervals, differences from the first)")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--html", default=None, metavar="FILE", help="write the comparison as an HTML report")

    q = cmd("delete", "delete runs and the images no other run uses")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--keep-images", action="store_true", help="keep every image (only the run records go)")

    q = cmd("export", "export runs: scores JSON + CSV, an imagefolder/importable zip, an HTML report")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--format", default="zip", choices=("json", "csv", "zip", "html", "all"))
    q.add_argument("--out", required=True, help="output file (or directory with --format all)")

    q = cmd("import", "import runs from an exported zip into the store")
    q.add_argument("zip_path")
    q.add_argument("--trust", action="store_true",
                   help="the archive is yours: let its images and caches serve new generations (default: "
                        "imported images belong to the imported runs only)")

    q = cmd("gc", "remove least-recently-used images no run needs, and leftover temporary files")
    q.add_argument("--quota-gb", type=float, default=None,
                   help="remove only until the images fit in this many GiB (default: remove every unneeded image)")

    q = cmd("publish", "show runs read-only to every visitor of a public GapLens (--undo: stop showing them)")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--undo", action="store_true")

    q = cmd("study", "build a user-study pack from runs, or analyse its answers")
    q.add_argument("action", choices=("build", "analyse", "analyze"))
    q.add_argument("run_ids", nargs="*", help="build: the runs whose image sets are the study's conditions")
    q.add_argument("--question", default="rating", choices=("rating", "pair"),
                   help="rating: a 1–5 bias rating of each set; pair: which of two sets is more diverse")
    q.add_argument("--axis", default="gender", help="the attribute the question is about ('overall' for none)")
    q.add_argument("--images", type=int, default=10, help="images shown per set (sampled with the seed)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--raters", type=int, default=None, help="number of forms (default: one full counterbalancing cycle)")
    q.add_argument("--attention", type=int, default=2, help="attention-check items per form")
    q.add_argument("--out", default=None, help="build: the pack zip to write")
    q.add_argument("--key", default=None, help="analyse: the pack zip or its researcher/answer_key.json")
    q.add_argument("--answers", nargs="*", default=[], help="analyse: the answers CSV file(s)")
    q.add_argument("--keep-inattentive", action="store_true", help="analyse: keep raters who failed a check")


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=json_default, ensure_ascii=False))


def run_command(args, engine):
    """The `runs` sub-commands; output goes to stdout. A generator so `python -m engine` runs it
    like a method (it yields no events)."""
    store = engine.store
    command = args.runs_command
    if command == "list":
        rows = list_runs(store, args.search, args.only_method, args.status, args.sort)
        if args.json:
            _print_json(rows)
        elif not rows:
            print(f"no runs in {store.data_dir}")
        else:
            for r in rows:
                print(f"{r['id']}  {r['method']:<14} {r['status']:<8} {r['date']}  {r['prompt'][:40]:<40}  "
                      f"{r['generator'][:32]:<32}  {r['headline']}")
    elif command == "show":
        run = get_run(store, args.run_id)
        if args.html:
            from ..report.export import report_html

            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(report_html(store, [run["id"]]))
        if args.json:
            _print_json({**run, "scores": [s.to_json() for s in scores(run)]})
        else:
            text, _ = headline(run)
            print(f"{run['id']}  {run['method']}  {run['status']}  {run_prompt(run)}\n{text}")
            for s in scores(run):
                ci = f" [{s.low:.4g}, {s.high:.4g}]" if s.low is not None and s.high is not None else ""
                print(f"  {s.name}: {s.value:.4g}{ci}")
    elif command == "compare":
        comparison = compare_runs(store, args.run_ids)
        if args.html:
            from ..report.export import page
            from ..report.runs import compare_html

            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(page("GapLens comparison", compare_html(comparison, store)))
        if args.json:
            _print_json(comparison)
        else:
            for row in comparison["rows"]:
                values = "  ".join(_plain(v) for v in row["values"])
                print(f"{(row['group'] + ' / ' + row['metric'])[:48]:<48} {values}")
    elif command == "delete":
        removed = delete_runs(store, args.run_ids, keep_images=args.keep_images)
        if removed["missing"]:
            raise InputError(f"no run {', '.join(removed['missing'])} in the store")
        _print_json(removed) if args.json else print(
            f"deleted {removed['runs']} run(s), {removed['images']} image(s) no other run used")
    elif command == "export":
        from ..report.export import export_files

        written = export_files(store, args.run_ids, args.format, args.out)
        _print_json({"files": written}) if args.json else print("\n".join(written))
    elif command == "import":
        from ..runs.imports import import_zip

        report = import_zip(store, args.zip_path, trust=args.trust)
        _print_json(report) if args.json else print(
            f"imported {len(report['imported'])} run(s) ({report['images_added']} new image(s)); "
            f"already present: {len(report['skipped'])}"
            + ("" if args.trust else "; imported images serve only the imported runs (--trust to reuse them)"))
    elif command == "gc":
        removed = store.gc(int(args.quota_gb * 2**30) if args.quota_gb is not None else None)
        _print_json(removed) if args.json else print(
            f"removed {removed['images']} image(s) ({removed['bytes'] / 2**20:.1f} MiB); "
            f"{removed['usage']['images']} image(s), {removed['usage']['image_bytes'] / 2**20:.1f} MiB left"
            + (f"; still {removed['over_quota'] / 2**20:.1f} MiB over the quota: delete runs to free more"
               if removed["over_quota"] else ""))
    elif command == "publish":
        changed = store.set_published(args.run_ids, not args.undo)
        print(f"{'withdrew' if args.undo else 'published'} {changed} run(s)")
    elif command == "study":
        from ..tools import study

        if args.action == "build":
            if not args.out:
                raise InputError("study build needs --out PACK.zip")
            pack = study.build_pack(engine, args.run_ids, question=args.question, axis=args.axis,
                                    images_per_set=args.images, seed=args.seed, n_raters=args.raters,
                                    n_attention=args.attention)
            from ..report.study import form_page

            study.write_pack(pack, args.out, form_page(pack))
            _print_json({"pack": args.out, **study.pack_summary(pack)}) if args.json else print(
                f"{args.out}: {study.pack_summary(pack)['text']}")
        else:
            if not args.key or not args.answers:
                raise InputError("study analyse needs --key PACK.zip|answer_key.json and --answers FILE.csv ...")
            analysis = study.analyse(study.load_key(args.key), study.read_answers(args.answers),
                                     exclude_inattentive=not args.keep_inattentive)
            _print_json(analysis) if args.json else print(study.analysis_text(analysis))
    sys.stdout.flush()
    return
    yield  # noqa: unreachable - makes this a generator, as `python -m engine` expects


def _plain(v: dict | None) -> str:
    if not v:
        return "–".ljust(24)
    ci = f" [{v['low']:.3g}, {v['high']:.3g}]" if v.get("low") is not None and v.get("high") is not None else ""
    return f"{v['value']:.4g}{ci}".ljust(24)
