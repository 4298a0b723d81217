"""Fine-tunes as generators (issue 44): 'diffusers:BASE+lora=REPO_OR_PATH[@SCALE]' specs, a tiny random LoRA
saved by save_lora_weights loaded through the real from_pretrained / load_lora_weights path (it changes the
images and the model id, so no cached image is reused across adapters or scales), a LoRA that does not fit
its base refused in one sentence, an embedding, the memory plan, and public mode's allow-list."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from engine.backends import adapters
from engine.backends.base import ModelSpec
from engine.common import access
from engine.common.errors import InputError, ModelLoadError, NotAllowedError
from engine.core.engine import Engine
from engine.hosting import backend_choices
from engine.hosting.limits import Budget
from engine.models.presets import PRESETS, parse_model_override
from tests import tiny_models

PROMPT = "a photo of a doctor"
SD15 = PRESETS["sd15"].generator.model


# -- specs ----------------------------------------------------------------------------------------------

def test_a_lora_spec_is_its_base_with_adapter_options_and_reads_back_as_typed():
    text = f"diffusers:{SD15}+lora=user/doctor-lora@0.8,weight_name=a.safetensors+lora=/loras/b.safetensors+ti=/e.bin,trigger=<s>"
    spec = parse_model_override(text, "generator")
    assert spec.model == SD15
    assert spec.options == {"lora": [{"source": "user/doctor-lora", "scale": 0.8, "weight_name": "a.safetensors"},
                                     {"source": "/loras/b.safetensors", "scale": 1.0}],
                            "textual_inversion": [{"source": "/e.bin", "trigger": "<s>"}]}
    assert parse_model_override(spec.label, "generator") == spec
    assert spec.full_label == spec.label       # the adapters are in the label, not repeated as options
    # the same generator built in code, as --generator-option lora=[...] gives it
    assert ModelSpec("diffusers", SD15, {"lora": [{"source": "u/x", "scale": 0.5}]}).label == f"diffusers:{SD15}+lora=u/x@0.5"


@pytest.mark.parametrize("text, message", [
    ("diffusers:+lora=u/x", "no base model"),
    (f"diffusers:{SD15}+lora=u/x,rank=4", "not one of weight_name="),
    (f"diffusers:{SD15}+lora=", "needs a hub repository or a file"),
    ("synthetic_generator:default+lora=u/x", "diffusers generators only"),
])
def test_malformed_adapter_specs_are_one_sentence(text, message):
    with pytest.raises(InputError, match=message):
        parse_model_override(text, "generator")


def test_an_adapter_path_with_an_at_sign_keeps_it_when_no_scale_follows():
    _, options = adapters.parse_model("base+lora=/data/run@2024/lora.safetensors")
    assert options["lora"] == [{"source": "/data/run@2024/lora.safetensors", "scale": 1.0}]


def test_a_hosts_allow_list_offers_loras_like_generators_and_a_visitor_cannot_name_another(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True, max_images=64,
                    budget=Budget(hourly_images=10**6),
                    public_generators=f"doctor-lora=diffusers:{SD15}+lora=user/doctor-lora@0.8,weight_name=a.safetensors,"
                                      f" sd15-ckpt=diffusers:/models/sd15.safetensors")
    with access.acting_as(access.Visitor("session:a")):
        offered = backend_choices.offered(engine, "generator", runnable=False)
        assert offered["doctor-lora"].options["lora"][0] == {"source": "user/doctor-lora", "scale": 0.8,
                                                             "weight_name": "a.safetensors"}
        assert offered["sd15-ckpt"] == ModelSpec("diffusers", "/models/sd15.safetensors")
        with pytest.raises(NotAllowedError) as refused:
            backend_choices.resolve(engine, "generator", f"diffusers:{SD15}+lora=user/other-lora@0.8")
        assert "doctor-lora" in str(refused.value) and "other-lora" not in str(refused.value)


def test_the_tab_adds_a_lora_to_the_first_generator_or_a_checkpoint_of_its_own(engine):
    from tabs.compare_models import add_finetune, generators_of

    more = add_finetune(engine, "user/doctor-lora@0.8,weight_name=a.safetensors", "lora", ["sd15"], "")
    assert more == f"diffusers:{SD15}+lora=user/doctor-lora@0.8,weight_name=a.safetensors"
    more = add_finetune(engine, "/models/tuned.safetensors", "checkpoint", ["sd15"], more)
    assert generators_of(["sd15"], more) == ["sd15", f"diffusers:{SD15}+lora=user/doctor-lora@0.8,weight_name=a.safetensors",
                                             "diffusers:/models/tuned.safetensors"]
    with pytest.raises(InputError, match="goes on a diffusers model"):
        add_finetune(engine, "user/doctor-lora", "lora", ["synthetic"], "")
    with pytest.raises(InputError, match="first"):
        add_finetune(engine, "", "lora", ["sd15"], "")


def test_a_repository_with_several_files_needs_a_weight_name():
    lora = adapters.Adapter("lora", "user/x")
    assert adapters.pick_file(["README.md", "pytorch_lora_weights.safetensors", "other.safetensors"], lora) == \
        "pytorch_lora_weights.safetensors"
    assert adapters.pick_file(["README.md", "style.safetensors"], lora) == "style.safetensors"
    with pytest.raises(ModelLoadError, match="weight_name=FILE"):
        adapters.pick_file(["a.safetensors", "b.safetensors"], lora)
    assert adapters.pick_file(["a.safetensors", "b.safetensors"], adapters.Adapter("lora", "user/x", weight_name="b.safetensors")) \
        == "b.safetensors"


# -- the real path, with a tiny SD and a tiny random LoRA ------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lora(tiny_root):
    """The tiny SD (at 4 steps: these tests compare images, not their quality) and a tiny LoRA for it."""
    base = tiny_models.build_tiny_sd(tiny_root)
    lora = tiny_models.build_tiny_lora(tiny_root, base=base)
    return ModelSpec(base.backend, base.model, {**base.options, "steps": 4}), lora


def with_lora(base: ModelSpec, lora, scale: float = 1.0, **options) -> ModelSpec:
    spec = parse_model_override(f"diffusers:{base.model}+lora={lora}@{scale:g}", "generator")
    return ModelSpec(spec.backend, spec.model, {**base.options, **spec.options, **options})


def pixels(generator, prompt=PROMPT, seeds=(0, 1)) -> np.ndarray:
    images = generator.generate(prompt, list(seeds), generator.defaults())
    return np.stack([np.asarray(i.image, dtype=np.float32) for i in images])


@pytest.mark.real_model
def test_a_tiny_lora_loads_through_load_lora_weights_and_changes_the_images_and_the_id(tiny_lora):
    from engine.backends import load_backend

    base, lora = tiny_lora
    plain, tuned = load_backend(base), load_backend(with_lora(base, lora, 0.8))
    sha = adapters.file_sha256(str(lora / "pytorch_lora_weights.safetensors"),
                               (lora / "pytorch_lora_weights.safetensors").stat().st_size,
                               (lora / "pytorch_lora_weights.safetensors").stat().st_mtime_ns)
    assert tuned.id == f"{plain.id}+lora=tiny-lora@sha256-{sha[:12]}*0.8"
    assert np.abs(pixels(plain) - pixels(tuned)).mean() > 1.0
    weaker = load_backend(with_lora(base, lora, 0.3))
    assert weaker.id.endswith("*0.3") and np.abs(pixels(weaker) - pixels(tuned)).mean() > 0.5
    # fused (the default: no LoRA layers left) and unfused give the same images in fp32
    unfused = load_backend(with_lora(base, lora, 0.8, fuse_lora=False))
    assert unfused.pipe.get_list_adapters() == {"unet": ["gaplens_0"]} and tuned.pipe.get_list_adapters() == {}
    np.testing.assert_allclose(pixels(unfused), pixels(tuned), atol=2.0)
    assert unfused.memory_bytes() > tuned.memory_bytes() == plain.memory_bytes()


@pytest.mark.real_model
def test_several_loras_each_with_its_scale(tiny_lora, tiny_root):
    from engine.backends import load_backend

    base, lora = tiny_lora
    other = tiny_models.build_tiny_lora(tiny_root, base=base, name="tiny-lora-text", seed=2, text_encoder=True)
    spec = parse_model_override(f"diffusers:{base.model}+lora={lora}@0.8+lora={other}@0.5", "generator")
    both = load_backend(ModelSpec(spec.backend, spec.model, {**base.options, **spec.options}))
    one = load_backend(with_lora(base, lora, 0.8))
    assert both.id.startswith(one.id + "+lora=tiny-lora-text@sha256-") and both.id.endswith("*0.5")
    assert np.abs(pixels(both) - pixels(one)).mean() > 0.5


@pytest.mark.real_model
def test_images_of_a_lora_are_stored_under_their_own_keys(tiny_lora, tiny, data_dir):
    from engine.core.engine import Engine

    base, lora = tiny_lora
    engine = Engine("synthetic", data_dir=data_dir, generator=base)
    tuned = engine.with_generator(with_lora(base, lora, 0.8))
    first = [r for batch in engine.images(PROMPT, [0, 1]) for r in batch]
    second = [r for batch in tuned.images(PROMPT, [0, 1]) for r in batch]
    assert not any(r.cached for r in second) and {r.key for r in first}.isdisjoint(r.key for r in second)
    assert "+lora=tiny-lora@sha256-" in tuned.model_id("generator")
    again = [r for batch in tuned.images(PROMPT, [0, 1]) for r in batch]
    assert all(r.cached for r in again) and [r.key for r in again] == [r.key for r in second]


@pytest.mark.real_model
def test_a_lora_that_does_not_fit_its_base_is_one_sentence(tiny_lora, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from engine.backends import load_backend

    base, lora = tiny_lora
    weights = load_file(str(lora / "pytorch_lora_weights.safetensors"))
    save_file({k: torch.zeros(v.shape[0], 2 * v.shape[1]) if "down" in k else v for k, v in weights.items()},
              str(tmp_path / "other-family.safetensors"))
    save_file({k.replace("attn1", "attn9"): v for k, v in weights.items()}, str(tmp_path / "other-layers.safetensors"))
    save_file({"conv.weight": torch.zeros(2, 2)}, str(tmp_path / "not-a-lora.safetensors"))
    for name, reason in (("other-family", "other shapes"), ("other-layers", "do not exist in the base"),
                         ("not-a-lora", "no LoRA weights")):
        with pytest.raises(ModelLoadError) as failed:
            load_backend(with_lora(base, tmp_path / f"{name}.safetensors"))
        message = str(failed.value)
        assert message.startswith(f"the LoRA '{tmp_path / name}.safetensors' does not fit the base model")
        assert reason in message and "\n" not in message and message.count(". ") == 0


@pytest.mark.real_model
def test_a_textual_inversion_embedding_gives_its_trigger_word_a_meaning(tiny_lora, tmp_path):
    import torch
    from safetensors.torch import save_file

    from engine.backends import load_backend

    base, _ = tiny_lora
    torch.manual_seed(0)
    save_file({"emb_params": torch.randn(1, 32) * 5}, str(tmp_path / "style.safetensors"))
    spec = parse_model_override(f"diffusers:{base.model}+ti={tmp_path / 'style.safetensors'},trigger=<doc-style>",
                                "generator")
    plain, tuned = load_backend(base), load_backend(ModelSpec(spec.backend, spec.model, {**base.options, **spec.options}))
    assert "+ti=style.safetensors@sha256-" in tuned.id and tuned.id.endswith(":<doc-style>")
    prompt = "a photo of a <doc-style> doctor"
    assert np.abs(pixels(plain, prompt) - pixels(tuned, prompt)).mean() > 0.5
    np.testing.assert_allclose(pixels(plain), pixels(tuned), atol=1e-3)   # a prompt without it: unchanged


@pytest.mark.real_model
def test_the_memory_plan_counts_the_lora_weights(tiny_lora):
    from engine.models.plan import model_size

    base, lora = tiny_lora
    plain, tuned = model_size(base, "generator", "cuda"), model_size(with_lora(base, lora), "generator", "cuda")
    shapes = adapters.safetensors_shapes(lora / "pytorch_lora_weights.safetensors")
    assert tuned.components["lora: tiny-lora"] == 2 * sum(int(np.prod(s)) for s in shapes.values())
    assert tuned.bytes == plain.bytes + tuned.components["lora: tiny-lora"]
    unknown = model_size(with_lora(base, "someone/uncached-lora"), "generator", "cuda")
    assert "someone/uncached-lora unknown until downloaded" in unknown.source


@pytest.mark.real_model
def test_a_single_file_checkpoint_loads_through_from_single_file(tiny_lora, tmp_path):
    from engine.backends import load_backend
    from engine.models.plan import model_size

    base, lora = tiny_lora
    checkpoint = tiny_models.save_tiny_single_file(base.model, tmp_path / "tuned.safetensors")
    single = ModelSpec("diffusers", str(checkpoint), {"steps": 4, "config": base.model})   # offline: the configs' folder
    plain, loaded = load_backend(base), load_backend(single)
    assert loaded.family == "sd1" and loaded.id.startswith(f"{checkpoint}@sha256-")
    np.testing.assert_array_equal(pixels(plain), pixels(loaded))     # the same weights, converted back
    # its size from the checkpoint's header, component by component, before anything loads
    assert model_size(single, "generator", "cuda").components == model_size(base, "generator", "cuda").components
    # a LoRA on a single-file base
    spec = parse_model_override(f"diffusers:{checkpoint}+lora={lora}@0.8", "generator")
    tuned = load_backend(ModelSpec(spec.backend, spec.model, {**single.options, **spec.options}))
    assert tuned.id.startswith(loaded.id + "+lora=tiny-lora@sha256-") and np.abs(pixels(tuned) - pixels(loaded)).mean() > 1


@pytest.mark.real_model
def test_a_file_that_is_not_a_checkpoint_is_one_sentence(tiny_lora, tmp_path):
    from engine.backends import load_backend

    base, lora = tiny_lora
    with pytest.raises(ModelLoadError, match="no such checkpoint file"):
        load_backend(ModelSpec("diffusers", str(tmp_path / "missing.safetensors")))
    with pytest.raises(ModelLoadError) as failed:   # a LoRA file is no checkpoint: from_single_file refuses it
        load_backend(ModelSpec("diffusers", str(lora / "pytorch_lora_weights.safetensors")))
    assert "\n" not in str(failed.value)
