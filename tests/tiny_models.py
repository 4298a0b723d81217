"""Tiny random-weight models, saved to disk, for exercising the real backends offline.

Every builder writes a model with `save_pretrained` (or a plain checkpoint for open_clip)
into `root` and returns the `ModelSpec` that loads it back through the same
`from_pretrained` code users run with hub ids. Builders are idempotent: a model already
present in `root` is not rebuilt, so a session fixture or a benchmark can call them freely.

The models are noise generators: a few layers of width 32-64, built in well under a second
each (recipes in docs/spec/offline-recipes.md). Nothing here touches a model hub.
"""
from __future__ import annotations

import functools
import gzip
import json
import math
from pathlib import Path

from engine.backends.base import ModelSpec

# A few sentences so the tiny GPT-2 tokenizer has merges for the words tests use.
_CHAT_CORPUS = [
    "a photo of a doctor", "a photo of a nurse", "a portrait of a person in a hospital",
    "system: you are a helpful assistant", "user: list the bias axes of this prompt",
    "assistant: gender, age, ethnicity", '["a doctor", "a nurse", "a teacher"]',
    '{"gender": ["a photo of a male doctor", "a photo of a female doctor"]}',
]

# A ChatML-style template: enough to exercise apply_chat_template(add_generation_prompt=True).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (transformers 5 no longer exports it)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@functools.lru_cache(maxsize=1)
def _clip_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    import open_clip

    bpe_gz = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe_gz).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
    vocab = list(_bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(vocab)}, merges


def clip_tokenizer():
    """Returns the exact OpenAI CLIP tokenizer (49,408 tokens), built from open_clip's bundled BPE file."""
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab_and_merges()
    return CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=77)


def _tiny_clip_config(tokenizer, image_size: int = 64):
    from transformers import CLIPConfig, CLIPTextConfig, CLIPVisionConfig

    text = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                          num_hidden_layers=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                              image_size=image_size, patch_size=16)
    # the logit scale every released CLIP sits at (exp = 100, its training clamp): zero-shot answers as sure as theirs
    return CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=32,
                      logit_scale_init_value=math.log(100))


def _clip_image_processor(image_size: int = 64):
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def build_tiny_sd(root: str | Path, *, name: str = "tiny-sd", flag_everything: bool = False) -> ModelSpec:
    """Writes a tiny StableDiffusionPipeline (64x64 native size, DDIM) to root/name.

    With `flag_everything=True` the pipeline also carries a tiny StableDiffusionSafetyChecker and
    feature extractor whose concept thresholds are below any cosine similarity, so every image
    is flagged NSFW: this exercises the flag-don't-black-out path.

    Returns the ModelSpec that loads it (backend "diffusers", batch_size 8)."""
    path = Path(root) / name
    spec = ModelSpec("diffusers", str(path), {"batch_size": 8})
    if (path / "model_index.json").exists():
        return spec
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPTextConfig, CLIPTextModel

    _seed(0)
    tok = clip_tokenizer()
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=77, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id))
    unet = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=32)
    safety_checker = feature_extractor = None
    if flag_everything:
        safety_checker = StableDiffusionSafetyChecker(_tiny_clip_config(tok))
        with torch.no_grad():
            safety_checker.concept_embeds_weights.fill_(-2.0)  # cosine - (-2) > 0 always: every image flagged
        feature_extractor = _clip_image_processor(64)
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text_encoder, tokenizer=tok, unet=unet,
        scheduler=DDIMScheduler(clip_sample=False, set_alpha_to_one=False, steps_offset=1),
        safety_checker=safety_checker, feature_extractor=feature_extractor,
        requires_safety_checker=flag_everything)
    pipe.save_pretrained(path)
    return spec


