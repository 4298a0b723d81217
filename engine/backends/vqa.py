"""Visual question answering and captioning behind the VQA protocol: backends "blip_vqa", "vlm"
and "clip_vqa".

"blip_vqa": `spec.model` is a BlipForQuestionAnswering hub id or directory (e.g.
  Salesforce/blip-vqa-base), loaded with its BlipProcessor. Captions come from the
  BlipForConditionalGeneration named by option `caption_model` (e.g.
  Salesforce/blip-image-captioning-base), else from answering CAPTION_QUESTION.
"vlm": any image-text-to-text model (AutoModelForImageTextToText + AutoProcessor: LLaVA, Qwen2-VL,
  Idefics, PaliGemma, ...). The question goes into the processor's chat template together with
  the image; decoding is greedy. Option `prefix` is put before every question (e.g. "[vqa] " for
  MiniGPT-v2-style models) and option `suffix` after it (default VLM_SUFFIX, LLaVA's "Answer
  with a single word or phrase."; "" to ask the bare question). A processor without a chat
  template gets `prompt_template` (default "Question: {question} Answer:", the BLIP-2 convention).
"clip_vqa": zero-shot answers over the given choices with a CLIP-like embedder (passed to load
  as `embedder=`, or loaded from spec.model with option `embedder_backend`, default "open_clip",
  and the remaining options). Each choice is scored by its mean text embedding over a few
  templates ("a photo of {choice}."; plus "a photo of a {choice} person." when the question is
  about a person) and the best one wins. Deterministic and cheap. Without choices it falls back
  to the caption vocabulary: the answer is the best-matching entry of `vocabulary`. Captions
  are "a photo of <best entry>". Options: embedder_backend, templates, person_templates,
  vocabulary (each changes the id when not the default).

With `choices`, blip_vqa and vlm map the free answer to a choice with `match_choice` (exact,
age number, whole word, synonym; else "other"); every backend returns choices lower-case.

Decoding is greedy with every setting explicit (base.decoding_settings). A Qwen2-VL / Qwen2.5-VL
model runs in fp32 on a GPU without native bf16 (T4, V100), where fp16 makes it answer garbage
(device.FP16_UNSTABLE_MODEL_TYPES); option dtype overrides.

Options of blip_vqa and vlm: batch_size (16 / 8), max_new_tokens (10 / 20), dtype, revision,
token, cache_dir, synonyms (extra {choice: [words]} for match_choice); blip_vqa also
caption_model; vlm also prefix, suffix, prompt_template, caption_prompt, device_map,
trust_remote_code (off unless set).
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import re
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from ..common.errors import ModelLoadError
from . import device as devices
from .base import (ClassAnswer, ModelSpec, class_answer, clear_generation_defaults, decoding_settings,
                   logit_temperature)

logger = logging.getLogger(__name__)

CAPTION_QUESTION = "what is in the image?"
VLM_CAPTION_PROMPT = "Describe the image in one short sentence."
VLM_PROMPT_TEMPLATE = "Question: {question} Answer:"
VLM_SUFFIX = " Answer with a single word or phrase."  # LLaVA's short-answer VQA instruction
VLM_CHOICES_SUFFIX = " Answer with one of: {choices}."   # a question asked with its classes listed

# Words a free answer may use for a choice. Only the choices actually offered are consulted,
# so "boy" means "male" for a gender question and "young" for an age question.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "male": ("man", "men", "boy", "boys", "gentleman", "guy", "masculine", "he", "his", "him"),
    "female": ("woman", "women", "girl", "girls", "lady", "ladies", "feminine", "she", "her"),
    "man": ("male", "boy", "gentleman", "guy"),
    "woman": ("female", "girl", "lady"),
    "young": ("child", "children", "kid", "kids", "teen", "teenager", "teenage", "youth", "baby", "toddler",
              "boy", "girl", "infant"),
    "middle": ("middle aged", "adult", "mature"),
    "middle aged": ("middle", "adult", "mature"),
    "old": ("elderly", "senior", "aged", "older", "grandmother", "grandfather", "grandma", "grandpa"),
    "yes": ("yeah", "yep", "true", "correct"),
    "no": ("nope", "false", "none", "not"),
    "rich": ("wealthy", "affluent", "upper class", "luxurious"),
    "poor": ("impoverished", "low income", "lower class", "homeless", "poverty"),
    "middle class": ("middle", "average"),
    # skin tone and ethnicity: what evaluators say instead of the classes (issue 35); plurals, "fair-skinned"
    # and "a fair person" match through match_choice's whole-word and plural rules
    "light": ("fair", "pale", "white", "caucasian", "porcelain", "ivory", "pinkish"),
    "medium": ("tan", "tanned", "olive", "brown", "brownish", "beige", "golden", "caramel", "bronze", "moderate",
               "light brown", "light olive"),
    "dark": ("black", "deep", "ebony", "chocolate", "dark brown", "deep brown"),
    "white": ("caucasian", "european", "anglo", "fair", "pale"),
    "black": ("african american", "african", "afro american", "afro caribbean", "dark skinned"),
    "asian": ("east asian", "chinese", "japanese", "korean", "vietnamese", "filipino", "thai"),
    "hispanic": ("latino", "latina", "latinx", "latin american", "mexican"),
    "south asian": ("indian", "pakistani", "bangladeshi", "sri lankan", "desi"),
    "middle eastern": ("arab", "arabic", "persian", "iranian", "north african"),
}

# Age buckets for answers given as numbers ("30", "in her 40s") to young/middle/old questions.
_AGE_BUCKETS = (("young", 0, 30), ("middle", 30, 60), ("middle aged", 30, 60), ("old", 60, 200))

CLIP_TEMPLATES = ("a photo of {}.", "an image of {}.", "{}")
CLIP_PERSON_TEMPLATES = ("a photo of a {} person.", "a {} person.")
_PERSON_QUESTION = re.compile(r"\b(person|people|man|woman|someone|subject|their|his|her)\b", re.IGNORECASE)

DEFAULT_VOCABULARY = (
    "a person", "a man", "a woman", "a child", "an elderly person", "a group of people", "an animal",
    "a dog", "a cat", "a bird", "a landscape", "a city street", "a building", "a room", "food", "a car",
    "a plant", "an object", "a drawing", "text",
)


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]|_", " ", str(text).lower()).split())


def _find_word(haystack: str, needle: str) -> int:
    """Returns the position of `needle` as whole words in `haystack`, or -1."""
    if not needle:
        return -1
    match = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", haystack)
    return match.start() if match else -1


def _singular(text: str) -> str:
    return " ".join(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in text.split())


def match_choice(answer: str, choices: Sequence[str], synonyms: dict | None = None) -> str:
    """Returns the choice (lower-case) a free-form answer names, or "other".

    In order: exact match; an age in years for young/middle/old choices (<30, 30-59, 60+); a
    choice appearing as whole words in the answer (the earliest, then the longest; not one inside a
    longer synonym phrase, so "light brown" is medium, not light), also after dropping plural "s"; the answer appearing inside exactly one choice; a synonym of a choice
    (SYNONYMS plus `synonyms`)."""
    text = _normalise(answer)
    options = [(str(c).lower().strip(), _normalise(c)) for c in choices]
    if not text:
        return "other"
    for choice, norm in options:
        if text == norm:
            return choice
    age = re.search(r"\b(\d{1,3})", text)
    if age:  # before word matching: in "20 years old", "old" is not the age group
        years = int(age.group(1))
        for choice, norm in options:
            if any(norm == bucket and low <= years < high for bucket, low, high in _AGE_BUCKETS):
                return choice
    extra = {_normalise(k): tuple(_normalise(v) for v in vs) for k, vs in (synonyms or {}).items()}
    # the longest phrase first: a choice inside a longer synonym ("light" in "light brown") is that synonym's
    phrases = [(pos, pos + len(word)) for _, norm in options for word in SYNONYMS.get(norm, ()) + extra.get(norm, ())
               if (pos := _find_word(text, word)) >= 0]
    for haystack, transform in ((text, lambda s: s), (_singular(text), _singular)):
        hits = [(pos, -len(norm), i) for i, (_, norm) in enumerate(options)
                if (pos := _find_word(haystack, transform(norm))) >= 0
                and not any(a <= pos and pos + len(norm) <= b and b - a > len(norm) for a, b in phrases)]
        if hits:
            return options[min(hits)[2]][0]
    inside = [choice for choice, norm in options if _find_word(norm, text) >= 0]
    if len(inside) == 1:
        return inside[0]
    hits = []
    for i, (_, norm) in enumerate(options):
        for word in SYNONYMS.get(norm, ()) + extra.get(norm, ()):
            pos = _find_word(text, word)
            if pos < 0:
                pos = _find_word(_singular(text), _singular(word))
            if pos >= 0:
                hits.append((pos, -len(word), i))
    if hits:
        return options[min(hits)[2]][0]
    return "other"


def _rgb(images: Sequence[Image.Image]) -> list[Image.Image]:
    return [img if img.mode == "RGB" else img.convert("RGB") for img in images]


def _batches(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _short(text: str) -> str:
    """Returns the first line of a generated answer, without surrounding whitespace or a final period."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0].rstrip(".").strip() if lines else ""


