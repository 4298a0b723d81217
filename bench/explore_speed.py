"""Explore's strips of a stored 1,000-image run, from cached embeddings (issue 33; target < 1 s).

    python bench/explore_speed.py [--repeats 5] [--n 1000]

A Generate run of N synthetic images is stored and its image embeddings cached once (set-up, not
timed); then:
- strips_place_ms: `place` alone (the stored embeddings and the concepts' scores, lean and strips);
- strips_page_ms: the page of the result (the Altair strips chart with N dots per concept);
- images_generated: images made by the timed runs (must be 0);
- strips_1000_s (headline, last): `python -m engine explore --run RUN_ID` as a method call, then its
  page: a new Explore run scoring the stored run end to end (request check, run record, images,
  strips, lean) and the strips chart the tab shows.
"""
from __future__ import annotations

import argparse
import tempfile

from _common import median_time, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()

    from engine.core.engine import Engine
    from engine.methods import explore, generate
    from engine.report import explore as page
    from runhelpers import done_event

    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="explore-bench-"), max_images=args.n)
    source = done_event(generate.run(generate.GenerateRequest("a photo of a doctor", n=args.n), engine)).run_id
    records, _ = explore.stored_images(engine, source)
    engine.embed_images(records)                       # the cache a stored run has after any measurement
    request = explore.ExploreRequest(run=source)
    before = engine.stats.images_generated

    done = None

    def strips():
        nonlocal done
        done = done_event(explore.run(request, engine))
        str(page.page(done.results))

    total = median_time(strips, args.repeats)
    place_ms = median_time(lambda: explore.place(engine, records, explore.DEFAULT_CONCEPTS), args.repeats) * 1000
    page_ms = median_time(lambda: str(page.page(done.results)), args.repeats) * 1000
    report(n=args.n, strips_place_ms=place_ms, strips_page_ms=page_ms,
           images_generated=engine.stats.images_generated - before, strips_1000_s=total)


if __name__ == "__main__":
    main()
