"""Which answers the distilled evaluator's probe gave and which its teacher (issue 46), for every page whose
run records them (`answer_sources`: Single Prompt, Explore, Intersectional, Mitigate). Markup:
templates/distilled.html."""
from __future__ import annotations

from . import Markup, macro


def sources_html(sources: dict | None) -> Markup | str:
    """Per axis: answers by the probe (with its held-out agreement) and by the teacher, and the sentence
    saying when a probe is not used; "" when the run's evaluator was not distilled."""
    if not sources:
        return ""
    rows = [{"axis": axis, **{k: s.get(k) for k in ("probe", "teacher", "teacher_id", "held_out", "note")}}
            for axis, s in sources.items()]
    return macro("distilled.html", "sources")(rows)