def _finish(answers: list[str], choices: Sequence[str] | None, synonyms: dict | None) -> list[str]:
    if choices:
        return [match_choice(a, choices, synonyms) for a in answers]
    return answers


def _continuation_log_probs(logits, ids, mask):
    """Returns (rows,) the log-likelihood of each row's tokens `ids[:, 1:]` (where `mask` is 1) under
    `logits` (rows, length - 1, vocab): the logits that predict each of them."""
    import torch

    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (log_probs * mask[:, 1:]).sum(dim=1)


def torch_index(values: np.ndarray, device):
    """Returns `values` as a long tensor on `device` (indexing rows by a numpy array)."""
    import torch

    return torch.as_tensor(values, dtype=torch.long, device=device)


def _strip_prompt(output, input_ids):
    """Returns only the generated tokens: decoder-only models echo the prompt, encoder-decoders do not."""
    n = input_ids.shape[1]
    if output.shape[1] > n and (output[:, :n].cpu() == input_ids.cpu()).all():
        return output[:, n:]
    return output


# Model types whose prompt is a bidirectional prefix marked by token_type_ids 0 (PaliGemma, PaliGemma 2): what
# follows it, a generated reply included, is 1 (PaliGemmaForConditionalGeneration._update_model_kwargs_for_generation).
PREFIX_LM_MODEL_TYPES = frozenset({"paligemma"})
REPLY_ENDINGS = ("", ".")   # a short reply with or without its final period (`_short` drops it)


def appended_token_types(model, inputs: dict, n: int) -> dict:
    """Returns the per-token inputs beside the ids (token types) of the prompt `inputs` grown by `n` appended
    tokens, as the model's own generation grows them (GenerationMixin._update_model_kwargs_for_generation):
    PaliGemma's token_type_ids with 1 (the causal suffix; 0 would put the tokens in the bidirectional
    prefix, each seeing itself and the ones after it), other token_type_ids with the prompt's last value
    (Gemma 3's: 0, text), mm_token_type_ids (Qwen2-VL's) with 0 (text)."""
    import torch

    out = {}
    for key in ("token_type_ids", "mm_token_type_ids"):
        value = inputs.get(key)
        if value is None:
            continue
        if key == "token_type_ids" and model.config.model_type in PREFIX_LM_MODEL_TYPES:
            grown = torch.ones((value.shape[0], n), dtype=value.dtype, device=value.device)
        elif key == "token_type_ids":
            grown = value[:, -1:].expand(-1, n)
        else:
            grown = torch.zeros((value.shape[0], n), dtype=value.dtype, device=value.device)
        out[key] = torch.cat([value, grown], dim=1)
    return out


