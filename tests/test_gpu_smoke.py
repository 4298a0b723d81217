"""The first-GPU proof kit (bench/gpu_smoke.py) on the synthetic preset, with the GPU faked only where
torch.cuda answers (device, memory, bf16, peak allocation): it runs the doctor's self-test, Single
Prompt and Counterfactuals, checks the results and the measured peak against the plan, prints
name=value lines and writes one JSON report; each check fails when it should."""
import importlib.util
import json
import types
from pathlib import Path

import pytest
import torch
from PIL import Image

from engine.store.store import ImageRecord

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_smoke.py"


@pytest.fixture(scope="module")
def kit():
    spec = importlib.util.spec_from_file_location("gpu_smoke", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda answering for a 24 GB card with native bf16; `peak` sets max_memory_allocated."""
    gpu = types.SimpleNamespace(peak=int(0.8 * 2**30), resets=0)
    props = types.SimpleNamespace(total_memory=24 * 2**30, name="Fake GPU", major=8, minor=6)

    def reset(*args):
        gpu.resets += 1

    for name, value in {"is_available": lambda: True, "device_count": lambda: 1,
                        "get_device_properties": lambda index=0: props, "get_device_name": lambda index=0: props.name,
                        "is_bf16_supported": lambda including_emulation=True: True,
                        "reset_peak_memory_stats": reset, "max_memory_allocated": lambda *a: gpu.peak}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return gpu


def run_kit(kit, capsys, tmp_path, *argv):
    code = kit.main(["--presets", "synthetic", "--report", str(tmp_path / "report.json"),
                     "--data-dir", str(tmp_path / "store"), *argv])
    lines = capsys.readouterr().out.strip().splitlines()
    values = dict(line.split("=", 1) for line in lines)
    return code, lines, values, json.loads((tmp_path / "report.json").read_text())


def test_the_kit_runs_each_stage_and_writes_one_report(kit, fake_gpu, capsys, tmp_path):
    code, lines, values, report = run_kit(kit, capsys, tmp_path)
    assert code == 0 and lines[-1] == "ok=1" and values["failed"] == "none"
    for check in ("self_test", "images_not_blank", "not_all_flagged", "other_share", "cant_tell_share", "captions_text",
                  "llm_json", "peak_memory"):
        assert f"synthetic.{check}" in values
    assert values["gpu"] == "Fake GPU" and values["synthetic.peak_memory"] == "0.8"
    section = report["presets"]["synthetic"]
    assert all(c["ok"] for c in section["checks"].values())
    assert report["environment"]["gpu_memory_gb"] == 24.0 and report["environment"]["bf16_native"] is True
    assert section["plan"]["preset"] == "synthetic" and section["plan"]["budget_gb"] == 22.5
    assert [row["name"] for row in section["self_test"]] == ["self-test vqa", "self-test clip", "self-test generation"]
    assert section["checks"]["llm_json"]["value"] >= 2 and section["counterfactuals"]["axes"]
    counterfactuals = sum(len(cfs) for cfs in section["counterfactuals"]["axes"].values())
    # 8 for Single Prompt, 4 per counterfactual; the initial set's 4 are the first Single Prompt images
    assert section["stats"]["images_generated"] == 8 + 4 * counterfactuals
    assert section["stats"]["image_cache_hits"] >= 4
    assert fake_gpu.resets == 1                                                   # the peak is per preset
    assert "synthetic.single_prompt_s" in values and "synthetic.counterfactuals_s" in values


def test_a_peak_above_the_plan_plus_its_reserve_fails(kit, fake_gpu, capsys, tmp_path):
    fake_gpu.peak = 2 * 2**30        # the synthetic world plans 0 GB; the reserve allows 1.5
    code, lines, values, report = run_kit(kit, capsys, tmp_path)
    assert code == 1 and lines[-1] == "ok=0" and values["failed"] == "synthetic.peak_memory"
    check = report["presets"]["synthetic"]["checks"]["peak_memory"]
    assert not check["ok"] and check["value"] == 2.0 and "1.50 GB allowed" in check["detail"]
    assert report["failed"] == ["synthetic.peak_memory"] and report["ok"] is False


def test_each_check_fails_on_what_it_guards(kit):
    def record(image, nsfw=False):
        return ImageRecord(key="k", prompt="p", seed=0, path="", nsfw=nsfw, _image=image)

    noise = Image.effect_noise((64, 64), 60).convert("RGB")
    assert kit.image_checks([record(noise)])["images_not_blank"]["ok"]
    assert not kit.image_checks([record(noise), record(Image.new("RGB", (64, 64), "white"))])["images_not_blank"]["ok"]
    assert not kit.image_checks([record(noise, nsfw=True)])["not_all_flagged"]["ok"]
    axes = {"gender": {"n": 8, "n_excluded": 0}, "age": {"n": 3, "n_excluded": 5},
            "skin tone": {"n": 3, "n_excluded": 5, "cant_tell": 5}, "ethnicity": {"n": 6, "n_excluded": 2, "cant_tell": 1}}
    checks = kit.single_prompt_checks({"axes": axes, "captions": ["a doctor in a white coat", ""]})
    assert checks["other_share"]["value"] == {"gender": 0.0, "age": 0.625, "skin tone": 0.0, "ethnicity": 0.125}
    assert not checks["other_share"]["ok"]
    assert checks["cant_tell_share"]["value"] == {"gender": 0.0, "age": 0.0, "skin tone": 0.625, "ethnicity": 0.125}
    assert not checks["cant_tell_share"]["ok"]                                  # skin tone: the evaluator cannot tell
    assert not checks["captions_text"]["ok"]
    assert kit.counterfactual_checks({"axes": {"gender": ["a male doctor", "a female doctor"]}})["llm_json"]["ok"]
    assert not kit.counterfactual_checks({"axes": {}})["llm_json"]["ok"]


def test_flux_joins_only_with_a_token_on_48_gb(kit):
    assert kit.presets_to_run(None, 80, True) == (["sd-turbo", "sdxl-turbo", "flux-schnell"], {})
    assert kit.presets_to_run(None, 24, True)[1] == {"flux-schnell": "skipped: the GPU has 24 GB, fewer than 48"}
    assert kit.presets_to_run(None, 80, False)[1] == {"flux-schnell": "skipped: no Hugging Face token is set"}
    assert kit.presets_to_run(["sd15"], 8, False) == (["sd15"], {})


def test_without_a_gpu_it_says_so_and_stops(kit, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kit.main(["--report", str(tmp_path / "r.json")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err and not (tmp_path / "r.json").exists()
