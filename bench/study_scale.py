"""User-study analysis at scale (issue 27): a pair study of N image sets, two raters who never
agree, analysed (Krippendorff's alpha over N set ids as values, Spearman, attention); seconds and
peak traced memory per N. The coincidence-matrix version took 4.4 s at N = 2,000 and 70 s and
+1.5 GB at 8,000. Prints name=value lines, the time ratio of the largest to the smallest N last
(linear: about their ratio).

    python bench/study_scale.py [N ...]   (default 2000 8000 16000)
"""
from __future__ import annotations

import csv
import io
import json
import sys
import time
import tracemalloc

import _common  # noqa: F401 - offline env, repository on sys.path
from engine.tools import study


def pack(n: int) -> tuple[dict, str]:
    ids = [f"S{i}" for i in range(n)]
    info = {"run_id": "r", "label": "", "prompt": "p", "method": "generate", "generator": "g", "auto_score": None,
            "auto_score_name": "x"}
    key = {"format": study.KEY_FORMAT, "question_type": "pair", "axis": "gender", "question": "q",
           "options": study.QUESTION_OPTIONS["pair"], "sets": {s: dict(info) for s in ids},
           "forms": [{"form": 1, "items": [{"item": f"Q{i}", "kind": "trial", "sets": [ids[i], ids[(i + 1) % n]],
                                            "expected": None} for i in range(n)]}]}
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(study.ANSWER_COLUMNS)
    for i in range(n):
        writer.writerow(["L", 1, 1, f"Q{i}", "", "", "left", 1])
        writer.writerow(["R", 1, 1, f"Q{i}", "", "", "right", 1])
    return study.load_key(json.dumps(key)), out.getvalue()


def main(sizes: list[int]) -> None:
    seconds = {}
    for n in sizes:
        key, answers = pack(n)
        start = time.perf_counter()
        study.analyse(key, [answers])
        seconds[n] = time.perf_counter() - start
        tracemalloc.start()   # a second pass, traced (tracing slows Python down)
        study.analyse(key, [answers])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        _common.report(**{f"analyse_s_n{n}": seconds[n], f"peak_mib_n{n}": peak / 2**20})
    _common.report(time_ratio_largest_to_smallest=seconds[max(sizes)] / seconds[min(sizes)])


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [2000, 8000, 16000])
