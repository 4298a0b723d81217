"""Image/text embedders over CLIP-like models (backends "open_clip" and "hf_clip").

"open_clip": `spec.model` is an open_clip model name ("ViT-B-32"), "hf-hub:org/repo" or
"local-dir:/path". Options:
  pretrained   a pretrained tag ("laion2b_s34b_b79k") or a local checkpoint file; default: the
               first tag open_clip lists for the model (ignored for hf-hub:/local-dir: names)
  config_dir   a directory of extra model configs (*.json), registered with open_clip.add_model_config
  precision    open_clip weight precision: "fp32" (default), "fp16", "bf16", "pure_fp16", ...
  autocast     with fp32 weights on CUDA, run under fp16 autocast as open_clip's own
               evaluation does (default True)
  batch_size   images or texts per forward pass (default 32)
  cache_dir    download cache

"hf_clip": `spec.model` is a transformers CLIP or SigLIP/SigLIP2 hub id or local directory,
loaded with AutoModel + AutoProcessor. Options: revision, dtype, batch_size, token, cache_dir.

Both return float32 numpy arrays of L2-normalised rows. `id` names the weights: the open_clip
model and pretrained tag (a local checkpoint adds its fingerprint), or the hub commit. `logit_scale`
and `logit_bias` are the loaded model's image-text temperature (`_temperature`): 100 and 0 for
OpenAI/LAION CLIP, SigLIP's learned scale and bias for SigLIP/SigLIP2.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from ..common.errors import ModelLoadError
from . import device as devices
from .base import CLIP_LOGIT_SCALE, ModelSpec, l2_normalise

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 32


def _rgb(images: Sequence[Image.Image]) -> list[Image.Image]:
    return [img if img.mode == "RGB" else img.convert("RGB") for img in images]


def _batches(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


class OpenClipEmbedder:
    """An open_clip model behind the Embedder protocol. `dim` is the embedding width."""

    def __init__(self, model, preprocess, tokenizer, *, model_id: str, device: str, batch_size: int,
                 autocast: bool = True):
        import torch

        self.model = model
        self.id = model_id
        self.device = device
        self.batch_size = batch_size
        self._preprocess = preprocess
        self._tokenizer = tokenizer
        self._autocast = autocast and str(device).startswith("cuda")
        self.logit_scale, self.logit_bias = _temperature(model)
        # With open_clip's fp16/bf16 precision only conv/linear weights are cast: match the first one.
        weights = [m.weight for m in model.visual.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        self._input_dtype = weights[0].dtype if weights else torch.float32
        self.dim = int(self.embed_texts(["a photo"]).shape[1])

    def _precision(self):
        import torch

        return torch.autocast("cuda", dtype=torch.float16) if self._autocast else contextlib.nullcontext()

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Returns (n, d) float32, rows L2-normalised."""
        import torch

        out = []
        for batch in _batches(_rgb(images), self.batch_size):
            pixels = torch.stack([self._preprocess(img) for img in batch]).to(devices.weights_device(self.model),
                                                                              self._input_dtype)
            with torch.inference_mode(), self._precision():
                out.append(self.model.encode_image(pixels).float().cpu().numpy())
        return self._finish(out)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Returns (n, d) float32, rows L2-normalised, in the image space."""
        import torch

        out = []
        for batch in _batches(list(texts), self.batch_size):
            tokens = self._tokenizer(batch).to(devices.weights_device(self.model))
            with torch.inference_mode(), self._precision():
                out.append(self.model.encode_text(tokens).float().cpu().numpy())
        return self._finish(out)

    def _finish(self, chunks: list[np.ndarray]) -> np.ndarray:
        return l2_normalise(np.concatenate(chunks)) if chunks else np.zeros((0, self.dim), dtype=np.float32)

    def memory_bytes(self) -> int:
        """Returns the bytes of the model's weights."""
        return devices.module_bytes(self.model)

    def move_to(self, device: str) -> bool:
        """Moves the weights to `device` ("cpu" parks them in host RAM while evicted)."""
        self.model.to(device)
        self.device = device
        return True