def build_tiny_clip_hf(root: str | Path, *, name: str = "tiny-clip-hf") -> ModelSpec:
    """Writes a tiny transformers CLIPModel + CLIPProcessor (64x64 images, 32-d embeddings) to root/name.

    Returns the ModelSpec that loads it (backend "hf_clip")."""
    path = Path(root) / name
    spec = ModelSpec("hf_clip", str(path))
    if (path / "config.json").exists():
        return spec
    from transformers import CLIPModel, CLIPProcessor

    _seed(1)
    tok = clip_tokenizer()
    CLIPModel(_tiny_clip_config(tok)).save_pretrained(path)
    CLIPProcessor(image_processor=_clip_image_processor(64), tokenizer=tok).save_pretrained(path)
    return spec


def build_tiny_siglip(root: str | Path, *, name: str = "tiny-siglip") -> ModelSpec:
    """Writes a tiny transformers SiglipModel + SiglipProcessor (64x64 images, 32-d embeddings,
    64 text positions) to root/name; the backend must pad its texts to the full 64 tokens.

    Returns the ModelSpec that loads it (backend "hf_clip")."""
    path = Path(root) / name
    spec = ModelSpec("hf_clip", str(path))
    if (path / "config.json").exists():
        return spec
    from transformers import (SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor, SiglipTextConfig,
                              SiglipVisionConfig)

    _seed(7)
    tok = clip_tokenizer()
    text = SiglipTextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                            num_hidden_layers=2, max_position_embeddings=64, projection_size=32,
                            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                                image_size=64, patch_size=16)
    SiglipModel(SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())).save_pretrained(path)
    SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": 64, "width": 64}),
                    tokenizer=tok).save_pretrained(path)
    return spec


TINY_OPEN_CLIP_NAME = "gaplens-tiny-clip"
TINY_OPEN_CLIP_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    "init_logit_scale": math.log(100),   # where every released CLIP/OpenCLIP model sits
}


def build_tiny_open_clip(root: str | Path, *, name: str = "tiny-open-clip") -> ModelSpec:
    """Writes a tiny open_clip model: a config `gaplens-tiny-clip.json` (registered through the
    backend's `config_dir` option, i.e. open_clip.add_model_config) and a `torch.save(state_dict)`
    checkpoint passed as `pretrained`. 64-d embeddings, 64x64 images.

    Returns the ModelSpec that loads it (backend "open_clip")."""
    path = Path(root) / name
    checkpoint = path / "tiny-open-clip.pt"
    spec = ModelSpec("open_clip", TINY_OPEN_CLIP_NAME,
                     {"pretrained": str(checkpoint), "config_dir": str(path)})
    if checkpoint.exists():
        return spec
    import open_clip
    import torch

    path.mkdir(parents=True, exist_ok=True)
    (path / f"{TINY_OPEN_CLIP_NAME}.json").write_text(json.dumps(TINY_OPEN_CLIP_CONFIG, indent=1))
    open_clip.add_model_config(path)
    _seed(2)
    model = open_clip.create_model(TINY_OPEN_CLIP_NAME, pretrained=None)
    torch.save(model.state_dict(), checkpoint)
    return spec


