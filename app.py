"""GapLens: an interactive workbench for auditing text-to-image models for bias.

    python app.py --preset synthetic          # offline synthetic world, any CPU
    python app.py --preset sd-turbo --port 7860
    python app.py --public                    # for strangers: per-visitor runs, budgets (default on a Space)
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
if os.environ.get("SPACES_ZERO_GPU"):
    import spaces  # noqa: F401,E402 - ZeroGPU: must be imported before anything touches torch/CUDA

import gradio as gr  # noqa: E402

from engine.cli import make_engine  # noqa: E402
from engine.core.engine import DEFAULT_MAX_IMAGES, Engine, default_data_dir  # noqa: E402
from engine.common import access  # noqa: E402
from engine.common.errors import GapLensError  # noqa: E402
from engine.hosting.limits import Budget  # noqa: E402
from engine.hosting.storage import upload_limit  # noqa: E402
from engine.methods import METHODS  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from tabs import BUILDERS, boundary, chart_runtime, fair_queue, model_panel, optional, session_state  # noqa: E402
from tabs.common import LoadHook, bind_visitors, together  # noqa: E402

CSS = (Path(__file__).parent / "assets" / "style.css").read_text()
HEADER = ("# GapLens\nAudit text-to-image models for bias: generate, measure with confidence "
          "intervals, compare counterfactuals, map how biases interact, mine the prompts a model "
          "is most biased on, and try mitigations.")


# Errors belong to the action that caused them: starting another action (a button, Enter in a
# text box, another tab) dismisses the toasts still up from an earlier one.
DISMISS_STALE_TOASTS = """
if (!window.glToastRule) {
  window.glToastRule = true;
  const clear = () => document.querySelectorAll('.toast-wrap .toast-close').forEach((b) => b.click());
  document.addEventListener('click', (e) => {
    const b = e.target.closest && e.target.closest('button');
    if (b && !b.closest('.toast-wrap')) clear();
  }, true);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && e.target && e.target.matches('textarea, input')) clear();
  }, true);
}
"""

# A shared view's link names its tab (`?tab=explore&tree=…`; Explore's short `?run=<node>` names none): select it
# once the tabs exist.
LINKED_TAB = """
if (!window.glLinkedTab) {
  window.glLinkedTab = true;
  const query = new URLSearchParams(window.location.search);
  const tab = query.get('tab') || (query.get('run') || query.get('tree') ? 'explore' : null);
  const pick = (tries) => {
    const b = document.querySelector(`button[role=tab][data-tab-id="${CSS.escape(tab)}"]`);
    if (b) b.click(); else if (tries > 0) setTimeout(() => pick(tries - 1), 100);
  };
  if (tab) pick(100);
}
"""


def build_app(engine: Engine) -> gr.Blocks:
    # public mode: uploads and downloads in Gradio's cache are kept an hour (removed every 15 minutes)
    with gr.Blocks(title="GapLens", delete_cache=(900, 3600) if engine.public else None) as demo:
        gr.Markdown(HEADER)
        if os.environ.get("OAUTH_CLIENT_ID"):   # a Space with `hf_oauth: true`: its owner signs in to be host
            gr.LoginButton(size="sm", elem_id="login")
        gr.HTML("", js_on_load=DISMISS_STALE_TOASTS + LINKED_TAB, elem_id="gl-toast-rule", container=False,
                padding=False)
        model_status = model_panel.build(engine)
        load_hooks = []
        with gr.Tabs():
            for title, tab in [(m.title, m.tab) for m in METHODS.values() if m.tab] + [("Runs", "runs")]:
                with gr.Tab(title, id=tab) as opened:
                    hooks = [LoadHook(*hook) for hook in BUILDERS[tab](engine)]
                for hook in hooks:
                    if hook.on_tab_open:   # e.g. the Runs list: current whenever its tab is opened
                        opened.select(**hook.on_tab_open)
                load_hooks += hooks
        load_hooks.append(optional.emptied(demo))
        # A fresh page sends two events: what it shows, then what may load a model (the generator's defaults)
        for hooks in ([h for h in load_hooks if not h.loads_models], [h for h in load_hooks if h.loads_models]):
            hook = together(hooks)
            demo.load(hook.fn, None, hook.outputs, api_name=False)
            if hook.after_model_change:   # e.g. the placeholders naming the model's default steps
                model_status.change(hook.after_model_change, None, hook.outputs, api_name=False)
    session_state.install(demo)
    boundary.install(demo)   # every value a page or API client sends is checked before a handler sees it
    if not engine.public:  # One GPU: one generation at a time; other requests wait in Gradio's queue.
        demo.queue(default_concurrency_limit=1)
        return demo
    bind_visitors(demo)  # every handler acts for its visitor; methods share one GPU queue
    # Every event goes through the queue (api_open=False: no direct /run/ calls), where the fair queue
    # bounds each visitor, address and concurrency group (tabs/fair_queue.py); max_size is only a
    # backstop (on ZeroGPU, Gradio would otherwise make it 1).
    policy = fair_queue.QueuePolicy()
    groups = {fn.concurrency_id for fn in demo.fns.values()}
    demo.queue(default_concurrency_limit=1, max_size=policy.waiting * len(groups), api_open=False)
    demo.fair_queue = fair_queue.install(demo, policy, max_file_size=upload_limit(engine.budget))
    return demo


def launch_options(engine: Engine, demo: gr.Blocks) -> dict:
    """What `demo.launch` takes besides the address: looks, the paths Gradio may serve, and in
    public mode the upload limit and the fair queue's HTTP side."""
    middleware = [Middleware(chart_runtime.CacheForever)]
    options = dict(css=CSS, theme=gr.themes.Soft(), allowed_paths=allowed_paths(engine), footer_links=["api"],
                   head=chart_runtime.head(),   # draws every chart (engine/report/static/vega_runtime.js)
                   app_kwargs={"middleware": middleware})
    if engine.public:  # uploads: exports to import, study packs, answer CSVs
        queue = fair_queue.launch_kwargs(demo.fair_queue)
        middleware += queue.pop("app_kwargs")["middleware"]
        options.update(max_file_size=upload_limit(engine.budget), **queue)
    return options


