"""Evaluation cost at real size, on this CPU: every question of an image at once against one at a time.

    python bench/evaluation_cost.py [--images 2] [--repeats 1] [--vlm-layers 4] [--tiny] [--parts blip,vlm,distilled]

BLIP: BlipForQuestionAnswering built at its released size (transformers' `BlipConfig()` defaults are
Salesforce/blip-vqa-base's: ViT-B/16 at 384 px, 577 image tokens, a 12-layer BERT-base text encoder and
decoder, 30,524 tokens), random weights, a WordPiece tokenizer of that size (no hub here), `--images`
384-px images and the occupation study's 8 closed-set questions (one per axis of
assets/occupation_axes.json, its choices). Today's path (`todays_answer_classes`: the code before
issue 46, one question at a time: a vision pass, the question encoded over the image, its choices
ranked) and the new one (`BlipVQA.answer_questions`: one vision pass, the questions encoded side by
side so each layer projects the image's cross-attention keys and values once, every choice ranked)
in one run, interleaved.

Printed: `vision_passes_per_image` (forward hooks on the vision tower, new path), `max_prob_difference`
(new against today's, every image, question and choice), `answers_identical`, the seconds of each
part of today's path for one question (`vision_pass_s`, `question_encoder_s`, `ranking_s`, batch of
`--images`), the share of the question encoder's FLOPs that is the image tokens' key/value projection
(`cross_kv_flop_share`), `evaluation_speedup_limit` (today's seconds over the new path's, estimated from
those parts: one vision pass, the key/value share once, the rest per question), then the VLM: a Qwen2-VL
at Qwen2-VL-2B's width (1,536, 12 heads, 2 KV heads, 8,960 FFN; its vision tower at 1,280 wide) with
`--vlm-layers` decoder and vision layers instead of 28 and 32 (random weights, 448-px images = 256
image tokens): `vlm_prefix_reuse_ratio` (the 8 questions one call each over one call for all, the
prefix prefilled once and its cache reused) and `vlm_max_prob_difference`; the distilled evaluator on
the synthetic world's occupation subset (`distilled_teacher_share`: answers sent to the teacher over every
axis, the calibration sample included; `distilled_agreement`: held-out accuracy against the teacher, the
worst axis); headline last: `evaluation_speedup` (BLIP, today's seconds over the new path's).
`--tiny`: the tiny models of tests/tiny_models.py instead (the CI smoke run: checks that it runs).

Seconds are this process's CPU seconds (`time.process_time`, torch on OMP_NUM_THREADS threads, 1 by
default): the work itself, which a shared machine's other processes slow down in wall time but not here.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, report, thread_settings

os.environ.setdefault("OMP_NUM_THREADS", "1")

QUESTIONS_TEMPLATE = "What is the {axis} ({values}) of the person in the image?"


def occupation_asks() -> list[tuple[str, list[str]]]:
    """The occupation study's 8 closed-set questions: per axis of assets/occupation_axes.json its
    choices (cfsets.choices) and its question (the known axis' where the choices match, else the template
    Intersectional falls back to)."""
    from engine.methods.axes import known_axes
    from engine.methods.cfsets import choices

    table = json.loads((ROOT / "assets" / "occupation_axes.json").read_text())
    known = known_axes()
    asks = []
    for axis, cfs in table["axes"].items():
        values = choices(table["prompt"], cfs)
        axis_known = known.get(axis)
        question = (axis_known.question if axis_known and set(axis_known.values) == set(values)
                    else QUESTIONS_TEMPLATE.format(axis=axis, values=", ".join(values)))
        asks.append((question, values))
    return asks


def images_384(n: int) -> list:
    """`n` 384 x 384 images of smooth random colour fields (seeded)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        small = rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)
        out.append(Image.fromarray(small).resize((384, 384), Image.BILINEAR))
    return out


