"""What crosses ZeroGPU's process boundary (issue 21): every GPU handler of the app, found by the mark
`tabs.common.gpu` leaves, yields values that survive pickle.dumps/loads, in output order; and which
requests ask ZeroGPU for a GPU, and for how long."""
import pickle

import gradio as gr
import pytest

from engine.backends import uses_device
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.models.presets import PRESETS, SYNTHETIC_TABLE, resolve_preset
from engine.hosting.space import GPU_MAX_SECONDS, GPU_MIN_SECONDS, gpu_seconds, needs_gpu
from tabs.common import is_gpu_handler

PROMPT = "a photo of a doctor"
ROWS = [["gender", "a photo of a male doctor"], ["", "a photo of a female doctor"],
        ["age", "a photo of a young doctor"], ["", "a photo of an old doctor"]]
SINGLE = dict(prompt=PROMPT, n=4, seed=0, negative_prompt="", steps=None, guidance=None, width=None, height=None,
              axes=["gender"], extra_axes="", references="", mode="paper", alpha=25, combine="diff", until=0)
SETS = dict(prompt=PROMPT, table=ROWS, n=4, fill="", seed=0, negative_prompt="", steps=None, guidance=None)
MINE = ["open", "ga", 2, 4, 1, 2, 2, 2, 25, "diff", False, 0, 0]


def inputs(api_name: str, made: dict):
    """(args, kwargs) of a request to each GPU endpoint; `made` holds what earlier requests returned."""
    cf_args = [PROMPT, "", ROWS, 4, 0, "", None, None, True, True, True, True, 0.01, 0, 5, "paper"]
    table = {
        "single_prompt": ((), SINGLE),
        "regenerate": ((made.get("single_prompt_state"),), {}),
        "sp_spot_compare": ((made.get("single_prompt_state"), f"synthetic_vqa:{SYNTHETIC_TABLE}"), {}),
        "counterfactuals": (cf_args, {}),
        "cf_spot_compare": ((made.get("counterfactuals_state"), f"synthetic_vqa:{SYNTHETIC_TABLE}"), {}),
        "intersectional": ((), {**SETS, "targets": "", "other_policy": "drop", "level": "auto", "p_threshold": None,
                                "min_abs_is": None, "importance": "count", "n_boot": 0}),
        "mine_budget": (MINE, {}),
        "mine": (MINE, {}),
        "mine_resume": ((made.get("mine_run"), 3), {}),
        "mitigate": ((), {**SETS, "axes_to_mitigate": ["gender"], "epsilon": 0.35, "strategy": "intermit",
                          "other_policy": "drop", "n_boot": 0, "tradeoff_tolerance": 0.02,
                          **{f"{k}_{i}": v for i in range(8) for k, v in
                             (("priority", 0.5), ("mode", "uniform"), ("shares", ""))}}),
        "compare_models": (("single_prompt", ["synthetic", "colour"], "", PROMPT, "", ROWS, 4, 0, ["gender"]), {}),
        "runs_spot_compare": ((made.get("single_prompt_run"), f"synthetic_vqa:{SYNTHETIC_TABLE}"), {}),
        "explore": ((), dict(prompt=PROMPT, concepts="a photo of a man\na photo of a woman", versus="", n=4, seed=0,
                             run_id="", inverse="an old doctor", carrier="", m=2, parent="", negative_prompt="",
                             steps=None, guidance=None, width=None, height=None, axes=["gender"])),
        "explore_clusters": (([made.get("single_prompt_run"), made.get("explore_run")], 2), {}),
        "languages_propose": ((PROMPT, ["en", "de"]), {}),
        "languages": ((), dict(mode="one prompt", prompt=PROMPT, prompt_set="magbig-direct", occupations=[],
                               codes=["en", "de"], n=4, seed=0, axes=["gender"], rows=None, proposed={}, steps=None,
                               guidance=None, width=None, height=None)),
    }
    table["mitigate_preview"] = table["mitigate"]
    for prefix in ("cf", "ic", "mt", "cm"):
        table[f"{prefix}_propose_axes"] = ((PROMPT, ""), {})
    return table.get(api_name)


# the order the requests run in: a later one uses what an earlier one made
ORDER = ["single_prompt", "regenerate", "sp_spot_compare", "runs_spot_compare", "counterfactuals", "cf_spot_compare",
         "intersectional", "mine_budget", "mine", "mine_resume", "mitigate", "mitigate_preview", "compare_models",
         "explore", "explore_clusters"]