def _chat_tokenizer(chat_template: str | None = CHAT_TEMPLATE, extra_special: tuple[str, ...] = (),
                    corpus: list[str] | None = None):
    """A byte-level BPE tokenizer (about 300 tokens) trained in-process on _CHAT_CORPUS (or `corpus`), with
    the ChatML markers, "<image>" and `extra_special` as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", *extra_special]
    bpe.train_from_iterator(corpus or _CHAT_CORPUS, trainers.BpeTrainer(
        vocab_size=500, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>", additional_special_tokens=special[1:])
    if chat_template:
        tok.chat_template = chat_template
    return tok


def build_tiny_chat_llm(root: str | Path, *, name: str = "tiny-chat-llm", chat_template: bool = True,
                        positions: int = 512) -> ModelSpec:
    """Writes a tiny GPT-2 (2 layers, width 64, `positions` positions) with a byte-level BPE tokenizer
    trained in-process, to root/name. With `chat_template=True` the tokenizer carries a
    ChatML-style template; without it the backend falls back to its plain "role: content" format.
    Few positions cap every reply at a few tokens (a quick LLM call on a CPU).

    Returns the ModelSpec that loads it (backend "hf_chat")."""
    path = Path(root) / name
    spec = ModelSpec("hf_chat", str(path))
    if (path / "config.json").exists():
        return spec
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = _chat_tokenizer(CHAT_TEMPLATE if chat_template else None)
    _seed(3)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=positions, n_embd=64, n_layer=2, n_head=2,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return spec


# ChatML with typed content, as image-text-to-text processors expect.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_vlm(root: str | Path, *, name: str = "tiny-vlm") -> ModelSpec:
    """Writes a tiny LLaVA (CLIP vision tower + 2-layer Llama, 64x64 images, 16 image tokens) with a
    LlavaProcessor carrying a chat template, to root/name. It loads through
    AutoModelForImageTextToText like any hub VLM.

    Returns the ModelSpec that loads it (backend "vlm", MiniGPT-v2-style prefix "[vqa] ")."""
    path = Path(root) / name
    spec = ModelSpec("vlm", str(path), {"prefix": "[vqa] ", "max_new_tokens": 8})
    if (path / "config.json").exists():
        return spec
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor)

    tok = _chat_tokenizer(None)
    image_token_id = tok.convert_tokens_to_ids("<image>")
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                       num_hidden_layers=2, image_size=64, patch_size=16).to_dict(),
        text_config=LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id).to_dict(),
        image_token_index=image_token_id, vision_feature_select_strategy="default", vision_feature_layer=-1)
    _seed(6)
    LlavaForConditionalGeneration(config).save_pretrained(path)
    LlavaProcessor(image_processor=_clip_image_processor(64), tokenizer=tok, patch_size=16,
                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                   image_token="<image>", chat_template=VLM_CHAT_TEMPLATE).save_pretrained(path)
    return spec


# Qwen2-VL's ChatML: the image as <|vision_start|><|image_pad|><|vision_end|> (the processor repeats the pad).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_qwen2_vl(root: str | Path, *, name: str = "tiny-qwen2-vl") -> ModelSpec:
    """Writes a tiny Qwen2-VL (a 2-block vision tower with 14 px patches merged 2x2, 56x56 images
    = 4 image tokens, a 2-layer Qwen2 decoder with multimodal rotary positions) and its
    Qwen2VLProcessor with a chat template, to root/name. It loads through AutoModelForImageTextToText
    like Qwen/Qwen2-VL-2B-Instruct.

    Returns the ModelSpec that loads it (backend "vlm")."""
    path = Path(root) / name
    spec = ModelSpec("vlm", str(path), {"max_new_tokens": 6})
    if (path / "config.json").exists():
        return spec
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    markers = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tok = _chat_tokenizer(None, markers)
    ids = {m: tok.convert_tokens_to_ids(m) for m in markers}
    config = Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        text_config={"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
                     "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                     "pad_token_id": tok.pad_token_id},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    _seed(7)
    Qwen2VLForConditionalGeneration(config).save_pretrained(path)
    images = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=56 * 56, patch_size=14, merge_size=2,
                                   temporal_patch_size=2)
    Qwen2VLProcessor(image_processor=images, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
                     chat_template=QWEN2_VL_CHAT_TEMPLATE).save_pretrained(path)
    return spec


def build_tiny_paligemma(root: str | Path, *, name: str = "tiny-paligemma") -> ModelSpec:
    """Writes a tiny PaliGemma (a 2-layer SigLIP vision tower, 64x64 images = 16 image tokens, a 2-layer
    Gemma decoder) and its PaliGemmaProcessor (no chat template: the backend's prompt_template) to
    root/name. Its prompt is a bidirectional prefix (token_type_ids 0); what follows it is 1.

    Returns the ModelSpec that loads it (backend "vlm")."""
    from transformers import (GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor,
                              SiglipImageProcessor, SiglipVisionConfig)

    spec = ModelSpec("vlm", str(Path(root) / name), {"max_new_tokens": 6})
    if (Path(spec.model) / "config.json").exists():
        return spec
    tok = _chat_tokenizer(None)
    images = SiglipImageProcessor(size={"height": 64, "width": 64})
    images.image_seq_length = 16
    processor = PaliGemmaProcessor(image_processor=images, tokenizer=tok)   # adds <image> and PaliGemma's extra tokens
    config = PaliGemmaConfig(
        vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                         num_hidden_layers=2, image_size=64, patch_size=16).to_dict(),
        text_config=GemmaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, num_hidden_layers=2, max_position_embeddings=256,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id).to_dict(),
        image_token_index=processor.image_token_id, projection_dim=32)
    _seed(8)
    PaliGemmaForConditionalGeneration(config).save_pretrained(spec.model)
    processor.save_pretrained(spec.model)
    return spec


def train_to_reply(spec: ModelSpec, out: str | Path, images, prompt: str, reply: str, steps: int = 80) -> ModelSpec:
    """Fine-tunes the tiny VLM `spec` names until its greedy reply to `prompt` (sent as the backend
    sends it) about each of `images` is `reply` and then its end-of-turn token, and saves it (and its
    processor) to `out`. Returns the ModelSpec that loads the trained copy."""
    import torch
    from transformers import AutoProcessor

    from engine.backends import load_backend

    spec_out = ModelSpec(spec.backend, str(out), {**spec.options, "max_new_tokens": 24})   # the whole reply
    if (Path(out) / "config.json").exists():
        return spec_out
    vqa = load_backend(spec)
    tokenizer = vqa.processor.tokenizer
    target = tokenizer(reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    inputs = {k: v for k, v in vqa._inputs(list(images), prompt).items() if k != "labels"}
    n = len(target)
    ids = torch.cat([inputs["input_ids"], torch.tensor([target] * len(images))], dim=1)
    labels = torch.full_like(ids, -100)
    labels[:, -n:] = torch.tensor(target)
    grown = {k: torch.cat([v, torch.full((len(images), n), int(k == "token_type_ids"), dtype=v.dtype)], dim=1)
             for k, v in inputs.items() if k in ("token_type_ids", "mm_token_type_ids")}
    batch = {**inputs, **grown, "input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    _seed(9)
    model = vqa.model.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        optimiser.zero_grad()
        model(**batch).loss.backward()
        optimiser.step()
    model.eval().save_pretrained(out)
    AutoProcessor.from_pretrained(spec.model).save_pretrained(out)
    return spec_out


def _blip_parts():
    """A tiny BlipConfig and BlipProcessor sharing the CLIP BPE tokenizer (+ [CLS]/[SEP]/[DEC])."""
    from transformers import BlipConfig, BlipImageProcessor, BlipProcessor, BlipTextConfig, BlipVisionConfig

    tok = clip_tokenizer()
    tok.add_special_tokens({"cls_token": "[CLS]", "sep_token": "[SEP]", "bos_token": "[DEC]"})
    text = BlipTextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                          num_hidden_layers=2, encoder_hidden_size=32, max_position_embeddings=77,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.sep_token_id,
                          sep_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id)
    vision = BlipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                              image_size=64, patch_size=16)
    config = BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=32)
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 64, "width": 64}), tokenizer=tok)
    return config, processor


def build_tiny_blip_vqa(root: str | Path, *, name: str = "tiny-blip-vqa", with_captioner: bool = True) -> ModelSpec:
    """Writes a tiny BlipForQuestionAnswering + BlipProcessor to root/name and, with
    `with_captioner`, a tiny BlipForConditionalGeneration to root/name-caption.

    Returns the ModelSpec that loads them (backend "blip_vqa", option caption_model)."""
    from transformers import BlipForConditionalGeneration, BlipForQuestionAnswering

    path = Path(root) / name
    caption_path = Path(root) / f"{name}-caption"
    spec = ModelSpec("blip_vqa", str(path), {"caption_model": str(caption_path)} if with_captioner else {})
    if not (path / "config.json").exists():
        config, processor = _blip_parts()
        _seed(4)
        BlipForQuestionAnswering(config).save_pretrained(path)
        processor.save_pretrained(path)
    if with_captioner and not (caption_path / "config.json").exists():
        config, processor = _blip_parts()
        _seed(5)
        BlipForConditionalGeneration(config).save_pretrained(caption_path)
        processor.save_pretrained(caption_path)
    return spec


def build_all(root: str | Path) -> dict[str, ModelSpec]:
    """Builds every tiny model under root. Returns {"generator", "generator_nsfw", "hf_clip",
    "siglip", "open_clip", "chat_llm", "blip_vqa", "vlm"} -> ModelSpec."""
    return {
        "generator": build_tiny_sd(root),
        "generator_nsfw": build_tiny_sd(root, name="tiny-sd-nsfw", flag_everything=True),
        "hf_clip": build_tiny_clip_hf(root),
        "siglip": build_tiny_siglip(root),
        "open_clip": build_tiny_open_clip(root),
        "chat_llm": build_tiny_chat_llm(root),
        "blip_vqa": build_tiny_blip_vqa(root),
        "vlm": build_tiny_vlm(root),
    }


def build_tiny_lora(root: str | Path, *, base: ModelSpec, name: str = "tiny-lora", seed: int = 1,
                    text_encoder: bool = False, rank: int = 4) -> Path:
    """Writes a random LoRA for the tiny SD `base` (rank `rank` on the UNet's attention projections,
    and with `text_encoder` on the text encoder's too) with diffusers' `save_lora_weights`, as a LoRA
    trainer does: root/name/pytorch_lora_weights.safetensors. Its B matrices are random (a trained
    LoRA's are; peft starts them at 0), so it changes the images. Returns the folder."""
    path = Path(root) / name
    if (path / "pytorch_lora_weights.safetensors").exists():
        return path
    import torch
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    _seed(seed)
    pipe = StableDiffusionPipeline.from_pretrained(base.model)
    layers = {}
    targets = {"unet": ["to_q", "to_k", "to_v", "to_out.0"], "text_encoder": ["q_proj", "k_proj", "v_proj", "out_proj"]}
    for component in ("unet", "text_encoder") if text_encoder else ("unet",):
        model = getattr(pipe, component)
        model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian",
                                     target_modules=targets[component]))
        with torch.no_grad():
            for key, param in model.named_parameters():
                if "lora_B" in key:
                    param.normal_(0.0, 0.5)
        layers[f"{component}_lora_layers"] = convert_state_dict_to_diffusers(get_peft_model_state_dict(model))
    StableDiffusionPipeline.save_lora_weights(str(path), safe_serialization=True, **layers)
    return path


def _ldm_resnet(name: str) -> str:
    for new, old in (("norm1", "in_layers.0"), ("conv1", "in_layers.2"), ("time_emb_proj", "emb_layers.1"),
                     ("norm2", "out_layers.0"), ("conv2", "out_layers.3"), ("conv_shortcut", "skip_connection")):
        name = name.replace(f".{new}.", f".{old}.")
    return name


def _ldm_unet_key(key: str, per_block: int) -> str:
    """The original (LDM) name of a diffusers UNet2DConditionModel weight, for `per_block` resnets a down block."""
    import re

    fixed = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
             "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}
    head, _, tail = key.rpartition(".")
    if head in fixed:
        return f"{fixed[head]}.{tail}"
    step = per_block + 1
    rules = [(r"down_blocks\.(\d+)\.resnets\.(\d+)\.", lambda b, j: f"input_blocks.{1 + b * step + j}.0.", True),
             (r"down_blocks\.(\d+)\.attentions\.(\d+)\.", lambda b, j: f"input_blocks.{1 + b * step + j}.1.", False),
             (r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.", lambda b: f"input_blocks.{(b + 1) * step}.0.op.", False),
             (r"mid_block\.resnets\.(\d+)\.", lambda k: f"middle_block.{2 * k}.", True),
             (r"mid_block\.attentions\.0\.", lambda: "middle_block.1.", False),
             (r"up_blocks\.(\d+)\.resnets\.(\d+)\.", lambda b, j: f"output_blocks.{b * step + j}.0.", True),
             (r"up_blocks\.(\d+)\.attentions\.(\d+)\.", lambda b, j: f"output_blocks.{b * step + j}.1.", False)]
    for pattern, make, resnet in rules:
        match = re.match(pattern, key)
        if match:
            name = make(*map(int, match.groups())) + key[match.end():]
            return _ldm_resnet("." + name)[1:] if resnet else name
    raise KeyError(key)


def save_tiny_single_file(pipe_folder: str | Path, path: str | Path) -> Path:
    """Writes the tiny SD of `pipe_folder` (build_tiny_sd) as one original-format (LDM) checkpoint, as
    single-file SD 1.x checkpoints are published (model.diffusion_model., first_stage_model.,
    cond_stage_model.transformer. keys), for diffusers' `from_single_file`. Returns its path."""
    import json
    import re

    from safetensors.torch import load_file, save_file

    folder, path = Path(pipe_folder), Path(path)
    unet = load_file(str(folder / "unet" / "diffusion_pytorch_model.safetensors"))
    upsampler_slot = {}   # an up block's upsampler sits after its attention when it has one
    config = json.loads((folder / "unet" / "config.json").read_text())
    per_block, blocks = config["layers_per_block"], len(config["up_block_types"])
    out = {}
    for key, value in unet.items():
        match = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(\w+)", key)
        if match:
            b = int(match.group(1))
            upsampler_slot[b] = 2 if "CrossAttn" in config["up_block_types"][b] else 1
            out[f"model.diffusion_model.output_blocks.{b * (per_block + 1) + per_block}.{upsampler_slot[b]}.conv."
                f"{match.group(2)}"] = value
        else:
            out["model.diffusion_model." + _ldm_unet_key(key, per_block)] = value
    vae = load_file(str(folder / "vae" / "diffusion_pytorch_model.safetensors"))
    vae_blocks = len(json.loads((folder / "vae" / "config.json").read_text())["up_block_types"])
    for key, value in vae.items():
        name = re.sub(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", key)
        name = re.sub(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", name)
        name = re.sub(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.",
                      lambda m: f"decoder.up.{vae_blocks - 1 - int(m.group(1))}.block.{m.group(2)}.", name)
        name = re.sub(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.",
                      lambda m: f"decoder.up.{vae_blocks - 1 - int(m.group(1))}.upsample.", name)
        name = re.sub(r"mid_block\.resnets\.(\d+)\.", lambda m: f"mid.block_{int(m.group(1)) + 1}.", name)
        name = name.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
        if "mid_block.attentions.0." in name:
            name = name.replace("mid_block.attentions.0.", "mid.attn_1.")
            for new, old in (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                             ("to_out.0.", "proj_out.")):
                name = name.replace(new, old)
            if name.endswith(("q.weight", "k.weight", "v.weight", "proj_out.weight")):
                value = value.reshape(*value.shape, 1, 1)   # the original's 1x1 convolutions
        out["first_stage_model." + name] = value
    text = load_file(str(folder / "text_encoder" / "model.safetensors"))
    out.update({"cond_stage_model.transformer." + ("" if k.startswith("text_model.") else "text_model.") + k: v
                for k, v in text.items()})   # transformers 5 saves CLIPTextModel without 'text_model.'

    save_file({k: v.contiguous() for k, v in out.items()}, str(path))
    return path
