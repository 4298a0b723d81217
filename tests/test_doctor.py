"""`python -m engine doctor`: on a machine with no weights and no hub it says exactly that (no traceback);
with weights present it runs the self-test on scikit-image's astronaut and can fail it."""
import pytest

from engine.cli import main
from engine.backends import load_backend
from engine.tools.doctor import CLIP_CAPTIONS, diagnose, format_table
from tests import tiny_models


def test_without_weights_or_hub_doctor_says_so_and_exits_1(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["doctor", "--preset", "sd15", "--gpu-memory", "24"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in ("torch/device", "memory", "hub", "token", "weights", "wordnet", "self-test")}
    assert rows["memory"] == "PASS" and rows["hub"] == "FAIL" and rows["weights"] == "FAIL"
    assert rows["wordnet"] == "PASS" and rows["self-test"] == "SKIP"
    assert "not in the local cache and the hub is not reachable" in out and "HF_HUB_OFFLINE=1" in out
    assert "stable-diffusion-v1-5/stable-diffusion-v1-5" in out and "blip-image-captioning-large" in out
    assert out.rstrip().endswith("verdict: not ready (hub, weights failed)")
    assert main(["doctor", "--preset", "flux-schnell", "--gpu-memory", "24", "--no-self-test"]) == 1
    assert "memory        FAIL" in capsys.readouterr().out


@pytest.mark.real_model
def test_with_weights_present_the_self_test_runs_on_the_astronaut(tiny_root):
    pytest.importorskip("skimage")
    models = {"generator": tiny_models.build_tiny_sd(tiny_root), "embedder": tiny_models.build_tiny_clip_hf(tiny_root),
              "llm": tiny_models.build_tiny_chat_llm(tiny_root), "vqa": tiny_models.build_tiny_blip_vqa(tiny_root)}
    checks = {c.name: c for c in diagnose("sd-turbo", device="cpu", **models)}
    assert checks["weights"].status == "pass"
    assert checks["self-test generation"].status == "pass"
    # Random weights do not know the astronaut is a woman: the self-test must say so.
    assert checks["self-test vqa"].status == "fail" and "expected woman" in checks["self-test vqa"].detail
    # The clip row reports the caption the embedder itself ranks first, and passes only on the astronaut's.
    best = _caption_ranked_first(models["embedder"])
    assert f"the embedder ranked '{best}' first" in checks["self-test clip"].detail
    assert checks["self-test clip"].status == ("pass" if best == CLIP_CAPTIONS[0] else "fail")
    assert "verdict: not ready" in format_table(list(checks.values()))


def _caption_ranked_first(spec) -> str:
    """The caption of CLIP_CAPTIONS whose text embedding is closest to the astronaut photo's, computed here."""
    import numpy as np
    from PIL import Image
    from skimage import data as skdata

    model = load_backend(spec, device="cpu")
    scores = model.embed_texts(CLIP_CAPTIONS) @ model.embed_images([Image.fromarray(skdata.astronaut())])[0]
    return CLIP_CAPTIONS[int(np.argmax(scores))]
