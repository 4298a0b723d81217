"""Which languages a generator understands, known without loading it: what the languages method
(engine/methods/languages.py) labels a result with, or refuses before any image is made.

A text-to-image model reads a prompt through its text encoder; a language that encoder was not
trained on reaches the model as fragments of English-looking tokens. The families GapLens loads:

| family (engine/backends/diffusers_generator.py) | text encoder(s) | trained on | languages |
|---|---|---|---|
| sd1, sd-turbo, sd2 | CLIP ViT-L/14 (OpenAI) or OpenCLIP ViT-H/14 | English image captions (WebImageText, LAION-2B-en) | English |
| sdxl, sdxl-turbo | CLIP ViT-L/14 + OpenCLIP ViT-bigG/14 | English captions (LAION-2B-en) | English |
| sd3 | CLIP L + bigG + T5-XXL v1.1 | English captions; T5 v1.1 on English C4 | English |
| flux, flux-dev | CLIP ViT-L/14 + T5-XXL v1.1 | English captions; English C4 | English |
| hunyuandit | bilingual CLIP (Chinese RoBERTa-large) + mT5-XL encoder | Chinese and English captions (mT5: the 101 languages of mC4) | Chinese, English |

Hunyuan-DiT's mT5 encoder saw other languages in pre-training, but the model was trained on Chinese
and English captions only: GapLens labels its other languages as not understood, as it does an
English-only model's. The preset `hunyuan-dit` loads it (`python -m engine plan --preset hunyuan-dit`).

Multilingual families diffusers supports but GapLens's diffusers backend does not load yet (they are
not in its family table, so their defaults and memory plans are not known): Kolors (ChatGLM3-6B text
encoder; Chinese and English), Kandinsky 2.1 (M-CLIP, XLM-RoBERTa-Large; about 100 languages),
AltDiffusion m18 (XLM-R; 18 languages; deprecated in diffusers). Their images can be audited from a
folder (README.md, "Audit across languages").

The synthetic world speaks exactly the languages of assets/synthetic_languages.json (and English):
any other is refused in one sentence, since its images would be the default figure and not a result
about that language. An API or a folder of images: not known (no label, nothing refused).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backends.base import ModelSpec

ENGLISH_ONLY = frozenset({"en"})
FAMILY_LANGUAGES: dict[str, frozenset[str]] = {
    "sd1": ENGLISH_ONLY, "sd2": ENGLISH_ONLY, "sd-turbo": ENGLISH_ONLY, "sdxl": ENGLISH_ONLY,
    "sdxl-turbo": ENGLISH_ONLY, "sd3": ENGLISH_ONLY, "flux": ENGLISH_ONLY, "flux-dev": ENGLISH_ONLY,
    "hunyuandit": frozenset({"zh", "en"})}
FAMILY_ENCODERS = {"sd1": "CLIP", "sd2": "OpenCLIP", "sd-turbo": "OpenCLIP", "sdxl": "CLIP and OpenCLIP",
                   "sdxl-turbo": "CLIP and OpenCLIP", "sd3": "CLIP and T5 v1.1", "flux": "CLIP and T5 v1.1",
                   "flux-dev": "CLIP and T5 v1.1", "hunyuandit": "a bilingual CLIP and mT5"}
TRAINED_ON = {"hunyuandit": "Chinese and English captions"}


@dataclass(frozen=True)
class Understanding:
    """What a generator is known to understand. `languages`: base language codes (None: not known);
    `strict`: a language outside them is refused (the synthetic world), else only labelled;
    `note`: one sentence naming where the knowledge comes from."""

    languages: frozenset[str] | None
    strict: bool = False
    note: str = ""

    def understands(self, base: str) -> bool | None:
        """True/False for a base language code; None when not known."""
        return None if self.languages is None else base in self.languages


def understanding(spec: ModelSpec) -> Understanding:
    """What the generator `spec` is known to understand, without loading its weights."""
    if spec.backend == "synthetic_generator":
        from ..backends.synthetic.world import load_world

        world = load_world(spec.options.get("table") or spec.model)
        codes = sorted(world.languages)
        return Understanding(frozenset(codes), True, f"the synthetic world speaks {', '.join(codes[:-1])} and "
                             f"{codes[-1]} (assets/synthetic_languages.json)")
    if spec.backend == "diffusers":
        from ..backends.diffusers_generator import family_of

        family = family_of(spec)
        known = FAMILY_LANGUAGES.get(family)
        if known is None:
            return Understanding(None)
        kind = "an English-only model" if known == ENGLISH_ONLY else "a Chinese and English model"
        return Understanding(known, False, f"{kind}: this generator (family {family}) reads prompts through "
                             f"{FAMILY_ENCODERS[family]}, trained on {TRAINED_ON.get(family, 'English text')}, so its "
                             "results for other languages show how it reads words it was not trained on")
    return Understanding(None)