def reply_variants(choices: Sequence[str]) -> list[tuple[int, str]]:
    """Returns (choice index, text) for each way a model writes a choice as its whole reply: as given,
    lower-case and with a capital first letter, each bare and with a final period; repeats dropped."""
    out = []
    for i, choice in enumerate(choices):
        text = str(choice).strip()
        for cased in dict.fromkeys((text, text.lower(), text[:1].upper() + text[1:].lower())):
            out += [(i, cased + end) for end in REPLY_ENDINGS]
    return list(dict.fromkeys(out))


def _per_token(value, length: int) -> bool:
    """Whether a processor output is per token (input_ids, attention_mask, token types) of a prompt `length` long."""
    return hasattr(value, "shape") and len(value.shape) == 2 and value.shape[1] == length


def _new_token_types(model, prompt: dict, n: int, repeats: int) -> dict:
    """The token types of `n` tokens appended to `prompt` (`appended_token_types`), alone, each row repeated
    `repeats` times (the rows of `_sequence_log_probs`)."""
    return {k: v[:, -n:].repeat_interleave(repeats, dim=0) for k, v in appended_token_types(model, prompt, n).items()}


class _images_once:
    """Within it, the processor preprocesses a list of images once however many prompts it is called with
    (its `image_processor` answers a repeated call with the same images and settings from memory): every
    question's prompt about the same images gets the very same pixels without recomputing them."""

    def __init__(self, processor):
        self.processor = processor

    def __enter__(self):
        inner = getattr(self.processor, "image_processor", None)
        if inner is not None:
            self.processor.image_processor = _RememberedImages(inner)
        return self

    def __exit__(self, *exc):
        remembered = getattr(self.processor, "image_processor", None)
        if isinstance(remembered, _RememberedImages):
            self.processor.image_processor = remembered.inner
        return False


class _RememberedImages:
    """An image processor that computes each (images, settings) call once (`_images_once`)."""

    def __init__(self, inner):
        self.inner = inner
        self._seen: dict = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, images, *args, **kwargs):
        key = (_identities(images), repr(args), repr(sorted(kwargs.items(), key=lambda kv: kv[0])))
        if key not in self._seen:
            self._seen[key] = self.inner(images, *args, **kwargs)
        return self._seen[key]


def _identities(images) -> tuple:
    """The identities of the images in a (nested) list: a chat template's per-conversation lists included."""
    if isinstance(images, (list, tuple)):
        return tuple(_identities(x) for x in images)
    return id(images)


def _stop_ids(model, tokenizer) -> list[int]:
    """Returns the token ids that end the model's reply: what its generation stops at (its
    generation_config's eos_token_id, e.g. Qwen2-VL-Instruct's <|im_end|> and <|endoftext|>), else the
    tokenizer's end-of-sequence token."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    return sorted({int(i) for i in ([ids] if isinstance(ids, int) else ids or [])})


def _per_choice(scores: np.ndarray, owner: np.ndarray, k: int) -> np.ndarray:
    """Returns (rows, k): per choice the log of the summed probability of its variants' `scores` (rows,
    variants), `owner[j]` naming variant j's choice."""
    from scipy.special import logsumexp

    return np.stack([logsumexp(scores[:, owner == i], axis=1) for i in range(k)], axis=1)


class _GenerativeVQA:
    """What the transformers-generation VQA backends share: model, processor, batching, decoding."""

    def __init__(self, model, processor, *, model_id: str, device: str, batch_size: int, max_new_tokens: int,
                 synonyms: dict | None = None):
        self.model = model
        self.processor = processor
        self.id = model_id
        self.device = device
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.synonyms = synonyms

    def memory_bytes(self) -> int:
        """Returns the bytes of the model's weights (and a captioner's, if any)."""
        return devices.module_bytes(self.model, getattr(self, "captioner", None))

    def move_to(self, device: str) -> bool:
        """Moves the weights (and a captioner's) to `device` ("cpu" parks them in host RAM); False for a
        model spread over devices by device_map."""
        if getattr(self.model, "hf_device_map", None):
            return False
        for model in (self.model, getattr(self, "captioner", None)):
            if model is not None:
                model.to(device)
        self.device = device
        return True

    def _generate(self, model, processor, images: Sequence[Image.Image], inputs_for, **generate_kwargs) -> list[str]:
        """Runs `model.generate` greedily (base.decoding_settings: nothing inherited from the checkpoint's
        generation_config) over the images in batches; `inputs_for(batch)` builds the processor inputs.
        Returns the first line of each decoded reply."""
        import torch

        dtype = next(model.parameters()).dtype
        replies = []
        for batch in _batches(_rgb(images), self.batch_size):
            inputs = _to(inputs_for(batch), devices.weights_device(model), dtype)
            with torch.inference_mode():
                output = model.generate(**inputs, **decoding_settings(0), **generate_kwargs)
            if "input_ids" in inputs:
                output = _strip_prompt(output, inputs["input_ids"])
            replies += [_short(t) for t in processor.batch_decode(output, skip_special_tokens=True)]
        return replies