@pytest.mark.slow
def test_every_gpu_handler_yields_values_that_pickle_in_output_order(data_dir):
    import app

    engine = Engine("synthetic", data_dir=data_dir, max_images=16)
    demo = app.build_app(engine)
    gpu_fns = [fn for fn in demo.fns.values() if fn.fn is not None and is_gpu_handler(fn.fn)]
    handlers = {fn.api_name: fn for fn in gpu_fns if fn.api_visibility == "public"}
    # an event without an endpoint (Enter in the prompt box) runs a handler an endpoint also runs
    assert {id(fn.fn) for fn in gpu_fns} == {id(fn.fn) for fn in handlers.values()}
    made: dict = {}
    missing = [name for name in handlers if inputs(name, made) is None]
    assert not missing, f"GPU handlers without a sample request here: {missing}"   # a new one must be added
    assert {"single_prompt", "counterfactuals", "intersectional", "mine", "mitigate", "compare_models",
            "cf_propose_axes"} <= set(handlers)
    names = sorted(handlers, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    for name in names:
        block_fn = handlers[name]
        args, kwargs = inputs(name, made)
        result = block_fn.fn(*args, **kwargs)
        values = list(result) if hasattr(result, "__next__") else [result]
        assert values, name
        for value in values:
            again = pickle.loads(pickle.dumps(value))          # what `spaces` does to every yield
            if len(block_fn.outputs) > 1:
                assert isinstance(value, tuple) and len(value) == len(block_fn.outputs), name
                assert not any(isinstance(v, gr.components.Component) for v in value), name
            assert type(again) is type(value)
        last = values[-1]
        if name in ("single_prompt", "counterfactuals"):
            made[f"{name}_state"] = last[-1]
            made[f"{name}_run"] = last[-1]["run_id"]
        if name == "mine":
            made["mine_run"] = last[block_fn.outputs.index(next(c for c in block_fn.outputs
                                                                if isinstance(c, gr.State)))]["run_id"]
        if name == "explore":
            made["explore_run"] = last[-1]["node"]
        if name == "single_prompt":
            made["single_prompt_state"] = {**last[-1], "selected": next(iter(last[-1]["records"].values()))}


def test_only_device_models_ask_for_a_gpu():
    assert not needs_gpu(PRESETS["synthetic"].specs().values())
    assert not needs_gpu(PRESETS["colour"].specs().values())
    api = resolve_preset("synthetic", generator="openai:http://127.0.0.1:9/v1", vqa="labels:/tmp/labels.csv")[0]
    assert not needs_gpu(api.specs().values())
    assert not needs_gpu([ModelSpec("hf_dataset", "owner/images"), ModelSpec("folder", "/images")])
    assert needs_gpu(PRESETS["sd-turbo"].specs().values())
    mixed = resolve_preset("synthetic", vqa="blip_vqa:Salesforce/blip-vqa-base")[0]
    assert needs_gpu(mixed.specs().values()) and not needs_gpu([mixed.llm])   # propose axes asks the LLM only
    assert uses_device(ModelSpec("a_backend_added_later", "x"))              # unknown: assumed to need one


def test_zero_gpu_durations_are_honest():
    turbo, sd15, flux = PRESETS["sd-turbo"], PRESETS["sd15"], PRESETS["flux-schnell"]
    # A blank steps field means the preset's default (1 for SD-Turbo), not a slow guess: 16 images of
    # Single Prompt ask for far less than a visitor's two minutes of daily quota.
    assert gpu_seconds(turbo, images=16, steps=None, questions=3, llm_calls=1) == gpu_seconds(
        turbo, images=16, steps=1, questions=3, llm_calls=1) < 60
    assert gpu_seconds(sd15, images=16, steps=None) == gpu_seconds(sd15, images=16, steps=30)
    assert gpu_seconds(flux, images=4, steps=None) == gpu_seconds(flux, images=4, steps=4)
    # More images, steps, questions and LLM calls ask for more; within ZeroGPU's bounds.
    assert gpu_seconds(flux, images=8) > gpu_seconds(flux, images=4) > gpu_seconds(turbo, images=4)
    assert gpu_seconds(sd15, images=64, questions=6) > gpu_seconds(sd15, images=64, questions=1)
    assert gpu_seconds(turbo, images=2, llm_calls=20) > gpu_seconds(turbo, images=2, llm_calls=1)
    assert gpu_seconds(flux, images=10_000) == GPU_MAX_SECONDS
    assert gpu_seconds(turbo, images=1) == GPU_MIN_SECONDS
    # FLUX.1-schnell on the H200 MIG 3g.71gb slice (60 of 132 SMs): 0.3 s a step at 1024 px on a full
    # H200 becomes about 0.66 s; 8 images x 4 steps, a Qwen2.5-VL caption (1 s) and a CLIP embedding
    # (5 ms) each, with the 1.5 margin and 10 s of start-up.
    assert gpu_seconds(flux, images=8, steps=4) == pytest.approx(
        10 + 1.5 * (8 * (4 * 0.3 + 0.02) * 132 / 60 + 8 * 1.0 + 8 * 0.005), abs=1)
    # The synthetic world uses no device: only the floor (it never asks, see needs_gpu).
    assert gpu_seconds(PRESETS["synthetic"], images=128, llm_calls=50) == GPU_MIN_SECONDS