def wordpiece_tokenizer(path: Path):
    """A BERT WordPiece tokenizer the size of bert-base-uncased + BLIP's [DEC] and [ENC] (30,524 tokens,
    [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, [DEC] 30522): common words from the CLIP
    vocabulary bundled with open_clip, and one-letter pieces."""
    from tiny_models import _clip_vocab_and_merges
    from transformers import BertTokenizer

    specials = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789-,.?'")
    words = dict.fromkeys(letters + [f"##{c}" for c in letters])
    for token in _clip_vocab_and_merges()[0]:
        word = token.removesuffix("</w>")
        if token.endswith("</w>") and word.isalpha() and word.isascii():
            words.setdefault(word)
    words = [w for w in words if w not in specials.values()]
    vocab, it = [], iter(words)
    for i in range(30522):
        vocab.append(specials.get(i) or (f"[unused{i}]" if i < 100 else next(it)))
    vocab += ["[DEC]", "[ENC]"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return BertTokenizer(vocab_file=str(path / "vocab.txt"), do_lower_case=True, bos_token="[DEC]")


def blip_base(work: Path, tiny: bool):
    """A BlipVQA over BlipForQuestionAnswering(BlipConfig()) with random weights (or the tiny one)."""
    import torch
    from transformers import BlipConfig, BlipForQuestionAnswering, BlipImageProcessor, BlipProcessor

    from engine.backends import load_backend
    from engine.backends.vqa import BlipVQA

    if tiny:
        from tiny_models import build_tiny_blip_vqa

        return load_backend(build_tiny_blip_vqa(work, with_captioner=False))
    torch.manual_seed(0)
    model = BlipForQuestionAnswering(BlipConfig()).eval()
    processor = BlipProcessor(image_processor=BlipImageProcessor(), tokenizer=wordpiece_tokenizer(work / "wordpiece"))
    return BlipVQA(model, processor, model_id="blip_vqa:BlipConfig()-random", device="cpu")


def todays_answer_classes(vqa, images, question, choices):
    """BlipVQA.answer_classes as it was before issue 46 (commit bc914b5): per question a vision pass, the
    question encoded over the image tokens, its choices ranked. Kept here as the bench's reference."""
    import torch

    from engine.backends import device as devices
    from engine.backends.base import class_answer
    from engine.backends.vqa import _batches, _continuation_log_probs, _rgb, _to

    model, tokenizer = vqa.model, vqa.processor.tokenizer
    text = model.config.text_config
    rows = [[model.decoder_start_token_id, *tokenizer(str(c), add_special_tokens=False).input_ids, text.sep_token_id]
            for c in choices]
    width = max(map(len, rows))
    device, dtype = devices.weights_device(model), next(model.parameters()).dtype
    ids = torch.tensor([r + [text.pad_token_id] * (width - len(r)) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
    out, parts = [], {"vision_pass_s": 0.0, "question_encoder_s": 0.0, "ranking_s": 0.0}
    for batch in _batches(_rgb(images), vqa.batch_size):
        inputs = _to(vqa.processor(images=batch, text=[question] * len(batch), return_tensors="pt", padding=True),
                     device, dtype)
        with torch.inference_mode():
            start = time.process_time()
            image_embeds = model.vision_model(pixel_values=inputs["pixel_values"])[0]
            parts["vision_pass_s"] += time.process_time() - start
            start = time.process_time()
            question_states = model.text_encoder(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                encoder_hidden_states=image_embeds,
                encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device),
                return_dict=False)[0]
            parts["question_encoder_s"] += time.process_time() - start
            start = time.process_time()
            k = len(rows)
            logits = model.text_decoder(
                input_ids=ids.repeat(len(batch), 1), attention_mask=mask.repeat(len(batch), 1),
                encoder_hidden_states=question_states.repeat_interleave(k, 0),
                encoder_attention_mask=inputs["attention_mask"].repeat_interleave(k, 0), return_logits=True)
            scores = _continuation_log_probs(logits, ids.repeat(len(batch), 1), mask.repeat(len(batch), 1))
            parts["ranking_s"] += time.process_time() - start
        out += [class_answer(choices, row) for row in scores.view(len(batch), k).cpu().numpy()]
    return out, parts


def cross_kv_flop_share(config, question_tokens: float) -> float:
    """The share of one question's text-encoder FLOPs (BLIP: BERT layers with cross-attention over the
    image tokens) that is the projection of the image tokens into each layer's cross-attention keys and
    values: the part computed once per image when the questions share it."""
    text, vision = config.text_config, config.vision_config
    d, ffn, m, L = text.hidden_size, text.intermediate_size, (vision.image_size // vision.patch_size) ** 2 + 1, question_tokens
    kv = 2 * m * text.encoder_hidden_size * d
    per_layer = (4 * L * d * d + 2 * L * L * d        # self-attention: q, k, v, out projections; scores and mix
                 + 2 * L * d * d + kv + 2 * L * m * d  # cross-attention: q and out projections, k/v of the image, scores and mix
                 + 2 * L * d * ffn)                    # feed-forward
    return kv / per_layer


def count_calls(module, images_seen: list):
    """Registers a forward hook on `module` that adds each call's batch size to `images_seen`."""
    return module.register_forward_hook(lambda _m, args, kwargs_or_out, *rest: images_seen.append(
        int(next(iter(_tensors(args, kwargs_or_out))).shape[0])), with_kwargs=True)


def _tensors(args, kwargs):
    import torch

    yield from (a for a in args if isinstance(a, torch.Tensor))
    yield from (v for v in kwargs.values() if isinstance(v, torch.Tensor))


def blip_section(args, work: Path) -> dict:
    vqa = blip_base(work, args.tiny)
    vqa.batch_size = args.images
    asks = occupation_asks()
    images = images_384(args.images)
    old_s, new_s, parts, old, new, passes = [], [], None, None, None, []
    for _ in range(args.repeats):   # interleaved, so drift on a busy machine hits both alike
        start = time.process_time()
        got = [todays_answer_classes(vqa, images, q, c) for q, c in asks]
        old_s.append(time.process_time() - start)
        old = [answers for answers, _ in got]
        parts = {k: sum(p[k] for _, p in got) / len(asks) for k in got[0][1]}
        seen: list[int] = []
        hook = count_calls(vqa.model.vision_model, seen)
        start = time.process_time()
        new = vqa.answer_questions(images, asks)
        new_s.append(time.process_time() - start)
        hook.remove()
        passes.append(sum(seen) / len(images))
    diff = max(abs(a.probs[c] - b.probs[c]) for olds, news in zip(old, new) for a, b in zip(olds, news) for c in a.probs)
    same = all(a.answer == b.answer for olds, news in zip(old, new) for a, b in zip(olds, news))
    lengths = [len(vqa.processor(text=[q]).input_ids[0]) for q, _ in asks]
    share = cross_kv_flop_share(vqa.model.config, float(np.mean(lengths)))
    q = len(asks)
    per_question = parts["vision_pass_s"] + parts["question_encoder_s"] + parts["ranking_s"]
    limit = q * per_question / (parts["vision_pass_s"] + share * parts["question_encoder_s"]
                                + q * ((1 - share) * parts["question_encoder_s"] + parts["ranking_s"]))
    return dict(blip_config="tiny" if args.tiny else "BlipConfig() (blip-vqa-base sizes), random weights",
                images=len(images), questions=q, choices=sum(len(c) for _, c in asks),
                image_px=images[0].size[0], vision_passes_per_image=max(passes), max_prob_difference=diff,
                answers_identical=same, **parts, cross_kv_flop_share=share, todays_s=float(np.median(old_s)),
                new_s=float(np.median(new_s)), evaluation_speedup_limit=limit,
                _speedup=float(np.median(old_s)) / float(np.median(new_s)))


def qwen2_vl_2b_width(work: Path, layers: int, tiny: bool):
    """A VLMVQA over a Qwen2-VL at Qwen2-VL-2B's width (text 1,536 wide, 12 heads, 2 KV heads, 8,960 FFN,
    151,936 tokens; vision 1,280 wide, 16 heads, 14 px patches merged 2x2) with `layers` decoder and vision
    layers (28 and 32 in the released model), random weights, 448-px images (256 image tokens); the tiny
    test model's tokenizer and chat template (or the tiny model itself)."""
    import torch
    from tiny_models import build_tiny_qwen2_vl
    from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)

    from engine.backends import load_backend

    spec = build_tiny_qwen2_vl(work)
    if tiny:
        return load_backend(spec)
    tiny_vlm = load_backend(spec)
    config = tiny_vlm.model.config
    tok = word_tokenizer(tiny_vlm.processor.tokenizer)
    big = Qwen2VLConfig(
        vision_config={"depth": layers, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16, "mlp_ratio": 4,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        text_config={"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": layers,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
                     "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
                     "tie_word_embeddings": True},
        image_token_id=config.image_token_id, video_token_id=config.video_token_id,
        vision_start_token_id=config.vision_start_token_id, vision_end_token_id=config.vision_end_token_id)
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(big).eval()
    images = Qwen2VLImageProcessor(min_pixels=448 * 448, max_pixels=448 * 448, patch_size=14, merge_size=2,
                                   temporal_patch_size=2)
    processor = Qwen2VLProcessor(image_processor=images, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
                                 chat_template=tiny_vlm.processor.chat_template)
    from engine.backends.vqa import VLMVQA

    # a short reply's few tokens and its end (random weights never end one: the cap decides its length)
    return VLMVQA(model, processor, model_id="vlm:qwen2-vl-2b-width-random", device="cpu", max_new_tokens=4)


def word_tokenizer(tiny):
    """A byte-level BPE tokenizer trained on the bench's own prompts, choices and replies (so that a word is
    about one token, as in Qwen2's 151,643-token vocabulary; the tiny test tokenizer spells most words byte
    by byte), with the tiny Qwen2-VL tokenizer's special tokens at the same ids."""
    from tiny_models import _chat_tokenizer

    from engine.backends.vqa import VLM_CHOICES_SUFFIX, reply_variants

    texts = []
    for question, choices in occupation_asks():
        texts.append(question + VLM_CHOICES_SUFFIX.format(choices=", ".join(choices)))
        texts += [text for _, text in reply_variants(choices)]
    markers = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tok = _chat_tokenizer(None, markers, corpus=texts * 20 + ["user", "assistant", "system"] * 20)
    assert all(tok.convert_tokens_to_ids(m) == tiny.convert_tokens_to_ids(m) for m in markers)
    return tok


def vlm_section(args, work: Path) -> dict:
    vqa = qwen2_vl_2b_width(work, args.vlm_layers, args.tiny)
    vqa.batch_size = args.images
    asks = occupation_asks()
    images = [im.resize((448, 448)) for im in images_384(args.images)]
    start = time.process_time()
    alone = [vqa.answer_classes(images, q, c) for q, c in asks]
    alone_s = time.process_time() - start
    start = time.process_time()
    together = vqa.answer_questions(images, asks)
    together_s = time.process_time() - start
    diff = max(abs(a.probs[c] - b.probs[c]) for x, y in zip(alone, together) for a, b in zip(x, y) for c in a.probs)
    same = all(a.answer == b.answer and a.text == b.text for x, y in zip(alone, together) for a, b in zip(x, y))
    return dict(vlm_config="tiny Qwen2-VL" if args.tiny else f"Qwen2-VL at Qwen2-VL-2B's width, {args.vlm_layers} decoder "
                f"and {args.vlm_layers} vision layers (28 and 32 released), random weights",
                vlm_image_px=images[0].size[0], vlm_questions_alone_s=alone_s, vlm_questions_together_s=together_s,
                vlm_max_prob_difference=diff, vlm_answers_identical=same, vlm_prefix_reuse_ratio=alone_s / together_s)


def occupation_records(engine, occupations: int, n: int) -> list:
    """The occupation study's subset on `engine`: the first `occupations` occupations, each one's 27 sets (its
    prompt and the 26 counterfactuals of assets/occupation_axes.json) of `n` images (seeds 0..n-1)."""
    table = json.loads((ROOT / "assets" / "occupation_axes.json").read_text())
    records = []
    for occupation in table["occupations"][:occupations]:
        prompts = [table["prompt"]] + [cf for cfs in table["axes"].values() for cf in cfs]
        for prompt in prompts:
            records += engine.image_set(prompt.replace("{occupation}", occupation), range(n))
    return records


def distilled_run(work: Path, name: str, vqa, occupations: int, n: int):
    """(engine, records, labels per ask, the asks) of one evaluator over the occupation subset, every image's 8
    questions asked at once (as distributed evaluation asks them)."""
    from engine.core.engine import Engine

    engine = Engine("synthetic", data_dir=str(work / name), vqa=vqa, max_images=10**6)
    records = occupation_records(engine, occupations, n)
    asks = occupation_asks()
    return engine, records, engine.ask_each(records, asks), asks


def coverage(labels: list[str], truth: list[str], classes: list[str], checks: int, seeds: int) -> float:
    """The share of `seeds` spot-checks of `checks` images (drawn stratified by the evaluator's label, as the
    app draws them) whose corrected distribution (metrics.agreement.corrected_distribution: the evaluator's
    confusion estimated from the check) covers the true shares of every class with its 95% interval."""
    from engine.metrics.agreement import corrected_distribution

    labels, truth = np.asarray(labels, object), np.asarray(truth, object)
    inside = (np.isin(labels, classes)) & (np.isin(truth, classes))
    labels, truth = labels[inside], truth[inside]
    true_shares = {c: float(np.mean(truth == c)) for c in classes}
    raw = [int(np.sum(labels == c)) for c in classes]
    hits = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        picked = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:max(2, checks // len(classes))]
                                 for c in classes])
        got = corrected_distribution(raw, list(truth[picked]), list(labels[picked]), classes, n_draws=400, seed=seed)
        hits += all(got["corrected_ci"][c][0] <= true_shares[c] <= got["corrected_ci"][c][1] for c in classes)
    return hits / seeds


def distilled_section(args, work: Path) -> dict:
    """The distilled evaluator on the synthetic world's occupation subset: teacher share and held-out agreement
    with a noiseless teacher; with a 20% noisy teacher, how often the spot-check-corrected distributions
    cover the truth, distilled against the teacher's own."""
    from engine.backends.base import ModelSpec

    occupations, n = (1, 8) if args.tiny else (args.occupations, args.n)
    teacher = "synthetic_vqa:default"
    engine, records, _, asks = distilled_run(work, "distilled", ModelSpec("distilled", "probe", {
        "teacher": teacher, **({"min_sample": 40} if args.tiny else {})}), occupations, n)
    sources = [engine.answer_sources(records, q, c) for q, c in asks]
    teacher_share = sum(s["teacher"] for s in sources) / (len(records) * len(asks))   # every axis, disability too
    held = [s["held_out"]["accuracy"] for s in sources if s.get("held_out") and s["held_out"]["accuracy"] is not None]
    # quality: a 20% noisy teacher, distilled and alone, against the renderer's truth (the noiseless VQA)
    _, _, truths, _ = distilled_run(work, "truth", ModelSpec("synthetic_vqa", "default"), occupations, n)
    noisy = {"teacher": teacher, "teacher_options": {"error_rate": 0.2}, **({"min_sample": 40} if args.tiny else {})}
    _, _, distilled_labels, _ = distilled_run(work, "noisy-distilled", ModelSpec("distilled", "probe", noisy),
                                              occupations, n)
    _, _, teacher_labels, _ = distilled_run(work, "noisy-teacher", ModelSpec("synthetic_vqa", "default",
                                                                              {"error_rate": 0.2}), occupations, n)
    covered = {"distilled": [], "teacher": []}
    for (_, choices), truth, d, t in zip(asks, truths, distilled_labels, teacher_labels):
        classes = [c for c in choices if c in set(truth)]
        if len(classes) < 2:
            continue   # an axis the synthetic world does not draw (disability): nothing to cover
        covered["distilled"].append(coverage(d, truth, classes, 60, args.spot_checks))
        covered["teacher"].append(coverage(t, truth, classes, 60, args.spot_checks))
    return dict(distilled_images=len(records), distilled_questions=len(asks),
                noisy_teacher_error_rate=0.2, spot_check_images=60, spot_checks=args.spot_checks,
                teacher_corrected_coverage=float(np.mean(covered["teacher"])),
                distilled_corrected_coverage=float(np.mean(covered["distilled"])),
                distilled_teacher_share=teacher_share, distilled_agreement=min(held) if held else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2, help="images per batch (BLIP and the VLM)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--vlm-layers", type=int, default=4, help="the VLM's decoder and vision layers")
    ap.add_argument("--tiny", action="store_true", help="the tiny test models (a smoke run)")
    ap.add_argument("--parts", default="blip,vlm,distilled", help="which parts to run (comma-separated)")
    ap.add_argument("--occupations", type=int, default=6, help="the distilled part's occupations (of 26)")
    ap.add_argument("--n", type=int, default=16, help="the distilled part's images per set")
    ap.add_argument("--spot-checks", type=int, default=20, help="spot-checks per axis for the coverage")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    work = Path(tempfile.mkdtemp(prefix="gaplens-evalcost-"))
    values: dict = dict(thread_settings())
    speedup = None
    if "blip" in parts:
        values.update(blip_section(args, work))
        speedup = values.pop("_speedup")
    if "vlm" in parts:
        values.update(vlm_section(args, work))
    if "distilled" in parts:
        values.update(distilled_section(args, work))
    report(**values, **({"evaluation_speedup": speedup} if speedup is not None else {}))


if __name__ == "__main__":
    main()