class HFClipEmbedder:
    """A transformers CLIP or SigLIP model behind the Embedder protocol. `dim` is the embedding width."""

    def __init__(self, model, processor, *, model_id: str, device: str, batch_size: int):
        self.model = model
        self.id = model_id
        self.device = device
        self.batch_size = batch_size
        self._processor = processor
        self._dtype = next(model.parameters()).dtype
        text_config = getattr(model.config, "text_config", model.config)
        self._max_length = int(getattr(text_config, "max_position_embeddings", 77))
        # SigLIP was trained on texts padded to the full length; shorter padding changes its embeddings.
        self._pad_to_max = model.config.model_type.startswith("siglip")
        self.logit_scale, self.logit_bias = _temperature(model)
        self.dim = int(self.embed_texts(["a photo"]).shape[1])

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Returns (n, d) float32, rows L2-normalised."""
        import torch

        out = []
        for batch in _batches(_rgb(images), self.batch_size):
            inputs = self._processor(images=batch, return_tensors="pt").to(devices.weights_device(self.model))
            inputs = {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in inputs.items()}
            with torch.inference_mode():
                out.append(_features(self.model.get_image_features(**inputs)))
        return self._finish(out)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Returns (n, d) float32, rows L2-normalised, in the image space."""
        import torch

        out = []
        for batch in _batches(list(texts), self.batch_size):
            inputs = self._processor(text=list(batch), return_tensors="pt", truncation=True,
                                     max_length=self._max_length,
                                     padding="max_length" if self._pad_to_max else True
                                     ).to(devices.weights_device(self.model))
            with torch.inference_mode():
                out.append(_features(self.model.get_text_features(**inputs)))
        return self._finish(out)

    def _finish(self, chunks: list[np.ndarray]) -> np.ndarray:
        return l2_normalise(np.concatenate(chunks)) if chunks else np.zeros((0, self.dim), dtype=np.float32)

    def memory_bytes(self) -> int:
        """Returns the bytes of the model's weights."""
        return devices.module_bytes(self.model)

    def move_to(self, device: str) -> bool:
        """Moves the weights to `device` ("cpu" parks them in host RAM while evicted)."""
        self.model.to(device)
        self.device = device
        return True


def _temperature(model) -> tuple[float, float]:
    """(scale, bias) of the model's image-text logits, scale · cosine + bias: the exponential of its learned
    `logit_scale` (CLIP's sits at its clamp, 100; SigLIP learns its own) and its learned `logit_bias`
    (SigLIP, open_clip's SigLIP models; 0 without one). CLIP_LOGIT_SCALE for a model with no scale."""
    import torch

    scale, bias = getattr(model, "logit_scale", None), getattr(model, "logit_bias", None)
    return (float(scale.detach().float().exp().reshape(-1)[0]) if isinstance(scale, torch.Tensor) else CLIP_LOGIT_SCALE,
            float(bias.detach().float().reshape(-1)[0]) if isinstance(bias, torch.Tensor) else 0.0)


def _features(output) -> np.ndarray:
    """transformers 5 returns a model output whose pooler_output is the projected embedding;
    older versions return the tensor itself."""
    tensor = output if hasattr(output, "float") else output.pooler_output
    return tensor.float().cpu().numpy()


