"""What crosses ZeroGPU's process boundary (issue 21): every GPU handler of the app, found by the mark
`tabs.common.gpu` leaves, yields values that survive pickle.dumps/loads, in output order; which requests
ask ZeroGPU for a GPU, and for how long: every handler asks for the work it does, on each hardware profile
(issue 41); and a request a handler refuses never reaches the GPU function (issue 42)."""
import functools
import json
import pickle
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from importlib.resources import files

import gradio as gr
import pytest

from engine.backends import uses_device
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.methods import explore as explore_method
from engine.models.presets import PRESETS, SYNTHETIC_TABLE, resolve_preset
from engine.backends.device import H200_PROFILE
from engine.common.events import Done
from engine.backends.gpu_costs import CAPTION_SECONDS, EMBED_SECONDS, QUESTION_SECONDS, image_seconds
from engine.hosting.space import (GPU_MAX_SECONDS, GPU_MIN_SECONDS, MARGIN, START_SECONDS, GpuWork, granted_seconds,
                                  gpu_seconds, needs_gpu, throughput, work_seconds, xlarge)
from tabs.common import gpu_work, is_gpu_handler

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
        # a click on a dot of Explore's strips (no endpoint): the open node's image
        "clicked": ((made.get("explore_view"), gr.EventData(None, {"key": (made.get("explore_view") or {"keys": [""]})
                                                                  ["keys"][0]})), {}),
    }
    table["mitigate_preview"] = table["mitigate"]
    for prefix in ("cf", "ic", "mt", "cm"):
        table[f"{prefix}_propose_axes"] = ((PROMPT, ""), {})
    return table.get(api_name)


# the order the requests run in: a later one uses what an earlier one made
ORDER = ["single_prompt", "regenerate", "sp_spot_compare", "runs_spot_compare", "counterfactuals", "cf_spot_compare",
         "intersectional", "mine_budget", "mine", "mine_resume", "mitigate", "mitigate_preview", "compare_models",
         "explore", "clicked", "explore_clusters"]


@pytest.fixture
def zero_gpu(monkeypatch):
    """The app's GPU handlers as on ZeroGPU, in this process (tests/zerogpu.InProcessGPU), every request
    taken to use a device model (as with a real preset) though the synthetic world answers it."""
    import spaces   # before SPACES_ZERO_GPU is set: it must not patch this process's torch
    import tabs.common
    from tests.zerogpu import InProcessGPU

    gpu = InProcessGPU()
    monkeypatch.setattr(spaces, "GPU", gpu.GPU)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(tabs.common, "needs_gpu", lambda specs: True)
    return gpu


def gpu_handlers(demo) -> dict:
    """Every GPU handler of the app (the mark `tabs.common.gpu` leaves): by its endpoint's name, or by its
    function's name when only an event without endpoint runs it (a click on a chart). An event without an
    endpoint that runs a handler an endpoint also runs (Enter in the prompt box) is that handler."""
    gpu_fns = [fn for fn in demo.fns.values() if fn.fn is not None and is_gpu_handler(fn.fn)]
    handlers = {fn.api_name: fn for fn in gpu_fns if fn.api_visibility == "public"}
    served = {handler_key(fn.fn) for fn in handlers.values()}
    return {**handlers, **{fn.name: fn for fn in gpu_fns if handler_key(fn.fn) not in served}}


def handler_key(fn) -> tuple:
    """What tells GPU handlers apart: the GPU function (its work's mark) and the arguments bound to it."""
    work = gpu_work(fn)
    return (id(work.func), work.args, tuple(work.keywords.items())) if isinstance(work, functools.partial) else (
        id(work), (), ())


def gpu_functions(handlers: dict) -> int:
    """How many GPU functions `handlers` run (handlers bound to different arguments may share one)."""
    return len({key[0] for key in map(handler_key, (fn.fn for fn in handlers.values()))})


def remember(name: str, block_fn, values: list, made: dict, engine) -> None:
    """What later requests use of a handler's last output (its run, its view)."""
    last = values[-1]
    if name in ("single_prompt", "counterfactuals"):
        made[f"{name}_state"] = last[-1]
        made[f"{name}_run"] = last[-1]["run_id"]
    if name == "mine":
        made["mine_run"] = last[block_fn.outputs.index(next(c for c in block_fn.outputs
                                                            if isinstance(c, gr.State)))]["run_id"]
    if name == "explore":
        node = last[-1]["node"]
        made["explore_run"] = node
        made["explore_view"] = {"tree": last[-1]["tree"], "node": node, "keys": [
            i["key"] for i in explore_method.node_images(engine.store.get_run(node)["results"])]}
    if name == "single_prompt":
        made["single_prompt_state"] = {**last[-1], "selected": next(iter(last[-1]["records"].values()))}


