"""End to end vs generation only: does evaluation hide behind generation?

    python bench/end_to_end.py [--n 16] [--steps 4] [--batch-size 4]

Single Prompt on real backends with tiny random weights (tests/tiny_models.py): a tiny SD pipeline,
a tiny CLIP, a tiny BLIP VQA with captioner; no LLM (gap off). Models are loaded once and shared, so
load time is not counted. Prints each stage's time on whatever device torch picks:

  generation_s          the images alone (Engine.image_set, empty store); medians of --repeats
  vqa_s, embed_s, caption_s   each evaluation stage alone, on the stored images
  sequential_s          Single Prompt with evaluation after generation (overlap off)
  end_to_end_s          Single Prompt with the VQA/CLIP/captions of batch k beside batch k+1 (overlap on)
  e2e_over_generation_ratio   end_to_end_s / generation_s (headline; the GPU target is <= 1.15)

On a CPU the generator and the evaluators share the same cores, so the overlap does not pay there
(the engine turns it on by default only on a GPU); this script forces it on to measure it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from _common import report, thread_settings, tiny_sd_spec


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--n", type=int, default=16)
    args.add_argument("--steps", type=int, default=4)
    args.add_argument("--batch-size", type=int, default=4)
    args.add_argument("--repeats", type=int, default=3)
    opts = args.parse_args()

    import tiny_models

    from engine.core.engine import Engine
    from engine.common.events import Done
    from engine.methods.single_prompt import SinglePromptRequest, run

    root = tempfile.mkdtemp(prefix="gaplens-e2e-models-")
    models = {"generator": tiny_sd_spec(), "embedder": tiny_models.build_tiny_clip_hf(root),
              "vqa": tiny_models.build_tiny_blip_vqa(root)}

    def engine(overlap=None, shared=None):
        e = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="gaplens-e2e-"), **models)
        if shared is not None:
            e.models = shared.models
        e.overlap_evaluation = overlap
        return e

    base = engine()
    for role in ("generator", "embedder", "vqa"):
        base.model_id(role)                                   # load once, outside the timings
    base.models.get(models["generator"]).batch_size = opts.batch_size
    request = SinglePromptRequest("a photo of a doctor", n=opts.n, steps=opts.steps, gap=False, n_boot=200)
    settings = base.settings(steps=opts.steps)
    seeds = request.seeds()

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    base.image_set("warm-up", [0], settings)                    # first-call overheads out of the timings
    from engine.methods.axes import axis_for

    def single_prompt(e):
        return [x for x in run(request, e) if isinstance(x, Done)][0]

    gen, seq, e2e, stages = [], [], [], []
    for _ in range(opts.repeats):  # interleaved, so a busy machine slows every configuration alike
        fresh = engine(shared=base)
        t, records = timed(lambda: fresh.image_set(request.prompt, seeds, settings))
        gen.append(t)
        axes = [axis_for(a) for a in request.axes]
        stages.append((timed(lambda: [fresh.ask(records, a.question, list(a.values) or None) for a in axes])[0],
                       timed(lambda: fresh.embed_images(records))[0], timed(lambda: fresh.caption(records))[0]))
        t, seq_done = timed(lambda: single_prompt(engine(overlap=False, shared=base)))
        seq.append(t)
        t, e2e_done = timed(lambda: single_prompt(engine(overlap=True, shared=base)))
        e2e.append(t)
        same = json.dumps(seq_done.results["axes"], sort_keys=True) == json.dumps(e2e_done.results["axes"], sort_keys=True)
        assert same, "the overlap changed the results"        # (NaN-safe comparison through JSON)
    gen_s, seq_s, e2e_s = (statistics.median(x) for x in (gen, seq, e2e))
    vqa_s, embed_s, caption_s = (statistics.median(x) for x in zip(*stages))
    report(**thread_settings(), device=base.models.device, n_images=opts.n, steps=opts.steps,
           batch_size=opts.batch_size, repeats=opts.repeats, generation_s=gen_s, vqa_s=vqa_s, embed_s=embed_s, caption_s=caption_s,
           sequential_s=seq_s, end_to_end_s=e2e_s, sequential_over_generation_ratio=seq_s / gen_s,
           e2e_over_generation_ratio=e2e_s / gen_s)


if __name__ == "__main__":
    main()