def allowed_paths(engine: Engine) -> list[str]:
    """What Gradio may serve straight from the data directory: locally the image files only (never
    the database, its WAL or anything else there); in public mode nothing, as anyone may fetch an
    allowed path: pages show copies in Gradio's cache (tabs.common.served) that only the visitor
    handed them can find. Downloads are copied into Gradio's cache."""
    return [] if engine.public else [str(engine.store.image_dir)]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GapLens web app")
    p.add_argument("--preset", default=os.environ.get("GAPLENS_PRESET", "synthetic" if os.environ.get("SPACE_ID") else "auto"),
                   help="synthetic, sd-turbo, sd15, sdxl-turbo, flux-schnell or auto (default; on a Space "
                        "$GAPLENS_PRESET, else synthetic)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="also serve on a public gradio.live link")
    p.add_argument("--data-dir", default=None, help="store location (default $GAPLENS_DATA_DIR or ~/.cache/gaplens)")
    p.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, help="largest N per image set")
    p.add_argument("--public", action=argparse.BooleanOptionalAction, default=bool(os.environ.get("SPACE_ID")),
                   help="serve strangers: each visitor sees only their own runs, budgets apply, host-only actions "
                        "(default on a Hugging Face Space, i.e. when SPACE_ID is set)")
    p.add_argument("--quota-gb", type=float, default=None,
                   help="clean unneeded images when the store's images exceed this (public mode default 20)")
    p.add_argument("--hourly-images", type=int, default=Budget.hourly_images,
                   help="public mode: images each visitor may generate per hour")
    p.add_argument("--hourly-images-total", type=int, default=Budget.hourly_images_total,
                   help="public mode: images all visitors together may generate per hour")
    p.add_argument("--hourly-llm-calls", type=int, default=Budget.hourly_llm_calls,
                   help="public mode: LLM calls each visitor's requests may make per hour (any backend)")
    p.add_argument("--hourly-llm-calls-total", type=int, default=Budget.hourly_llm_calls_total,
                   help="public mode: LLM calls all visitors together may make per hour")
    p.add_argument("--visitors-per-address", type=int, default=Budget.visitors_per_address,
                   help="public mode: one client address may spend this many visitors' hourly budgets "
                        "(raise it for a class behind one address)")
    p.add_argument("--visitor-storage-mb", type=int, default=Budget.storage_mb,
                   help="public mode: each visitor's share of the store (runs, results, images)")
    p.add_argument("--forwarded-allow-ips", default=os.environ.get("FORWARDED_ALLOW_IPS", ""), metavar="IPS",
                   help="comma-separated proxy addresses (or networks) whose X-Forwarded-For is believed for the "
                        "client's address (default $FORWARDED_ALLOW_IPS, else none: uvicorn's own default would "
                        "believe any local peer); on a Space see --forwarded-hops instead")
    p.add_argument("--forwarded-hops", type=int, default=access.forwarded_hops(), metavar="N",
                   help="proxies in front of GapLens that append to X-Forwarded-For: the client's address is the "
                        "entry N from the right of all its lines, as Werkzeug's ProxyFix reads it (default "
                        "$GAPLENS_FORWARDED_HOPS, else 1 on a Hugging Face Space and 0 elsewhere: the socket peer)")
    p.add_argument("--allow-empty-database", action="store_true",
                   help="start even when the data directory's gaplens.sqlite is an empty (0-byte) file, with an "
                        "empty store and ledger (refused by default: an empty database usually means a lost one)")
    p.add_argument("--gallery", default=os.environ.get("GAPLENS_GALLERY"), metavar="PATH_OR_DATASET",
                   help="browse a published export (zip, folder or HF dataset id) read-only")
    for role in ("generator", "embedder", "llm", "vqa"):
        p.add_argument(f"--{role}", default=None, metavar="BACKEND:MODEL", help=f"replace the preset's {role}")
        p.add_argument(f"--{role}-option", action="append", default=[], metavar="KEY=VALUE", dest=f"{role}_option",
                       help=f"an option of the {role} (repeatable; never a secret)")
    p.add_argument("--max-api-calls", type=int, default=None, help="most image API calls one run may make")
    p.add_argument("--public-generators", default=None, metavar="[LABEL=]BACKEND:MODEL,...",
                   help="public mode: generators visitors may pick in Compare models besides the presets' and "
                        "--generator (visitors never type a model, path or URL)")
    p.add_argument("--public-evaluators", default=None, metavar="[LABEL=]BACKEND:MODEL,...",
                   help="public mode: VQA evaluators visitors may pick in Compare evaluators besides the presets' "
                        "and --vqa")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    budget = Budget(hourly_images=args.hourly_images, hourly_images_total=args.hourly_images_total,
                    hourly_llm_calls=args.hourly_llm_calls, hourly_llm_calls_total=args.hourly_llm_calls_total,
                    visitors_per_address=args.visitors_per_address,
                    storage_mb=args.visitor_storage_mb) if args.public else None
    quota = args.quota_gb if args.quota_gb is not None else (20.0 if args.public else None)
    database = Path(args.data_dir or default_data_dir()).expanduser() / "gaplens.sqlite"
    if database.is_file() and database.stat().st_size == 0 and not args.allow_empty_database:
        raise SystemExit("error: the GapLens database (gaplens.sqlite in the data directory) is an empty file, so "
                         "its runs and the visitors' hourly ledger are gone: restore it from a backup, or start with "
                         "--allow-empty-database to begin with an empty store")
    try:
        engine = make_engine(args, public=args.public, budget=budget, quota_gb=quota,
                             public_generators=args.public_generators, public_evaluators=args.public_evaluators,
                             device="cuda" if os.environ.get("SPACES_ZERO_GPU") else None)  # ZeroGPU: never probe CUDA
    except GapLensError as exc:  # e.g. a damaged database: one sentence, no traceback
        raise SystemExit(f"error: {exc}") from None
    print(f"GapLens: {engine.preset_reason}" + ("; public mode" if args.public else ""))
    if engine.store.interrupted:
        print(f"GapLens: {len(engine.store.interrupted)} run(s) left running by a stopped process are marked "
              f"interrupted")
    if args.gallery:
        from engine.runs.gallery import open_gallery

        engine.store = open_gallery(args.gallery, engine.store.data_dir)
        print(f"GapLens: gallery {args.gallery} opened read-only ({engine.store.count('runs')} runs)")
    if os.environ.get("SPACE_ID"):
        from engine.hosting.space import start_up

        print(f"GapLens: {start_up(engine)}")   # preloads a real preset; never fatal (the status line says why)
    demo = build_app(engine)
    # uvicorn reads this when Gradio starts it; its default believes X-Forwarded-For from any local peer
    os.environ["FORWARDED_ALLOW_IPS"] = args.forwarded_allow_ips
    os.environ[access.FORWARDED_HOPS] = str(max(0, args.forwarded_hops))   # engine.common.access.client_address
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options(engine, demo))


if __name__ == "__main__":
    main()