@pytest.mark.slow
def test_every_gpu_handler_yields_values_that_pickle_in_output_order(data_dir):
    import app

    engine = Engine("synthetic", data_dir=data_dir, max_images=16)
    demo = app.build_app(engine)
    handlers = gpu_handlers(demo)
    made: dict = {}
    missing = [name for name in handlers if inputs(name, made) is None]
    assert not missing, f"GPU handlers without a sample request here: {missing}"   # a new one must be added
    assert {"single_prompt", "counterfactuals", "intersectional", "mine", "mitigate", "compare_models",
            "cf_propose_axes", "clicked"} <= set(handlers)
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
        remember(name, block_fn, values, made, engine)


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


# -- what ZeroGPU grants on each hardware profile (issue 41) --------------------------------------------------
def spaces_grants(asked: int, xlarge_size: bool) -> float:
    """The seconds `spaces` schedules for a GPU function that asked for `asked` on the profile its
    config reports (spaces/zero/client.get_duration_seconds, the package's own code)."""
    from spaces.zero import client

    return client.get_duration_seconds(timedelta(seconds=asked), "xlarge" if xlarge_size else None)


@pytest.mark.parametrize("preset_name", ["sd-turbo", "flux-schnell"])
def test_zero_gpu_grants_the_time_the_work_takes_on_the_h200_slice_and_the_blackwell(preset_name, monkeypatch):
    """The issue's case, 64 images with 8 questions each: on the RTX PRO 6000 Blackwell (its throughput 1/1.5
    of the slice's, spaces' own duration_factor) spaces multiplies the duration asked by 1.5 (FLUX's weights
    are above the xlarge threshold there: no factor); what it grants is the time the work takes there, never
    the third of it that counting SMs across architectures asked for (24 s granted 36 s for sd-turbo)."""
    from spaces.zero import config as zero_config

    from engine.backends import device
    from engine.backends.diffusers_generator import default_steps, family_of

    preset, work = PRESETS[preset_name], GpuWork.of_images(64, questions=8)
    on_slice = work_seconds(preset, work, H200_PROFILE)
    # the slice's figure from the cost tables: denoising on 60 of the H200's 132 SMs, evaluation as it is
    vqa = preset.vqa
    caption = CAPTION_SECONDS[vqa.backend] if vqa.backend == "vlm" or vqa.options.get("caption_model") else 0
    image = image_seconds(family_of(preset.generator), default_steps(preset.generator))
    assert on_slice == pytest.approx(64 * image * 132 / 60 + 64 * (8 * QUESTION_SECONDS[vqa.backend] + caption
                                                                   + EMBED_SECONDS))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    for model, speed in (("NVIDIA H200", 1.0), (BLACKWELL["model"], 1 / 1.5)):
        monkeypatch.setattr(zero_config, "_read_gpu_information", lambda model=model: f"Model: \t\t {model}\n")
        zero_config.get_config.cache_clear()
        try:
            profile = device.zero_gpu_profile()
            grants = spaces_grants(gpu_seconds(preset, work), xlarge(preset, profile))   # the profile spaces reports
        finally:
            zero_config.get_config.cache_clear()
        needed = min(GPU_MAX_SECONDS, START_SECONDS + MARGIN * on_slice / speed)
        assert needed <= grants <= needed + 2, (model, grants, needed)
    assert xlarge(preset, BLACKWELL) == (preset_name == "flux-schnell")


def test_a_profile_gaplens_does_not_know_is_never_counted_faster_than_the_slice():
    """A newer card `spaces` may report (its SMs are not a throughput across architectures): its work takes
    at least the slice's time, more when its duration_factor says so, and what spaces grants covers it."""
    turbo, work = PRESETS["sd-turbo"], GpuWork.of_images(64, questions=8)
    on_slice = granted_seconds(turbo, work, H200_PROFILE)
    for factor in (0.5, 1.0, 2.0):
        profile = {**H200_PROFILE, "model": "NVIDIA B300", "sm_count": 400, "duration_factor": factor}
        assert throughput(profile) == min(1.0, 1 / factor)
        assert work_seconds(turbo, work, profile) >= work_seconds(turbo, work, H200_PROFILE)
        assert round(gpu_seconds(turbo, work, profile=profile) * factor) >= granted_seconds(turbo, work, profile) >= on_slice