def _load_open_clip(spec: ModelSpec, device: str) -> OpenClipEmbedder:
    import open_clip

    options = spec.options
    if options.get("config_dir"):
        config_dir = Path(options["config_dir"]).expanduser()
        if not config_dir.exists():
            raise ModelLoadError(f"config_dir '{config_dir}' for open_clip model '{spec.model}' does not exist")
        open_clip.add_model_config(config_dir)
    name = spec.model
    pretrained = options.get("pretrained")
    has_schema = name.startswith(("hf-hub:", "local-dir:"))
    if has_schema:
        pretrained = None
    elif name not in open_clip.list_models():
        raise ModelLoadError(f"unknown open_clip model '{name}'; use a name from open_clip.list_models(), "
                             f"'hf-hub:org/repo', 'local-dir:/path', or register a config with option config_dir")
    elif not pretrained:
        tags = open_clip.list_pretrained_tags_by_model(name)
        if not tags:
            raise ModelLoadError(f"open_clip model '{name}' has no released weights; pass option pretrained="
                                 f"<checkpoint file>")
        pretrained = tags[0]
        logger.info("open_clip %s: no pretrained tag given, using '%s'", name, pretrained)
    elif devices.looks_like_local_path(pretrained) and not Path(pretrained).expanduser().is_file():
        raise ModelLoadError(f"checkpoint '{pretrained}' for open_clip model '{name}' does not exist")

    precision = options.get("precision", "fp32")
    model, _, preprocess = open_clip.create_model_and_transforms(
        name, pretrained=pretrained, device=device, precision=precision, cache_dir=options.get("cache_dir"))
    model.eval()
    tokenizer = open_clip.get_tokenizer(name)

    if has_schema and name.startswith("local-dir:"):
        model_id = f"open_clip:{devices.model_identity(name.removeprefix('local-dir:'))}"
    elif has_schema:
        model_id = f"open_clip:{name}"
    elif Path(pretrained).expanduser().is_file():
        model_id = f"open_clip:{name}@{Path(pretrained).name}-{devices.fingerprint_path(pretrained)}"
    else:
        model_id = f"open_clip:{name}@{pretrained}"
    return OpenClipEmbedder(model, preprocess, tokenizer, model_id=model_id, device=device,
                            batch_size=int(options.get("batch_size", DEFAULT_BATCH_SIZE)),
                            autocast=bool(options.get("autocast", True)) and precision == "fp32")


def _load_hf_clip(spec: ModelSpec, device: str) -> HFClipEmbedder:
    from transformers import AutoModel, AutoProcessor

    options = spec.options
    if devices.looks_like_local_path(spec.model) and not Path(spec.model).expanduser().exists():
        raise ModelLoadError(f"no such model directory: '{spec.model}'")
    hub = {k: options[k] for k in ("revision", "token", "cache_dir") if options.get(k)}
    dtype = devices.default_dtype(device, override=options.get("dtype"))
    model, info = AutoModel.from_pretrained(spec.model, dtype=dtype, output_loading_info=True, **hub)
    if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
        raise ModelLoadError(f"'{spec.model}' ({type(model).__name__}) is not a CLIP-like dual encoder: "
                             f"it lacks get_image_features/get_text_features")
    devices.require_complete_weights(spec.model, info, "CLIP/SigLIP")
    model = model.to(device).eval()
    processor = AutoProcessor.from_pretrained(spec.model, **hub)
    commit = devices.hub_commit(spec.model, revision=options.get("revision"), cache_dir=options.get("cache_dir"))
    model_id = f"hf_clip:{devices.model_identity(spec.model, revision=options.get('revision'), commit=commit)}"
    return HFClipEmbedder(model, processor, model_id=model_id, device=device,
                          batch_size=int(options.get("batch_size", DEFAULT_BATCH_SIZE)))


def load(spec: ModelSpec, device: str, **context):
    """Loads an open_clip ("open_clip") or transformers ("hf_clip") embedder onto `device`.
    Returns an OpenClipEmbedder or HFClipEmbedder."""
    if spec.backend == "open_clip":
        return _load_open_clip(spec, device)
    if spec.backend == "hf_clip":
        return _load_hf_clip(spec, device)
    raise ModelLoadError(f"clip_embedder cannot load backend '{spec.backend}' ('{spec.model}')")
