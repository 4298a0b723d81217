"""The proof kit for a first GPU: do the real presets work end to end, and does the memory plan hold?

    python bench/gpu_smoke.py [--presets sd-turbo sdxl-turbo] [--report gpu_smoke_report.json]

About ten minutes on one GPU once the weights are cached (`python -m engine doctor --preset NAME`
lists the downloads). For each preset (default sd-turbo and sdxl-turbo, plus flux-schnell when a
Hugging Face token is set and the GPU has 48 GB or more):

  1. the doctor's self-test on the scikit-image astronaut (VQA, CLIP, one image);
  2. Single Prompt "a photo of a doctor", N=8, axes gender, age, skin tone and ethnicity, with the gap
     score (LLM);
  3. Counterfactuals of the same prompt, N=4, axes and counterfactuals proposed by the LLM.

Checks, per preset (each prints `PRESET.NAME=value`):
  self_test         every row of the doctor's self-test passed (real presets only: the synthetic
                    world's models do not read photographs, so there the rows are reported only)
  images_not_blank  every image has a pixel spread above 2 (not blank, not a flat colour)
  not_all_flagged   the safety checker did not flag every image of a set
  other_share       on every Single Prompt axis fewer than half the answers fall outside its classes
  cant_tell_share   on every Single Prompt axis fewer than half the answers are "can't tell"
  captions_text     every caption holds words
  llm_json          the LLM's JSON gave counterfactual prompts (axes with two or more each)
  peak_memory       torch.cuda.max_memory_allocated() after the runs is within the plan's peak plus
                    its reserve (engine.backends.device.CUDA_RESERVE_BYTES)

Prints `name=value` lines, `ok=1` or `ok=0` last, and writes one JSON report (environment, each
preset's plan, every check with its numbers, the failures) to attach to a bug report. Exits 1
when a check failed. In CI it runs on the synthetic preset with torch.cuda faked (tests/test_gpu_smoke.py).
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_PRESETS = ("sd-turbo", "sdxl-turbo")
FLUX = "flux-schnell"
FLUX_MIN_GB = 48
PROMPT = "a photo of a doctor"
AXES = ["gender", "age", "skin tone", "ethnicity"]   # every axis the audit measures with fixed classes
GB = 2**30


def presets_to_run(requested: list[str] | None, gpu_gb: float, has_token: bool) -> tuple[list[str], dict[str, str]]:
    """Returns (the presets to run, {preset: why it is skipped}): the requested ones, or
    DEFAULT_PRESETS plus flux-schnell where a token is set and the GPU has FLUX_MIN_GB."""
    if requested:
        return list(requested), {}
    if has_token and gpu_gb >= FLUX_MIN_GB:
        return [*DEFAULT_PRESETS, FLUX], {}
    why = "no Hugging Face token is set" if not has_token else f"the GPU has {gpu_gb:.0f} GB, fewer than {FLUX_MIN_GB}"
    return list(DEFAULT_PRESETS), {FLUX: f"skipped: {why}"}


def environment() -> dict:
    """The machine and software versions the report starts with."""
    import torch

    from engine import __version__
    from engine.backends.device import DeviceMemory

    props = torch.cuda.get_device_properties(0)
    versions = {}
    for name in ("diffusers", "transformers", "open_clip", "accelerate", "huggingface_hub"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing package is reported, not fatal
            versions[name] = None
    host = DeviceMemory().total_bytes("cpu")
    return {"gaplens": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0), "gpu_memory_gb": round(props.total_memory / GB, 1),
            "bf16_native": DeviceMemory().native_bf16("cuda"), "host_memory_gb": round(host / GB, 1) if host else None,
            **versions}


def check(ok: bool, value, detail: str = "") -> dict:
    return {"ok": bool(ok), "value": value, "detail": detail}


def image_checks(records: list) -> dict:
    """images_not_blank and not_all_flagged over the records of every set."""
    import numpy as np

    spreads = [float(np.asarray(r.image.convert("L"), np.float32).std()) for r in records if not r.refused]
    blank = sum(s <= 2 for s in spreads)
    flagged = sum(bool(r.nsfw) for r in records)
    return {"images_not_blank": check(spreads and not blank, round(min(spreads, default=0.0), 2),
                                      f"{blank} of {len(spreads)} image(s) blank (lowest pixel spread shown)"),
            "not_all_flagged": check(records and flagged < len(records), flagged,
                                     f"{flagged} of {len(records)} image(s) flagged by the safety checker")}


def single_prompt_checks(results: dict) -> dict:
    """other_share and cant_tell_share (per axis) and captions_text on a Single Prompt result."""
    shares, unsure = {}, {}
    for name, m in results.get("axes", {}).items():
        total = int(m.get("n", 0)) + int(m.get("n_excluded", 0))
        cant_tell = int(m.get("cant_tell", 0))
        shares[name] = round((m.get("n_excluded", 0) - cant_tell) / total, 3) if total else 1.0
        unsure[name] = round(cant_tell / total, 3) if total else 1.0
    captions = results.get("captions") or []
    texty = [c for c in captions if isinstance(c, str) and re.search(r"[A-Za-z]{2,}", c)]
    return {"other_share": check(shares and max(shares.values()) < 0.5, shares,
                                 "share of answers outside each axis' classes ('other', no person, ...)"),
            "cant_tell_share": check(unsure and max(unsure.values()) < 0.5, unsure,
                                     "share of \"can't tell\" answers on each axis (top probability below the "
                                     "threshold)"),
            "captions_text": check(captions and len(texty) == len(captions), len(texty),
                                   f"{len(texty)} of {len(captions)} caption(s) hold words, e.g. "
                                   f"{(captions or [''])[0]!r}")}


def counterfactual_checks(results: dict) -> dict:
    """llm_json on a Counterfactuals result: the LLM's JSON parsed into axes of counterfactual prompts."""
    axes = results.get("axes") or {}
    n = sum(len(cfs) for cfs in axes.values())
    return {"llm_json": check(axes and all(len(cfs) >= 2 for cfs in axes.values()), n,
                              f"{len(axes)} axis/axes, {n} counterfactual prompt(s): {sorted(axes)}")}


