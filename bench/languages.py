"""Languages (issue 45): the synthetic world's planted grammatical gender against what the languages
method measures at N = 96, and the time of MAGBIG's direct set over its 10 languages x the 20 MAGBIG
occupations the world knows x 48 images, on the synthetic world with a fresh store (every image made)
and again on the same store (every image a cache hit).

    python bench/languages.py [--n 96] [--set-n 48]

The timed run is the command

    python -m engine languages --preset synthetic --prompt-set magbig-direct \
        --languages en de it fr es zh ja ko ru ar --occupations <OCCUPATIONS below> -n 48 --json

run in-process (no interpreter start-up). Lines are name=value; the headline (the set's seconds) last.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from _common import report

OCCUPATIONS = ["doctor", "nurse", "engineer", "teacher", "librarian", "firefighter", "ceo", "computer programmer",
               "programmer", "software developer", "farmer", "scientist", "lawyer", "pharmacist", "mechanic",
               "musician", "police officer", "social worker", "cook", "head cook"]
MAGBIG_LANGUAGES = ["en", "de", "it", "fr", "es", "zh", "ja", "ko", "ru", "ar"]
# the prompts, then the synthetic LLM's translations of the English one
PLANTED = {"de": "ein Foto von einem Arzt", "de-f": "ein Foto von einer Ärztin", "de-star": "ein Foto von eine*r Ärzt*in"}


def planted_vs_measured(n: int) -> list[str]:
    """One line per language: planted male share and difference from English, and what was measured."""
    from engine.core.engine import Engine
    from engine.methods import METHODS
    from runhelpers import done_event

    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="gaplens-bench-"))
    world = engine.models.get(engine.preset.generator).world
    row = METHODS["languages"]
    codes = ["en", "de", "de-f", "de-star", "fr", "it", "es", "ru", "ar", "zh", "ja", "ko"]
    results = done_event(row.run(row.request(prompt="a photo of a doctor", languages=codes, translations=PLANTED,
                                             n=n), engine)).results
    english = world.expected_distribution("a photo of a doctor", "gender")["male"]
    lines = []
    for code in codes:
        prompt = results["languages"][code]["prompt"]
        planted = world.expected_distribution(prompt, "gender")["male"]
        s = results["languages"][code]["shares"]["gender"]["male"]
        text = f"'{prompt}' planted {planted:.3f} measured {s['share']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]"
        if code != "en":
            d = results["differences"][code]["gender"]["male"]
            text += (f"; minus English planted {planted - english:+.3f} measured {d['delta']:+.3f} "
                     f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]")
        lines.append(f"male_share_{code}={text}")
    return lines


def magbig_direct_set(n: int) -> dict:
    from engine.core.engine import Engine
    from engine.methods import METHODS
    from runhelpers import done_event

    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="gaplens-bench-"), max_images=max(64, n))
    row = METHODS["languages"]
    request = row.request(prompt_set="magbig-direct", languages=MAGBIG_LANGUAGES, occupations=OCCUPATIONS, n=n)
    times = []
    for _ in range(2):   # a fresh store, then the same store (every image and answer a cache hit)
        start = time.perf_counter()
        results = done_event(row.run(request, engine)).results
        times.append(time.perf_counter() - start)
    images = n * len(MAGBIG_LANGUAGES) * len(OCCUPATIONS)
    return {"set_languages": len(MAGBIG_LANGUAGES), "set_occupations": len(OCCUPATIONS), "set_images": images,
            "set_p_interaction": results["tests"]["gender"]["interaction"]["p"],
            "set_cached_seconds": times[1], "set_images_per_second": images / times[0], "set_seconds": times[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--set-n", type=int, default=48)
    args = parser.parse_args()
    for line in planted_vs_measured(args.n):
        print(line)
    report(occupations=",".join(OCCUPATIONS), **magbig_direct_set(args.set_n))


if __name__ == "__main__":
    main()