# -- the duration contract (issue 41): every GPU handler asks ZeroGPU for the work it does -------------------
BLACKWELL = next(c for c in json.loads(files("spaces.zero").joinpath("configs.json").read_text())
                 if "Blackwell" in c["model"])
PROFILES = {"H200 slice": H200_PROFILE, "RTX PRO 6000 Blackwell": BLACKWELL}
COSTED = ("sd-turbo", "flux-schnell")   # the real presets the synthetic world's calls are costed as
UNITS = {"generate": "images", "answer": "answers", "answer_classes": "answers", "answer_questions": "answers",
         "caption": "captions", "embed_images": "embeddings", "chat": "llm_calls"}


class Counted:
    """A loaded backend whose GPU calls are counted into `ledger` in GpuWork's units (the GPU cost model's,
    engine/backends/gpu_costs.py: images generated, VQA answers, captions, image embeddings, LLM replies).
    A call made inside another counted call (a CLIP VQA's image embedding) is part of that call's cost."""

    def __init__(self, backend, ledger: Counter, busy: list):
        self._backend = backend
        for name, unit in UNITS.items():
            call = getattr(backend, name, None)
            if callable(call):
                setattr(self, name, self._counted(call, unit, ledger, busy))

    def __getattr__(self, name):
        return getattr(self._backend, name)

    @staticmethod
    def _counted(call, unit: str, ledger: Counter, busy: list):
        def counted(*args, **kwargs):
            if not busy:
                ledger[unit] += (1 if unit == "llm_calls" else len(args[1]) if unit == "images" else
                                 len(args[0]) * len(args[1]) if call.__name__ == "answer_questions" else len(args[0]))
            busy.append(unit)
            try:
                return call(*args, **kwargs)
            finally:
                busy.pop()
        return counted


def costed(work, preset) -> list:
    """`work` (a GpuWork or a list) as the real `preset` would do it: every part's generator and evaluator
    the preset's (the synthetic world's calls stand for its models' calls)."""
    return [replace(part, generator=None, vqa=None) for part in ([work] if isinstance(work, GpuWork) else work)]


def granted(preset, work, profile) -> int:
    """The seconds ZeroGPU grants for the duration GapLens asks (spaces/zero/client.get_duration_seconds:
    multiplied by the profile's duration_factor, except for the xlarge size)."""
    factor = 1.0 if xlarge(preset, profile) else profile["duration_factor"]
    return round(gpu_seconds(preset, work, profile=profile) * factor)


def contract_inputs(name: str, made: dict):
    """(args, kwargs) of the duration contract's requests: each does GPU work (nothing it needs is stored
    yet): the stored runs' handlers on runs whose images nothing embedded ("generated", "generated_more",
    "generated_also") or no other evaluator answered ("measured")."""
    table = {
        # the form's N is not what a stored run's images cost (issue 41: it was counted)
        "explore": ((), dict(prompt="", concepts="a photo of a man\na photo of a woman", versus="", n=1, seed=0,
                             run_id=made.get("generated"), inverse="an old pilot", carrier="", m=1, parent="",
                             negative_prompt="", steps=None, guidance=None, width=None, height=None,
                             axes=["gender", "age", "skin tone"])),
        "explore_clusters": (([made.get("single_prompt_run"), made.get("generated_more"), made.get("generated_also")],
                              3), {}),
        "sp_spot_compare": ((made.get("single_prompt_state"), "clip_vqa:synthetic"), {}),
        "runs_spot_compare": ((made.get("measured"), "clip_vqa:synthetic"), {}),
        "cf_spot_compare": ((made.get("counterfactuals_state"), "clip_vqa:synthetic"), {}),
    }
    for endpoint, job in (("mitigate", "chef"), ("mitigate_preview", "baker")):   # sets nothing else made
        table[endpoint] = ((), {**inputs(endpoint, made)[1], "prompt": f"a photo of a {job}", "table": [
            [axis if i % 2 == 0 else "", f"a photo of a {word} {job}"]
            for i, (axis, word) in enumerate((("gender", "male"), ("gender", "female"), ("age", "young"),
                                              ("age", "old")))]})
    for prefix, job in (("cf", "nurse"), ("ic", "pilot"), ("mt", "farmer"), ("cm", "teacher")):
        table[f"{prefix}_propose_axes"] = ((f"a photo of a {job}", ""), {})
    return table.get(name) or inputs(name, made)