class BlipVQA(_GenerativeVQA):
    """BLIP question answering (and optional BLIP captioning) behind the VQA protocol."""

    def __init__(self, model, processor, *, model_id: str, device: str, batch_size: int = 16,
                 max_new_tokens: int = 10, captioner=None, caption_processor=None, synonyms: dict | None = None):
        super().__init__(model, processor, model_id=model_id, device=device, batch_size=batch_size,
                         max_new_tokens=max_new_tokens, synonyms=synonyms)
        self.captioner = captioner
        self.caption_processor = caption_processor

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns one short answer per image; with `choices`, one of them (lower-case) or "other"."""
        def inputs_for(batch):
            return self.processor(images=batch, text=[question] * len(batch), return_tensors="pt", padding=True)

        answers = self._generate(self.model, self.processor, images, inputs_for, max_new_tokens=self.max_new_tokens)
        return _finish(answers, choices, self.synonyms)

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """Returns per image each choice's probability as BLIP's whole answer (`answer_questions` with one
        question)."""
        return self.answer_questions(images, [(question, choices)])[0]

    def answer_questions(self, images: Sequence[Image.Image],
                         asks: Sequence[tuple[str, Sequence[str]]]) -> list[list[ClassAnswer]]:
        """Returns per (question, choices) of `asks`, per image, each choice's probability as BLIP's whole
        answer: its log-likelihood as "[DEC] tokens [SEP]" decoded from the question encoded over the image
        (the candidates of salesforce/BLIP `BLIP_VQA.rank_answer`), their softmax over the choices.

        Every question of an image at once: each image is preprocessed and passed through the vision tower
        once; its questions are encoded side by side in one row (`_encode_questions`), so the projection of
        the image tokens into every layer's cross-attention keys and values, nearly all of the question
        encoder's work, is done once per image; then every question's choices are ranked in one decoder call.
        The same numbers as asking one question at a time (to float rounding).

        Not BLIP's own ranking score: `rank_answer` scores candidates with the decoder's training loss,
        which has label smoothing 0.1 (`BertLMHeadModel` in salesforce/BLIP models/med.py,
        `reduction='none'`, `label_smoothing=0.1`), a mixture with the uniform distribution over the
        vocabulary that favours short answers and is no probability of the answer. GapLens keeps the pure
        log-likelihood: the model's probability of writing exactly that answer, the better probability to
        calibrate and to abstain on."""
        import torch

        if not images or not asks:
            return [[] for _ in asks]
        model = self.model
        device, dtype = devices.weights_device(model), next(model.parameters()).dtype
        questions = self.processor(text=[q for q, _ in asks], add_special_tokens=True).input_ids
        ids, mask, owner = self._answer_rows([c for _, c in asks], device)
        out: list[list[ClassAnswer]] = [[] for _ in asks]
        for batch in _batches(_rgb(images), self.batch_size):
            pixels = _to(self.processor(images=batch, return_tensors="pt"), device, dtype)["pixel_values"]
            with torch.inference_mode():
                image_embeds = model.vision_model(pixel_values=pixels)[0]
                scores = self._rank(self._encode_questions(image_embeds, questions), ids, mask, owner).cpu().numpy()
            for a, (_, choices) in enumerate(asks):
                out[a] += [class_answer(choices, row) for row in scores[:, owner == a]]
        return out

    def _answer_rows(self, choice_lists: list, device):
        """(ids, mask, owner): every choice of every question as a decoder row "[DEC] tokens [SEP]" (padded),
        its attention mask, and the index of the question it answers (numpy)."""
        import torch

        model, tokenizer = self.model, self.processor.tokenizer
        text = model.config.text_config
        rows = [[model.decoder_start_token_id, *tokenizer(str(c), add_special_tokens=False).input_ids, text.sep_token_id]
                for choices in choice_lists for c in choices]
        owner = np.array([a for a, choices in enumerate(choice_lists) for _ in choices])
        width = max(map(len, rows))
        ids = torch.tensor([r + [text.pad_token_id] * (width - len(r)) for r in rows], device=device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
        return ids, mask, owner

    def _encode_questions(self, image_embeds, questions: list[list[int]]) -> list:
        """Returns every question encoded over each image: per question its states (images, its tokens, d).
        The questions sit side by side in one row of the text encoder: each attends only to its own tokens
        (a block-diagonal self-attention mask) from position 0, and all of them to the image, whose keys and
        values each layer then projects once for all of them."""
        import torch

        device, dtype = image_embeds.device, image_embeds.dtype
        lengths = [len(q) for q in questions]
        n = sum(lengths)
        block = torch.repeat_interleave(torch.arange(len(questions), device=device), torch.tensor(lengths, device=device))
        blocked = torch.zeros((n, n), dtype=dtype, device=device).masked_fill(
            block[:, None] != block[None, :], torch.finfo(dtype).min)
        rows = len(image_embeds)
        states = self.model.text_encoder(
            input_ids=torch.tensor([t for q in questions for t in q], device=device).expand(rows, n),
            position_ids=torch.cat([torch.arange(k, device=device) for k in lengths]).expand(rows, n),
            attention_mask=blocked.expand(rows, 1, n, n),
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device),
            return_dict=False)[0]
        return list(states.split(lengths, dim=1))

    def _rank(self, states: list, ids, mask, owner: np.ndarray):
        """Returns (images, rows) the log-likelihood of every answer row (`_answer_rows`) decoded from its
        question's states (`_encode_questions`) over each image: one decoder call per question length.
        Questions are never padded to a common length: BLIP's text model (transformers 5.23) drops the
        cross-attention mask (BlipTextAttention passes it on as the self-attention mask, which cross-attention
        replaces by its missing encoder mask), so a padded question's padding would be attended to."""
        import torch

        images = len(states[0])
        scores = torch.empty((images, len(owner)), dtype=torch.float32, device=ids.device)
        lengths = np.array([s.shape[1] for s in states])
        for length in np.unique(lengths):
            group = np.flatnonzero(lengths == length)
            rows = np.flatnonzero(np.isin(owner, group))
            stacked = torch.stack([states[q] for q in group], dim=1)                    # (images, group, length, d)
            which = torch_index(np.searchsorted(group, owner[rows]), ids.device)
            picked, picked_mask = ids[rows].repeat(images, 1), mask[rows].repeat(images, 1)
            logits = self.model.text_decoder(
                input_ids=picked, attention_mask=picked_mask,
                encoder_hidden_states=stacked[:, which].flatten(0, 1), return_logits=True)
            scores[:, torch_index(rows, ids.device)] = _continuation_log_probs(
                logits, picked, picked_mask).view(images, len(rows)).float()
        return scores

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns one short caption per image (the captioner's, else the answer to CAPTION_QUESTION)."""
        if self.captioner is None:
            return self.answer(images, CAPTION_QUESTION)
        return self._generate(self.captioner, self.caption_processor, images,
                              lambda batch: self.caption_processor(images=batch, return_tensors="pt"),
                              max_new_tokens=30)


class VLMVQA(_GenerativeVQA):
    """An image-text-to-text model (greedy, short answers) behind the VQA protocol."""

    def __init__(self, model, processor, *, model_id: str, device: str, batch_size: int = 8,
                 max_new_tokens: int = 20, prefix: str = "", suffix: str = VLM_SUFFIX,
                 prompt_template: str = VLM_PROMPT_TEMPLATE,
                 caption_prompt: str = VLM_CAPTION_PROMPT, synonyms: dict | None = None):
        super().__init__(model, processor, model_id=model_id, device=device, batch_size=batch_size,
                         max_new_tokens=max_new_tokens, synonyms=synonyms)
        self.prefix = prefix
        self.suffix = suffix
        self.prompt_template = prompt_template
        self.caption_prompt = caption_prompt
        self._has_template = bool(getattr(processor, "chat_template", None))

    def _inputs(self, batch: list[Image.Image], text: str):
        if self._has_template:
            conversations = [[{"role": "user", "content": [{"type": "image", "image": img},
                                                           {"type": "text", "text": text}]}] for img in batch]
            return self.processor.apply_chat_template(
                conversations, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
                processor_kwargs={"padding": True})
        prompt = self.prompt_template.format(question=text)
        inputs = self.processor(images=batch, text=[prompt] * len(batch), return_tensors="pt", padding=True)
        inputs.pop("labels", None)   # PaliGemma's processor adds training labels: nothing to train here
        return inputs

    def ask(self, images: Sequence[Image.Image], text: str) -> list[str]:
        """Returns the model's greedy reply to `text` (sent as is) for each image."""
        return self._generate(self.model, self.processor, images, lambda batch: self._inputs(batch, text),
                              max_new_tokens=self.max_new_tokens)

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns one short answer per image; with `choices`, one of them (lower-case) or "other"."""
        return _finish(self.ask(images, self.prefix + question + self.suffix), choices, self.synonyms)

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """Returns per image the probability of each choice as the model's whole reply (`answer_questions`
        with one question)."""
        return self.answer_questions(images, [(question, choices)])[0]

    def answer_questions(self, images: Sequence[Image.Image],
                         asks: Sequence[tuple[str, Sequence[str]]]) -> list[list[ClassAnswer]]:
        """Returns per (question, choices) of `asks`, per image, the probability of each choice as the model's
        whole reply to the question with the choices listed (VLM_CHOICES_SUFFIX), and the model's own greedy
        reply as the text.

        A choice's score is the probability that the reply is that choice and nothing more: its tokens
        and then the token the model ends its turn with (`_stop_ids`), summed over the ways a model writes
        it (`reply_variants`: "male", "Male", "Male."), so a choice that is the start of another
        ("middle" of "middle class") does not win by being shorter, and Qwen2-VL's usual "Male" counts.
        The softmax of the scores over the choices is the probability.

        Every question of an image at once: the processor preprocesses each image once (`_images_once`);
        the prompts' shared start (system text and image tokens, `_shared_prefix`) is prefilled once, vision
        tower included, and its key/value cache reused by every question; from each question's cache its
        choices are scored in one call and its reply decoded greedily. The same numbers as one full forward
        pass per choice (to float rounding). PaliGemma's prompt is one bidirectional block (the image tokens
        attend to the question), so there each question is prefilled whole."""
        import torch

        if not images or not asks:
            return [[] for _ in asks]
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        options = []
        for _, choices in asks:
            variants = reply_variants(choices)
            options.append(([tokenizer(v, add_special_tokens=False).input_ids for _, v in variants],
                            np.array([i for i, _ in variants])))
        texts = [self.prefix + q + VLM_CHOICES_SUFFIX.format(choices=", ".join(str(c) for c in choices))
                 for q, choices in asks]
        stops = _stop_ids(self.model, tokenizer)
        out: list[list[ClassAnswer]] = [[] for _ in asks]
        for batch in _batches(_rgb(images), self.batch_size):
            with torch.inference_mode():
                for a, answers in enumerate(self._answer_batch(batch, texts, options, stops)):
                    out[a] += [class_answer(asks[a][1], row, reply) for row, reply in answers]
        return out

    def _answer_batch(self, batch: list, texts: list[str], options: list, stops: list[int]) -> list[list]:
        """Per question, per image of `batch`: (its choices' log-scores, its greedy reply). Prompts padded to
        a common length (images of different sizes) go one image at a time, where nothing is padded."""
        device, dtype = devices.weights_device(self.model), next(self.model.parameters()).dtype
        with _images_once(self.processor):
            prompts = [_to(self._inputs(batch, text), device, dtype) for text in texts]
        if len(batch) > 1 and any(bool((p["attention_mask"] == 0).any()) for p in prompts):
            alone = [self._answer_batch([image], texts, options, stops) for image in batch]
            return [[row for one in alone for row in one[a]] for a in range(len(texts))]
        out = []
        for prompt, (cache, last), (sequences, owner) in zip(prompts, self._question_states(prompts), options):
            tokens, ends = self._sequence_log_probs(cache, last, sequences, stops, prompt)
            replies = self._greedy(cache, last, stops, prompt)
            out.append(list(zip(_per_choice(tokens + ends, owner, int(owner.max()) + 1), replies)))
        return out

    def _shared_prefix(self, prompts: list[dict]) -> int:
        """Returns how many leading tokens every prompt shares with the others, image tokens included (0 when
        they cannot share a cache: PaliGemma's bidirectional prompt, or image tokens after the shared part)."""
        import torch

        if self.model.config.model_type in PREFIX_LM_MODEL_TYPES or len(prompts) < 2:
            return 0
        ids = [p["input_ids"] for p in prompts]
        width = min(i.shape[1] for i in ids)
        same = torch.stack([(i[:, :width] == ids[0][:, :width]).all(dim=0) for i in ids]).all(dim=0)
        shared = int(width if bool(same.all()) else int(torch.argmin(same.int())))
        image_token = getattr(self.model.config, "image_token_id", getattr(self.model.config, "image_token_index", None))
        if image_token is not None and any(bool((i[:, shared:] == image_token).any()) for i in ids):
            return 0
        return shared

    def _question_states(self, prompts: list[dict]):
        """Yields per prompt (its key/value cache, the logits after its last token): the shared prefix
        (`_shared_prefix`) prefilled once with the images, then each prompt's own tokens on a copy of its cache."""
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        shared = self._shared_prefix(prompts)
        if not shared:
            for prompt in prompts:
                output = self.model(**prompt, use_cache=True, **keep)
                yield output.past_key_values, output.logits[:, -1]
            return
        first = prompts[0]
        length = first["input_ids"].shape[1]
        head = {k: v[:, :shared] if _per_token(v, length) else v for k, v in first.items()}
        prefix = self.model(**head, use_cache=True, **keep)
        for prompt in prompts:
            own = prompt["input_ids"].shape[1]
            if own == shared:
                yield copy.deepcopy(prefix.past_key_values), prefix.logits[:, -1]
                continue
            rest = {k: v[:, shared:] for k, v in prompt.items() if _per_token(v, own) and k != "attention_mask"}
            output = self.model(**rest, past_key_values=copy.deepcopy(prefix.past_key_values), use_cache=True, **keep)
            yield output.past_key_values, output.logits[:, -1]

    @property
    def _keeps_logits(self) -> bool:
        """Whether the model computes only the last logits when asked (`logits_to_keep`): a whole prompt's over a
        150k vocabulary would take gigabytes."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _sequence_log_probs(self, cache, last, sequences: list[list[int]], stops: list[int], prompt: dict,
                            max_rows: int = 64):
        """Returns (tokens, ends), each (images, len(sequences)): the log-likelihood of each token sequence as
        the continuation of the prompt whose cache and last logits are given, and the log-probability that the
        model's turn then ends (any of `stops`). Sequences are scored side by side on copies of the cache (at
        most `max_rows` rows at once); the appended tokens get the token types the model's own generation
        gives new tokens (`appended_token_types`)."""
        import torch

        images = len(last)
        first = torch.log_softmax(last.float(), dim=-1)
        tokens = np.zeros((images, len(sequences)))
        ends = np.zeros((images, len(sequences)))
        step = max(1, max_rows // images)
        for start in range(0, len(sequences), step):
            chunk = sequences[start:start + step]
            width = max(map(len, chunk))
            ids = torch.tensor([s + [s[-1]] * (width - len(s)) for s in chunk], device=last.device).repeat(images, 1)
            grown = copy.deepcopy(cache)
            grown.batch_repeat_interleave(len(chunk))
            types = _new_token_types(self.model, prompt, width, len(chunk))
            logits = self.model(input_ids=ids, past_key_values=grown, use_cache=True, **types).logits
            for j, sequence in enumerate(chunk):
                rows = torch.arange(images, device=last.device) * len(chunk) + j
                n = len(sequence)
                log_probs = torch.log_softmax(logits[rows, :n].float(), dim=-1)            # predicts tokens 1.. and the end
                total = first[:, sequence[0]] + log_probs[:, :n - 1].gather(
                    -1, torch.tensor(sequence[1:], device=last.device).expand(images, -1)[:, :, None]).squeeze(-1).sum(1)
                end = torch.logsumexp(log_probs[:, n - 1, stops], dim=-1) if stops else torch.zeros_like(total)
                tokens[:, start + j], ends[:, start + j] = total.cpu().numpy(), end.cpu().numpy()
        return tokens, ends

    def _greedy(self, cache, last, stops: list[int], prompt: dict) -> list[str]:
        """Returns the model's greedy reply from the prompt whose cache (consumed) and last logits are given,
        as `generate` decodes it: the most probable token each step, until every image's reply has ended
        (any of `stops`) or `max_new_tokens`; then the first line of each decoded reply (`_short`)."""
        import torch

        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
        stop = torch.tensor(stops, device=last.device)
        done = torch.zeros(len(last), dtype=torch.bool, device=last.device)
        keep = {"logits_to_keep": 1} if self._keeps_logits else {}
        types = _new_token_types(self.model, prompt, 1, 1)   # every generated token's: the same each step
        replies, logits = [], last
        for step in range(self.max_new_tokens):
            chosen = torch.where(done, torch.full_like(done, pad, dtype=torch.long), logits.argmax(dim=-1))
            replies.append(chosen)
            done |= torch.isin(chosen, stop)
            if bool(done.all()) or step == self.max_new_tokens - 1:
                break
            output = self.model(input_ids=chosen[:, None], past_key_values=cache, use_cache=True, **types, **keep)
            cache, logits = output.past_key_values, output.logits[:, -1]
        text = self.processor.batch_decode(torch.stack(replies, dim=1), skip_special_tokens=True) if replies else []
        return [_short(t) for t in text]

    def _continuations(self, inputs: dict, sequences: list[list[int]], stops: list[int]):
        """Returns (tokens, ends) of `_sequence_log_probs` for one prompt's processor `inputs`."""
        import torch

        with torch.inference_mode():
            cache, last = next(self._question_states([inputs]))
            return self._sequence_log_probs(cache, last, sequences, stops, inputs)

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns one short caption per image (the reply to `caption_prompt`, without the VQA prefix)."""
        return self.ask(images, self.caption_prompt)


class ClipVQA:
    """Zero-shot multiple-choice answering with a CLIP-like embedder, behind the VQA protocol."""

    def __init__(self, embedder, *, templates: Sequence[str] = CLIP_TEMPLATES,
                 person_templates: Sequence[str] = CLIP_PERSON_TEMPLATES,
                 vocabulary: Sequence[str] = DEFAULT_VOCABULARY, owns_embedder: bool = False):
        self.embedder = embedder
        self.owns_embedder = owns_embedder
        self.templates = tuple(templates)
        self.person_templates = tuple(person_templates)
        self.vocabulary = tuple(vocabulary)
        custom = (self.templates, self.person_templates, self.vocabulary) != (
            CLIP_TEMPLATES, CLIP_PERSON_TEMPLATES, DEFAULT_VOCABULARY)
        suffix = "+" + hashlib.sha1(json.dumps([self.templates, self.person_templates, self.vocabulary])
                                    .encode()).hexdigest()[:8] if custom else ""
        self.id = f"clip_vqa:{embedder.id}{suffix}"
        self._text_cache: dict[tuple, np.ndarray] = {}

    def memory_bytes(self) -> int:
        """Returns the embedder's bytes when this backend loaded it, else 0 (the manager counts a shared one)."""
        estimate = getattr(self.embedder, "memory_bytes", None)
        return int(estimate()) if self.owns_embedder and callable(estimate) else 0

    def move_to(self, device: str) -> bool:
        """Moves an embedder this backend loaded to `device`; a shared one is the manager's to move."""
        return self.embedder.move_to(device) if self.owns_embedder else True

    def _choice_embeddings(self, choices: Sequence[str], templates: tuple[str, ...]) -> np.ndarray:
        """Returns (n_choices, d): each choice's template-averaged, re-normalised text embedding."""
        rows = []
        for choice in choices:
            key = (choice, templates)
            if key not in self._text_cache:
                emb = self.embedder.embed_texts([t.format(choice) for t in templates]).mean(axis=0)
                self._text_cache[key] = emb / max(float(np.linalg.norm(emb)), 1e-12)
            rows.append(self._text_cache[key])
        return np.stack(rows).astype(np.float32)

    def _templates_for(self, question: str) -> tuple[str, ...]:
        # Person templates suit attributes ("a young person") but not nouns ("a hat person"): add, don't replace.
        return self.templates + (self.person_templates if _PERSON_QUESTION.search(question) else ())

    def scores(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> np.ndarray:
        """Returns (n_images, n_choices) cosine similarities between images and choices."""
        return self.embedder.embed_images(images) @ self._choice_embeddings(choices, self._templates_for(question)).T

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns the best-scoring choice (lower-case) per image. Without choices, the best entry
        of the caption vocabulary (documented fallback: CLIP cannot answer open questions)."""
        if not images:
            return []
        options = [str(c) for c in choices] if choices else list(self.vocabulary)
        best = self.scores(images, question, options).argmax(axis=1)
        return [options[i].lower() for i in best]

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """Returns per image the softmax over the choices of the model's logits (`answer_questions` with one
        question)."""
        return self.answer_questions(images, [(question, choices)])[0]

    def answer_questions(self, images: Sequence[Image.Image], asks: Sequence[tuple[str, Sequence[str]]],
                         embeddings: np.ndarray | None = None) -> list[list[ClassAnswer]]:
        """Returns per (question, choices) of `asks`, per image, the softmax over the choices of the model's
        logits, scale × cosine similarity + bias, with the loaded model's own learned temperature
        (base.logit_temperature: 100 for OpenAI/LAION CLIP, SigLIP's learned scale and bias; option-free).
        Each image is embedded once for every question (`embeddings`: its stored embedding by this very
        embedder, when the caller has it, and then not at all); each question's choices are embedded once
        per backend (a small cache)."""
        if not images:
            return [[] for _ in asks]
        vectors = self.embedder.embed_images(images) if embeddings is None else np.asarray(embeddings, np.float32)
        scale, bias = logit_temperature(self.embedder)
        out = []
        for question, choices in asks:
            logits = scale * vectors @ self._choice_embeddings([str(c) for c in choices], self._templates_for(question)).T
            out.append([class_answer(choices, row) for row in logits + bias])
        return out

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns "a photo of <best vocabulary entry>" per image."""
        if not images:
            return []
        best = self.scores(images, "", self.vocabulary).argmax(axis=1)
        return [f"a photo of {self.vocabulary[i]}" for i in best]


def _to(inputs, device: str, dtype):
    """Moves a processor output to `device`, casting floating tensors (pixels) to the model dtype."""
    return {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) if hasattr(v, "to") else v
            for k, v in inputs.items()}


def _hub_kwargs(options: dict) -> dict:
    return {k: options[k] for k in ("revision", "token", "cache_dir") if options.get(k)}


def _check_path(model: str) -> None:
    if devices.looks_like_local_path(model) and not Path(model).expanduser().exists():
        raise ModelLoadError(f"no such model directory: '{model}'")


def _identity(model, name: str, options: dict) -> str:
    commit = devices.hub_commit(name, revision=options.get("revision"), cache_dir=options.get("cache_dir"))
    return devices.model_identity(name, revision=options.get("revision"), commit=commit)


def _load_blip(spec: ModelSpec, device: str) -> BlipVQA:
    from transformers import AutoProcessor, BlipForConditionalGeneration, BlipForQuestionAnswering

    options = spec.options
    _check_path(spec.model)
    hub = _hub_kwargs(options)
    dtype = devices.default_dtype(device, override=options.get("dtype"))
    model, info = BlipForQuestionAnswering.from_pretrained(spec.model, dtype=dtype, output_loading_info=True, **hub)
    devices.require_complete_weights(spec.model, info, "BLIP question-answering")
    clear_generation_defaults(model)
    model = model.to(device).eval()
    processor = AutoProcessor.from_pretrained(spec.model, **hub)
    model_id = f"blip_vqa:{_identity(model, spec.model, options)}"
    captioner = caption_processor = None
    if options.get("caption_model"):
        name = str(options["caption_model"])
        _check_path(name)
        captioner, info = BlipForConditionalGeneration.from_pretrained(name, dtype=dtype, output_loading_info=True)
        devices.require_complete_weights(name, info, "BLIP captioning")
        clear_generation_defaults(captioner)
        captioner = captioner.to(device).eval()
        caption_processor = AutoProcessor.from_pretrained(name)
        model_id += f"|caption:{_identity(captioner, name, {})}"
    return BlipVQA(model, processor, model_id=model_id, device=device,
                   batch_size=int(options.get("batch_size", 16)), max_new_tokens=int(options.get("max_new_tokens", 10)),
                   captioner=captioner, caption_processor=caption_processor, synonyms=options.get("synonyms"))


def _load_vlm(spec: ModelSpec, device: str) -> VLMVQA:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    options = spec.options
    _check_path(spec.model)
    hub = _hub_kwargs(options)
    trust = bool(options.get("trust_remote_code", False))
    from transformers import AutoConfig

    model_type = AutoConfig.from_pretrained(spec.model, trust_remote_code=trust, **hub).model_type
    dtype = devices.vlm_dtype(model_type, device, options.get("dtype"))
    if model_type in devices.FP16_UNSTABLE_MODEL_TYPES and dtype != devices.default_dtype(
            device, prefer_bf16=True, override=options.get("dtype")):
        logger.warning("%s (%s) answers garbage in fp16 and %s has no native bf16: running it in fp32 "
                       "(twice the memory; option dtype overrides)", spec.model, model_type, device)
    placement = {"device_map": options["device_map"]} if options.get("device_map") else {}
    model, info = AutoModelForImageTextToText.from_pretrained(
        spec.model, dtype=dtype, trust_remote_code=trust, output_loading_info=True, **placement, **hub)
    devices.require_complete_weights(spec.model, info, "image-text-to-text")
    clear_generation_defaults(model)
    if not placement:
        model = model.to(device)
    model.eval()
    processor = AutoProcessor.from_pretrained(spec.model, trust_remote_code=trust, **hub)
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is not None and not model.config.is_encoder_decoder:
        tokenizer.padding_side = "left"  # batched generation continues right after each prompt
    prefix, suffix = str(options.get("prefix", "")), str(options.get("suffix", VLM_SUFFIX))
    model_id = f"vlm:{_identity(model, spec.model, options)}" + (f"+prefix:{prefix.strip()}" if prefix else "")
    if suffix != VLM_SUFFIX:
        model_id += f"+suffix:{hashlib.sha1(suffix.encode()).hexdigest()[:8]}"
    return VLMVQA(model, processor, model_id=model_id, device=str(model.device), prefix=prefix, suffix=suffix,
                  batch_size=int(options.get("batch_size", 8)), max_new_tokens=int(options.get("max_new_tokens", 20)),
                  prompt_template=str(options.get("prompt_template", VLM_PROMPT_TEMPLATE)),
                  caption_prompt=str(options.get("caption_prompt", VLM_CAPTION_PROMPT)),
                  synonyms=options.get("synonyms"))


_CLIP_VQA_OPTIONS = ("embedder_backend", "templates", "person_templates", "vocabulary")


def _load_clip_vqa(spec: ModelSpec, device: str, embedder=None) -> ClipVQA:
    options = spec.options
    owns_embedder = embedder is None
    if embedder is None:
        if not spec.model:
            raise ModelLoadError("clip_vqa needs an embedder: pass embedder= to load_backend or name a CLIP model")
        from . import load_backend

        backend = str(options.get("embedder_backend", "open_clip"))
        rest = {k: v for k, v in options.items() if k not in _CLIP_VQA_OPTIONS}
        embedder = load_backend(ModelSpec(backend, spec.model, rest), device)
    return ClipVQA(embedder, templates=options.get("templates", CLIP_TEMPLATES),
                   person_templates=options.get("person_templates", CLIP_PERSON_TEMPLATES),
                   vocabulary=options.get("vocabulary", DEFAULT_VOCABULARY), owns_embedder=owns_embedder)


def load(spec: ModelSpec, device: str, **context):
    """Loads a VQA backend ("blip_vqa", "vlm" or "clip_vqa") onto `device`. For "clip_vqa",
    `context["embedder"]` may pass an already-loaded Embedder. Returns BlipVQA, VLMVQA or ClipVQA."""
    if spec.backend == "blip_vqa":
        return _load_blip(spec, device)
    if spec.backend == "vlm":
        return _load_vlm(spec, device)
    if spec.backend == "clip_vqa":
        return _load_clip_vqa(spec, device, context.get("embedder"))
    raise ModelLoadError(f"vqa cannot load backend '{spec.backend}' ('{spec.model}')")
