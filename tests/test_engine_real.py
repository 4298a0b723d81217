"""The engine over a real diffusers pipeline (tiny random weights, saved and reloaded through
from_pretrained): seeds, streaming, store, safety flags, load failures."""
import json

import numpy as np
import pytest

from engine.core.engine import Engine
from engine.common.errors import ModelLoadError
from engine.common.events import Warning
from engine.methods.generate import GenerateRequest, run as generate
from engine.methods.single_prompt import SinglePromptRequest, run as single_prompt
from tests import tiny_models

from runhelpers import done_event

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def tiny_sd(tiny_root):
    return tiny_models.build_tiny_sd(tiny_root), tiny_models.build_tiny_sd(tiny_root, name="tiny-sd-nsfw",
                                                                            flag_everything=True)


def test_engine_generates_through_diffusers_with_one_seed_per_image(tiny_sd, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=tiny_sd[0])
    settings = engine.settings(steps=2)
    assert engine.models.get(tiny_sd[0]).family == "sd1"
    batch = engine.image_set("a photo of a doctor", [5, 6, 7, 8], settings)
    assert [r.seed for r in batch] == [5, 6, 7, 8]
    assert all(r.image.size == (settings.width, settings.height) for r in batch)
    alone = Engine("synthetic", data_dir=data_dir + "-2", generator=tiny_sd[0])
    alone.models = engine.models
    single = alone.image_set("a photo of a doctor", [7], settings)[0]
    diff = np.abs(np.asarray(single.image, np.int16) - np.asarray(batch[2].image, np.int16)).max()
    assert diff <= 1  # seed 7 regenerated alone matches seed 7 generated in a batch
    assert engine.regenerate_check("a photo of a doctor", 7, settings, batch[2].key)[1] <= 1
    again = engine.image_set("a photo of a doctor", [5, 6, 7, 8], settings)
    assert [r.key for r in again] == [r.key for r in batch] and all(r.cached for r in again)
    assert engine.stats.generator_calls == 2  # one batch, one regenerate_check; the rerun was free


def test_flagged_images_are_kept_marked_and_excluded_from_metrics(tiny_sd, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=tiny_sd[1])
    events = list(generate(GenerateRequest("a photo of a doctor", n=3, steps=1), engine))
    done = done_event(events)
    assert all(r["nsfw"] for r in done.results["images"]) and done.summary["flagged"] == 3
    assert any(isinstance(e, Warning) and "flagged" in e.message for e in events)
    pixels = np.asarray(engine.store.get_images([done.results["images"][0]["key"]])[done.results["images"][0]["key"]].image)
    assert pixels.std() > 0  # never blacked out


def test_a_model_that_fails_to_load_is_named_and_earlier_results_stay(tiny_sd, data_dir, tmp_path):
    engine = Engine("synthetic", data_dir=data_dir)
    list(generate(GenerateRequest("a photo of a doctor", n=4), engine))
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline",
                                                         "unet": ["diffusers", "UNet2DConditionModel"]}))
    engine.set_preset("synthetic", generator=f"diffusers:{broken}")
    with pytest.raises(ModelLoadError, match="broken-model"):
        list(single_prompt(SinglePromptRequest("a photo of a doctor", n=4), engine))
    assert engine.store.count("images") == 4
    assert [r["status"] for r in engine.store.list_runs()] == ["failed", "done"]
