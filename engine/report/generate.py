"""The Generate page: a run's prompt, settings and image count (the images themselves are shown
by the caller: a gallery in the app, inline thumbnails in an exported report)."""
from __future__ import annotations

from . import Markup, macro


def page(results: dict) -> Markup:
    """A Generate run: its prompt, the seeds, safety-checker flags and the settings table."""
    images = results.get("images", [])
    seeds = [i.get("seed") for i in images]
    flagged = [i.get("seed") for i in images if i.get("nsfw")]
    consecutive = bool(seeds) and all(isinstance(s, int) for s in seeds) and seeds == list(
        range(seeds[0], seeds[0] + len(seeds)))
    return macro("generate.html", "page")(prompt=results.get("prompt", ""), n=len(images), seeds=seeds,
                                          consecutive=consecutive, flagged=flagged,
                                          settings=results.get("settings", {}))
