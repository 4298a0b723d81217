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
        """Returns per image each choice's probability as BLIP's whole answer: its log-likelihood as
        "[DEC] tokens [SEP]" decoded from the question encoded over the image (the candidates of
        salesforce/BLIP `BLIP_VQA.rank_answer`), their softmax over the choices.

        Not BLIP's own ranking score: `rank_answer` scores candidates with the decoder's training loss,
        which has label smoothing 0.1 (`BertLMHeadModel`, `reduction='none'`, `label_smoothing=0.1`), a
        mixture with the uniform distribution over the vocabulary that favours short answers and is no
        probability of the answer. GapLens keeps the pure log-likelihood: the model's probability of
        writing exactly that answer, the better probability to calibrate and to abstain on."""
        import torch

        model, tokenizer = self.model, self.processor.tokenizer
        text = model.config.text_config
        rows = [[model.decoder_start_token_id, *tokenizer(str(c), add_special_tokens=False).input_ids, text.sep_token_id]
                for c in choices]
        width = max(map(len, rows))
        device, dtype = devices.weights_device(model), next(model.parameters()).dtype
        ids = torch.tensor([r + [text.pad_token_id] * (width - len(r)) for r in rows], device=device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
        out = []
        for batch in _batches(_rgb(images), self.batch_size):
            inputs = _to(self.processor(images=batch, text=[question] * len(batch), return_tensors="pt", padding=True),
                         device, dtype)
            with torch.inference_mode():
                image_embeds = model.vision_model(pixel_values=inputs["pixel_values"])[0]
                question_states = model.text_encoder(
                    input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                    encoder_hidden_states=image_embeds,
                    encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device),
                    return_dict=False)[0]
                k = len(rows)
                logits = model.text_decoder(
                    input_ids=ids.repeat(len(batch), 1), attention_mask=mask.repeat(len(batch), 1),
                    encoder_hidden_states=question_states.repeat_interleave(k, 0),
                    encoder_attention_mask=inputs["attention_mask"].repeat_interleave(k, 0), return_logits=True)
                scores = _continuation_log_probs(logits, ids.repeat(len(batch), 1), mask.repeat(len(batch), 1))
            out += [class_answer(choices, row) for row in scores.view(len(batch), k).cpu().numpy()]
        return out

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
        """Returns per image the probability of each choice as the model's whole reply to the question with
        the choices listed (VLM_CHOICES_SUFFIX), and the model's own greedy reply as the text.

        A choice's score is the probability that the reply is that choice and nothing more: its tokens
        and then the token the model ends its turn with (`_stop_ids`), summed over the ways a model writes
        it (`reply_variants`: "male", "Male", "Male."), so a choice that is the start of another
        ("middle" of "middle class") does not win by being shorter, and Qwen2-VL's usual "Male" counts.
        The softmax of the scores over the choices is the probability."""
        text = self.prefix + question + VLM_CHOICES_SUFFIX.format(choices=", ".join(str(c) for c in choices))
        replies = self.ask(images, text)
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        variants = reply_variants(choices)
        sequences = [tokenizer(v, add_special_tokens=False).input_ids for _, v in variants]
        owner = np.array([i for i, _ in variants])
        stops = _stop_ids(self.model, tokenizer)
        scores = []
        for batch in _batches(_rgb(images), self.batch_size):
            inputs = _to(self._inputs(batch, text), devices.weights_device(self.model), next(self.model.parameters()).dtype)
            tokens, ends = self._continuations(inputs, sequences, stops)
            scores += _per_choice(tokens + ends, owner, len(choices)).tolist()
        return [class_answer(choices, row, reply) for row, reply in zip(scores, replies)]

    def _continuations(self, inputs: dict, sequences: list[list[int]], stops: list[int]):
        """Returns (tokens, ends), each (batch, len(sequences)): the log-likelihood of each token sequence as
        the continuation of the prompt `inputs`, and the log-probability that the model's turn then ends
        (any of `stops`). The appended tokens get the token types the model's own generation gives new
        tokens (`appended_token_types`)."""
        import torch

        prompt = inputs["input_ids"]
        device = prompt.device
        # only the logits that predict the sequence: a whole prompt's over a 150k vocabulary would take gigabytes
        keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        tokens, ends = [], []
        for sequence in sequences:
            tail = torch.tensor([sequence], device=device).expand(len(prompt), -1)
            longer = appended_token_types(self.model, inputs, len(sequence))
            ids = torch.cat([prompt, tail], dim=1)
            mask = torch.cat([inputs["attention_mask"], torch.ones_like(tail)], dim=1)
            extra = {"logits_to_keep": len(sequence) + 1} if keep else {}
            with torch.inference_mode():
                logits = self.model(**{**inputs, **longer, "input_ids": ids, "attention_mask": mask}, **extra).logits
            log_probs = torch.log_softmax(logits[:, -len(sequence) - 1:].float(), dim=-1)
            tokens.append(log_probs[:, :-1].gather(-1, tail[:, :, None]).squeeze(-1).sum(dim=1))
            ends.append(torch.logsumexp(log_probs[:, -1, stops], dim=-1) if stops else torch.zeros_like(tokens[-1]))
        return torch.stack(tokens, dim=1).cpu().numpy(), torch.stack(ends, dim=1).cpu().numpy()

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

    def scores(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> np.ndarray:
        """Returns (n_images, n_choices) cosine similarities between images and choices."""
        # Person templates suit attributes ("a young person") but not nouns ("a hat person"): add, don't replace.
        templates = self.templates + (self.person_templates if _PERSON_QUESTION.search(question) else ())
        return self.embedder.embed_images(images) @ self._choice_embeddings(choices, templates).T

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
        """Returns per image the softmax over the choices of the model's logits, scale × cosine similarity +
        bias, with the loaded model's own learned temperature (base.logit_temperature: 100 for OpenAI/LAION
        CLIP, SigLIP's learned scale and bias; option-free)."""
        if not images:
            return []
        scale, bias = logit_temperature(self.embedder)
        logits = scale * self.scores(images, question, [str(c) for c in choices]) + bias
        return [class_answer(choices, row) for row in logits]

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