@pytest.mark.slow
def test_every_gpu_handler_asks_zero_gpu_for_the_work_it_does_on_each_profile(data_dir, zero_gpu, monkeypatch,
                                                                                capsys):
    """Every GPU handler's request runs on the synthetic world (as on ZeroGPU: through spaces.GPU, emulated
    in this process) with its calls counted; costed as a real preset's by the GPU cost model on the H200
    slice and on the RTX PRO 6000 Blackwell, the work done fits the work the handler asked for, and start-up
    plus that work fits the seconds ZeroGPU grants for the duration asked."""
    import app
    from engine.methods import generate, mine, single_prompt
    from engine.models import manager

    ledger, busy = Counter(), []
    monkeypatch.setattr(mine, "SPEEDS", {})   # the budget's probe measures speeds not measured in this process
    loader = manager.load_backend
    monkeypatch.setattr(manager, "load_backend", lambda *a, **k: Counted(loader(*a, **k), ledger, busy))
    engine = Engine("synthetic", data_dir=data_dir, max_images=32)
    made = {}
    for key, method, request in (("generated", generate, generate.GenerateRequest("a photo of a nurse", n=32)),
                                 ("generated_more", generate, generate.GenerateRequest("a photo of a judge", n=32)),
                                 ("generated_also", generate, generate.GenerateRequest("a photo of a baker", n=32)),
                                 ("measured", single_prompt, single_prompt.SinglePromptRequest(
                                     "a photo of a ceo", n=6, axes=["gender", "age"]))):
        made[key] = [e for e in method.run(request, engine) if isinstance(e, Done)][0].run_id
    demo = app.build_app(engine)
    handlers = gpu_handlers(demo)
    # every GPU function the app made is run by one of these (none hides behind another event function)
    assert len(zero_gpu.made) == gpu_functions(handlers)
    assert not [name for name in handlers if contract_inputs(name, made) is None]
    rows = []
    for name in sorted(handlers, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        block_fn = handlers[name]
        args, kwargs = contract_inputs(name, made)
        asked = gpu_work(block_fn.fn)(*args, **kwargs)   # before the call, as spaces asks
        ledger.clear()
        result = block_fn.fn(*args, **kwargs)
        values = list(result) if hasattr(result, "__next__") else [result]
        remember(name, block_fn, values, made, engine)
        parts = [asked] if isinstance(asked, GpuWork) else asked
        done = GpuWork(images=ledger["images"], steps=parts[0].steps, answers=ledger["answers"],
                       captions=ledger["captions"], embeddings=ledger["embeddings"], llm_calls=ledger["llm_calls"])
        assert sum(ledger.values()) > 0, f"{name}: the sample request does no GPU work"
        for preset_name in COSTED:
            preset = PRESETS[preset_name]
            for profile_name, profile in PROFILES.items():
                simulated = work_seconds(preset, done, profile)
                counted = work_seconds(preset, costed(asked, preset), profile)
                given = granted(preset, costed(asked, preset), profile)
                rows.append((name, preset_name, profile_name, gpu_seconds(preset, costed(asked, preset), profile=profile),
                             given, START_SECONDS + simulated))
                assert simulated <= counted + 1e-9, (name, preset_name, profile_name, done, asked)
                assert START_SECONDS + simulated <= given, (name, preset_name, profile_name, done, asked)
    with capsys.disabled():   # the closing note's table: asked, granted and simulated seconds
        print("\n| handler | preset | profile | asked s | granted s | start + simulated s |\n|---|---|---|---|---|---|")
        for row in rows:
            print("| {} | {} | {} | {} | {} | {:.1f} |".format(*row))


# -- a refused request never takes a ZeroGPU slot (issue 42) --------------------------------------------------
def refused_inputs(name: str, a: dict, offered_vqa: str):
    """(args, kwargs) of a request visitor B sends that its handler refuses: another visitor's (A's) run or
    node (`a`), or a value out of bounds. A GPU handler added later needs one here."""
    table = {
        "single_prompt": ((), {**SINGLE, "n": 10_000}),
        "regenerate": ((a["single_prompt_state"],), {}),
        "sp_spot_compare": ((a["single_prompt_state"], offered_vqa), {}),
        "runs_spot_compare": (([a["single_prompt_run"]], offered_vqa), {}),
        "cf_spot_compare": ((a["counterfactuals_state"], offered_vqa), {}),
        "counterfactuals": (inputs("counterfactuals", a)[0][:3] + [10_000] + inputs("counterfactuals", a)[0][4:], {}),
        "intersectional": (inputs("intersectional", a)[0], {**inputs("intersectional", a)[1], "n": 10_000}),
        "mine_budget": ([*MINE[:3], 10_000, *MINE[4:]], {}),
        "mine": ([*MINE[:3], 10_000, *MINE[4:]], {}),
        "mine_resume": ((a["mine_run"], 3), {}),
        "mitigate": ((), {**inputs("mitigate", a)[1], "n": 10_000}),
        "mitigate_preview": ((), {**inputs("mitigate", a)[1], "n": 10_000}),
        "compare_models": (("single_prompt", ["synthetic", "colour"], "", PROMPT, "", ROWS, 10_000, 0, ["gender"]), {}),
        "explore": ((), {**inputs("explore", a)[1], "parent": a["explore_run"]}),
        "explore_clusters": (([a["single_prompt_run"]], 2), {}),
        "languages_propose": (("", ["en", "de"]), {}),                       # no prompt to translate
        "languages": ((), {**{k: v for k, v in inputs("languages", a)[1].items() if k != "proposed"},  # a State
                           "n": 10_000}),
    }
    return table[name]


def over_api(sample):
    """A request's (args, kwargs) as gradio_client sends them: an axes table as Dataframe data."""
    def sent(value):
        return {"headers": ["axis", "counterfactual"], "data": value} if value is ROWS else value
    args, kwargs = sample
    return [sent(v) for v in args], {k: sent(v) for k, v in kwargs.items()}


@pytest.mark.slow
def test_a_refused_request_never_enters_the_gpu_function(tmp_path, zero_gpu):
    """A public GapLens on ZeroGPU (emulated in this process, tests/zerogpu.InProcessGPU): visitor B calls every
    GPU endpoint directly, skipping the checks its button runs first, with visitor A's runs and nodes or with
    values out of bounds. Each is refused with its sentence before any GPU function is scheduled, while A's own
    requests are scheduled (one GPU call each). Propose with no prompt says so beside the table, and a click
    on a dot that is no image of the open node does nothing: neither asks for a GPU."""
    import app
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from apphelpers import running_app
    from engine.common import access
    from tabs import explore as explore_tab
    from engine.hosting import backend_choices

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True, max_images=16)
    demo = app.build_app(engine)
    handlers = gpu_handlers(demo)
    with running_app(engine, demo) as url:
        a, b = Client(url, verbose=False), Client(url, verbose=False)
        for name in ("single_prompt", "counterfactuals", "mine", "explore"):   # A's runs: one GPU call each
            before = len(zero_gpu.scheduled)
            args, kwargs = over_api(inputs(name, {}))
            a.predict(*args, api_name=f"/{name}", **kwargs)
            assert len(zero_gpu.scheduled) == before + 1, name
        with access.acting_as(access.HOST):   # A's runs as A's views hold them (an API client gets no state)
            runs = {r["method"]: engine.store.get_run(r["id"]) for r in engine.store.list_runs()}
        single = runs["single_prompt"]
        made = {f"{m}_run": r["id"] for m, r in runs.items()} | {
            "counterfactuals_state": {"run_id": runs["counterfactuals"]["id"]},
            "single_prompt_state": {"run_id": single["id"], "request": single["request"],
                                    "selected": {"key": single["images"][0]["image_key"], "seed": 0}}}
        offered_vqa = next(iter(backend_choices.offered(engine, "vqa")))
        scheduled, refused = len(zero_gpu.scheduled), {}
        for name, block_fn in handlers.items():
            if name.endswith("_propose_axes"):
                assert "No axes proposed" in b.predict("", "", api_name=f"/{name}")[1], name
            elif name == "clicked":    # no endpoint: a click on a dot of the open node's strips
                assert block_fn.fn(None, {"keys": []}, gr.EventData(None, {"key": "f" * 64}))[1] == explore_tab.NO_IMAGE
            else:
                args, kwargs = over_api(refused_inputs(name, made, offered_vqa))
                with pytest.raises(AppError) as error:
                    b.predict(*args, api_name=f"/{name}", **kwargs)
                refused[name] = str(error.value)
            assert len(zero_gpu.scheduled) == scheduled, f"{name}: a refused request was scheduled on the GPU"
    assert "no run" in refused["runs_spot_compare"] and "no tree node" in refused["explore"], refused
    assert "no Mine Prompts run" in refused["mine_resume"], refused