def memory_check(peak_bytes: int, plan) -> dict:
    """peak_memory: the measured peak within the plan's peak plus the CUDA reserve."""
    from engine.backends.device import CUDA_RESERVE_BYTES

    allowed = plan.peak_gb + CUDA_RESERVE_BYTES / GB
    return {"peak_memory": check(peak_bytes / GB <= allowed, round(peak_bytes / GB, 2),
                                 f"torch.cuda.max_memory_allocated {peak_bytes / GB:.2f} GB; plan: strategy "
                                 f"{plan.strategy}, peak {plan.peak_gb:.2f} GB + {CUDA_RESERVE_BYTES / GB:.1f} GB "
                                 f"reserve = {allowed:.2f} GB allowed")}


def run_preset(name: str, data_dir: str, env: dict, section: dict) -> None:
    """Runs the self-test and both methods on one preset, filling `section` (its part of the report)
    as it goes, so a failure keeps what was measured before it."""
    import torch

    from engine.core.engine import Engine
    from engine.backends.device import default_budget_bytes
    from engine.tools.doctor import run_self_test
    from engine.methods.counterfactuals import CounterfactualsRequest, run as counterfactuals
    from engine.methods.single_prompt import SinglePromptRequest, run as single_prompt
    from engine.models.plan import plan
    from engine.models.presets import PRESETS

    preset = PRESETS[name]
    synthetic = all(s.backend.startswith("synthetic") for s in preset.specs().values())
    section["plan"] = plan(preset, env["gpu_memory_gb"], budget_bytes=default_budget_bytes("cuda"),
                           bf16=env["bf16_native"]).as_json()
    torch.cuda.reset_peak_memory_stats()

    start = time.perf_counter()
    rows = run_self_test(preset, "cuda")
    section["self_test"] = [row.__dict__ for row in rows]
    failed = [row.name for row in rows if row.status != "pass"]
    section["checks"]["self_test"] = check(synthetic or not failed, len(rows) - len(failed),
                                           f"{len(rows) - len(failed)} of {len(rows)} row(s) passed"
                                           + (f"; failed: {', '.join(failed)}" if failed else "")
                                           + (" (reported only: the synthetic world does not read photographs)"
                                              if synthetic else ""))
    section["seconds"]["self_test"] = round(time.perf_counter() - start, 1)

    engine = Engine(name, data_dir=str(Path(data_dir) / name))
    records = []
    start = time.perf_counter()
    sp = _done(single_prompt(SinglePromptRequest(PROMPT, n=8, axes=AXES, n_boot=200), engine))
    section["seconds"]["single_prompt"] = round(time.perf_counter() - start, 1)
    records += engine.store.get_images([im["key"] for im in sp.results["images"]]).values()
    section["checks"].update(single_prompt_checks(sp.results))
    section["single_prompt"] = {"run": sp.run_id, "summary": sp.summary, "captions": sp.results.get("captions", [])[:4]}

    start = time.perf_counter()
    cf = _done(counterfactuals(CounterfactualsRequest(PROMPT, n=4, n_boot=100), engine))
    section["seconds"]["counterfactuals"] = round(time.perf_counter() - start, 1)
    records += engine.store.get_images([im["key"] for s in cf.results["sets"].values()
                                        for im in s["images"]]).values()
    section["checks"].update(counterfactual_checks(cf.results))
    section["counterfactuals"] = {"run": cf.run_id, "axes": cf.results.get("axes"), "mad": cf.results.get("mad")}

    section["checks"].update(image_checks(records))
    plan_now = plan(preset, env["gpu_memory_gb"], budget_bytes=default_budget_bytes("cuda"), bf16=env["bf16_native"])
    section["checks"].update(memory_check(torch.cuda.max_memory_allocated(), plan_now))
    section["models"] = engine.models.loaded()
    section["stats"] = engine.stats.__dict__
    engine.unload()


