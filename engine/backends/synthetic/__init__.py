"""The synthetic world: an offline generator, embedder, LLM and VQA built on one editable
bias table (assets/synthetic_world.json) with planted, known biases. numpy and PIL only.

`load(spec, device)` is the backend factory's entry point; `spec.backend` picks the
component, `spec.model` names the table (a JSON path, "default", or a table of assets/synthetic_tables/,
which may extend the shipped one with a change: `synthetic_generator:doctor-male-95` is a fine-tune of the
world, one generator's table beside the others' shipped one), `spec.options` may
carry {"table": dict} instead of a file and, for the VQA, {"error_rate": float} (uniform
confusion) or {"error": float} (the planted "shift" confusion, see vqa.py), and for the generator
{"batch_size": int} (images per call; 64 by default). Every component but the LLM takes the cost
model's options (`gpu`, `seconds_per_*`: engine/backends/gpu_costs.py): with them and a GPU's batch
size, the synthetic world generates at a GPU's pace and granularity.
"""
from __future__ import annotations

from ...common.errors import ModelLoadError
from ..base import GenerationSettings, ModelSpec
from ..gpu_costs import GpuTimed, call_seconds
from .embedder import SyntheticEmbedder
from .generator import SyntheticGenerator
from .llm import SyntheticLLM
from .scene import draw_scene, read_scene
from .vqa import SyntheticVQA
from .world import World, load_world

__all__ = ["load", "load_world", "World", "SyntheticGenerator", "SyntheticEmbedder", "SyntheticLLM",
           "SyntheticVQA", "parse_prompt", "render_attributes", "read_scene", "draw_scene"]


def load(spec: ModelSpec, device: str = "cpu", **context):
    """The synthetic component `spec.backend` names, on the table `spec.model` names; behind
    GpuTimed when its options ask for the cost model."""
    component = _component(spec)
    role = {"synthetic_generator": "generator", "synthetic_vqa": "vqa", "synthetic_embedder": "embedder"}
    costs = call_seconds(role[spec.backend], spec.options) if spec.backend in role else {}
    return GpuTimed(component, costs) if costs else component


def _component(spec: ModelSpec):
    world = load_world(spec.options.get("table") or spec.model)
    if spec.backend == "synthetic_generator":
        generator = SyntheticGenerator(world)
        generator.batch_size = _batch_size(spec.options.get("batch_size", generator.batch_size))
        return generator
    if spec.backend == "synthetic_embedder":
        return SyntheticEmbedder(world)
    if spec.backend == "synthetic_llm":
        return SyntheticLLM(world)
    if spec.backend == "synthetic_vqa":
        if "error" in spec.options:
            return SyntheticVQA(world, error_rate=_rate(spec.options["error"]), pattern="shift")
        return SyntheticVQA(world, error_rate=_rate(spec.options.get("error_rate", 0.0)))
    raise ModelLoadError(f"unknown synthetic backend '{spec.backend}'; expected synthetic_generator, "
                         "synthetic_embedder, synthetic_llm or synthetic_vqa")


def _batch_size(value) -> int:
    size = int(value) if str(value).isdigit() else 0
    if not 1 <= size <= SyntheticGenerator.batch_size:
        raise ModelLoadError(f"the synthetic generator's batch_size must be a whole number from 1 to "
                             f"{SyntheticGenerator.batch_size}, not {value!r}")
    return size


def _rate(value) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ModelLoadError(f"the synthetic VQA's error rate must be a number between 0 and 1, not {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise ModelLoadError(f"the synthetic VQA's error rate must be between 0 and 1, not {rate:g}")
    return rate


def parse_prompt(text: str, world: World | None = None) -> tuple[str, dict[str, str]]:
    """(subject, {axis: value}) as the synthetic renderer reads `text` (shipped table by default)."""
    return (world or load_world()).parse_prompt(text)


def render_attributes(prompt: str, seed: int, settings: GenerationSettings | None = None,
                      world: World | None = None) -> dict:
    """The ground-truth attributes of the synthetic image (prompt, seed) (shipped table by default)."""
    return SyntheticGenerator(world or load_world()).render_attributes(prompt, seed, settings)
