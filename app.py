"""GapLens: an interactive workbench for auditing text-to-image models for bias.

    python app.py --preset synthetic          # offline synthetic world, any CPU
    python app.py --preset sd-turbo --port 7860
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from engine.core import DEFAULT_MAX_IMAGES, Engine  # noqa: E402
from engine.methods import METHODS  # noqa: E402
from tabs import (compare_models, counterfactuals, intersectional, mine, mitigate, model_panel, runs,  # noqa: E402
                  single_prompt)

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


def build_app(engine: Engine) -> gr.Blocks:
    with gr.Blocks(title="GapLens") as demo:
        gr.Markdown(HEADER)
        gr.HTML("", js_on_load=DISMISS_STALE_TOASTS, elem_id="gl-toast-rule", container=False, padding=False)
        model_panel.build(engine)
        load_hooks = []
        with gr.Tabs():
            with gr.Tab(METHODS["single_prompt"].title, id="single"):
                load_hooks += single_prompt.build(engine)
            with gr.Tab(METHODS["counterfactuals"].title, id="counterfactuals"):
                load_hooks += counterfactuals.build(engine)
            with gr.Tab(METHODS["intersectional"].title, id="intersectional"):
                load_hooks += intersectional.build(engine)
            with gr.Tab(METHODS["mine"].title, id="mine"):
                load_hooks += mine.build(engine)
            with gr.Tab(METHODS["mitigate"].title, id="mitigate"):
                load_hooks += mitigate.build(engine)
            with gr.Tab(METHODS["compare_models"].title, id="compare-models"):
                load_hooks += compare_models.build(engine)
            with gr.Tab("Runs", id="runs"):
                load_hooks += runs.build(engine)
        for fn, outputs in load_hooks:
            demo.load(fn, None, outputs, api_name=False)
    # One GPU: one generation at a time; other requests wait in Gradio's queue.
    demo.queue(default_concurrency_limit=1)
    return demo


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GapLens web app")
    p.add_argument("--preset", default=os.environ.get("GAPLENS_PRESET", "auto"),
                   help="synthetic, sd-turbo, sd15, sdxl-turbo, flux-schnell or auto (default)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="also serve on a public gradio.live link")
    p.add_argument("--data-dir", default=None, help="store location (default $GAPLENS_DATA_DIR or ~/.cache/gaplens)")
    p.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, help="largest N per image set")
    for role in ("generator", "embedder", "llm", "vqa"):
        p.add_argument(f"--{role}", default=None, metavar="BACKEND:MODEL", help=f"replace the preset's {role}")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    engine = Engine(args.preset, data_dir=args.data_dir, max_images=args.max_images,
                    generator=args.generator, embedder=args.embedder, llm=args.llm, vqa=args.vqa)
    print(f"GapLens: {engine.preset_reason}")
    demo = build_app(engine)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, css=CSS,
                theme=gr.themes.Soft(), allowed_paths=[str(engine.store.data_dir)], footer_links=["api"])


if __name__ == "__main__":
    main()
