"""Names that leave the engine.

- File names made from run ids, and labels without host paths: run ids and export stems reach the
  file system; model labels, data directories and reasons reach pages, status lines and exported
  files. Both come from input GapLens does not control (imported archives, visitors, model paths).
- Readable names of stored keys, one mapping for the tabs, the Runs table, compare and the CLI:
  methods store scores under short keys ("tau_initial", "mad_environment", "cbs_gender"); a person
  reads "τ before", "MAD (environment)", "Composite Bias Score (gender)" (`readable`).
"""
from __future__ import annotations

import re
import unicodedata

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# an absolute POSIX path inside a longer text (not a URL or ~/...): keep only its last component
_ABSOLUTE = re.compile(r"(?<![\w.~/])(?:~|/)(?:[^\s:,;'\"()<>/]+/)+([^\s:,;'\"()<>/]+)/?")


def safe_stem(text: str, fallback: str = "gaplens", limit: int = 80) -> str:
    """A file-name stem made from `text`: only letters, digits, '.', '_' and '-', no leading
    dot, at most `limit` characters (`fallback` when nothing is left). Never a path."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    stem = _UNSAFE.sub("-", text).strip("-.")[:limit].strip("-.")
    return stem or fallback


def short_label(text: str) -> str:
    """`text` with absolute host paths cut to their last component:
    'synthetic_generator:/a/b/synthetic_world.json' -> 'synthetic_generator:synthetic_world.json'."""
    return _ABSOLUTE.sub(lambda m: m.group(1), str(text))

NAMES = {
    # T2I-BiasBench (Single Prompt)
    "composite_bias_score": "Composite Bias Score",
    "parity_difference": "Parity Difference",
    "max_parity_difference": "max Parity Difference",
    "normalised_entropy": "normalised entropy",
    "kl_divergence": "KL divergence from the target",
    "bias_amplification": "Bias Amplification",
    "representation_parity": "shares",
    # diversity and the gap score
    "vendi": "Vendi score",
    "vendi_normalised": "Vendi score / N",
    "mean_pairwise_similarity": "mean pairwise similarity",
    "gap_score": "gap score",
    "IS": "IS",
    "IS (pruned)": "IS (pruned)",
    "score": "score",
    "coverage_term": "coverage term",
    "alignment_term": "alignment term",
    # TIBET (Counterfactuals)
    "mad": "MAD",
    "mad_clip": "MAD (CLIP)",
    "cas": "CAS",
    "cas_clip": "CAS (CLIP)",
    # BiasConnect (Intersectional)
    "kept_edges": "edges kept",
    "max_impact": "most influential axis",
    "max_influenced": "most influenced axis",
    "distortion": "distortion",
    # MineTheGap (Mine Prompts)
    "best_score": "most biased gap score",
    "best_prompt": "most biased prompt",
    "prompts_scored": "prompts scored",
    "iterations": "iterations",
    "strategy": "search",
    # InterMit (Mitigate)
    "tau_initial": "τ before",
    "tau_final": "τ after",
    "reached": "target reached",
    "steps": "mitigation steps",
    "targets": "targets",
    "mitigated": "mitigated axes",
    "stop": "stopped because",
    # counts
    "n": "images per set",
    "prompts": "prompts",
    "sets": "image sets",
    "axes": "axes",
    "flagged": "flagged images",
    "image_seconds": "seconds of generation",
    "seconds": "seconds",
}

# key prefix -> name with the rest of the key in brackets ("mad_environment" -> "MAD (environment)")
PREFIXES = {"cbs_": "Composite Bias Score", "mad_clip_": "MAD (CLIP)", "mad_": "MAD", "cas_": "CAS",
            "share: ": "share", "cas: ": "CAS"}


def readable(key: str) -> str:
    """Returns the readable name of a stored key: 'tau_initial' -> 'τ before', 'mad_environment'
    -> 'MAD (environment)', 'cbs_skin tone' -> 'Composite Bias Score (skin tone)'; an unknown key
    with its underscores as spaces."""
    key = str(key)
    if key in NAMES:
        return NAMES[key]
    for prefix, name in PREFIXES.items():
        if key.startswith(prefix) and len(key) > len(prefix):
            rest = key[len(prefix):]
            if rest.endswith("_ci"):
                return f"{name} ({rest[:-3].replace('_', ' ')}), 95% interval"
            if prefix.endswith(": "):
                return f"{name} {rest}"
            return f"{name} ({rest.replace('_', ' ')})"
    if key.endswith("_ci") and key[:-3] in NAMES:
        return f"{NAMES[key[:-3]]}, 95% interval"
    return key.replace("_", " ")