def _done(events):
    from engine.common.events import Done

    last = None
    for event in events:
        last = event
    if not isinstance(last, Done):
        raise RuntimeError(f"the run ended without a result ({type(last).__name__})")
    return last


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=None, help="presets to run (default: sd-turbo sdxl-turbo "
                        "[+ flux-schnell with a token on >= 48 GB])")
    parser.add_argument("--report", default="gpu_smoke_report.json", help="where the JSON report goes")
    parser.add_argument("--data-dir", default=None, help="store for the runs (default: a new temporary one, so "
                        "every image is generated and memory is exercised)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU: this kit measures a GPU (use `python -m engine doctor` on other machines)",
              file=sys.stderr)
        return 2
    from huggingface_hub import get_token

    env = environment()
    names, skipped = presets_to_run(args.presets, env["gpu_memory_gb"], bool(get_token()))
    report = {"environment": env, "presets": {}, "skipped": skipped}
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="gaplens-gpu-smoke-")
    lines = [f"gpu={env['gpu']}", f"gpu_memory_gb={env['gpu_memory_gb']}"]
    for name in names:
        section = report["presets"][name] = {"checks": {}, "seconds": {}}
        try:
            run_preset(name, data_dir, env, section)
        except Exception as exc:  # noqa: BLE001 - a preset that breaks is a failed preset, reported in full
            section["checks"]["completed"] = check(False, None, f"{type(exc).__name__}: {exc}")
            section["traceback"] = traceback.format_exc()
        lines += [f"{name}.{check_name}={_value(c['value'])}" for check_name, c in section["checks"].items()]
        lines += [f"{name}.{stage}_s={s}" for stage, s in section.get("seconds", {}).items()]
    report["failed"] = [f"{p}.{c}" for p, s in report["presets"].items() for c, v in s["checks"].items() if not v["ok"]]
    report["ok"] = not report["failed"]
    Path(args.report).write_text(json.dumps(report, indent=2, default=str))
    lines += [f"{name}.skipped={why}" for name, why in skipped.items()]
    lines += [f"failed={','.join(report['failed']) or 'none'}", f"report={args.report}", f"ok={int(report['ok'])}"]
    print("\n".join(lines))
    return 0 if report["ok"] else 1


def _value(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
