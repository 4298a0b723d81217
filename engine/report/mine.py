"""The Mine Prompts page: settings, best-score chart, ranked archive, lineage and the top
prompt's gap details (the tab, the Runs view, exported reports). Markup: templates/mine.html."""
from __future__ import annotations

from . import Markup, charts, explain, macro
from .single_prompt import gap_html


def reconstructed() -> Markup:
    """The note that the gap score and the GA defaults are our reconstruction (a badge and a sentence)."""
    return macro("mine.html", "reconstructed")()


# gap scores vary by tenths between prompts: a y axis narrower than this would magnify noise
MIN_SPAN = 0.05


def mine_chart(results: dict, baseline: dict | None = None) -> Markup:
    """Best gap score per iteration and best so far (and a random baseline's best so far), with
    integer iteration ticks, then what the gap score means."""
    series = {"best this iteration": results.get("best_per_iteration") or [],
              "best so far": results.get("best_so_far") or []}
    if baseline and baseline.get("best_so_far"):
        series["random baseline, best so far"] = baseline["best_so_far"]
    title = ("random prompts: best gap score" if results.get("strategy") == "random"
             else "genetic search: best gap score")
    return charts.line_chart(series, title=f"{title} (reconstructed; lower = more biased)",
                             x_label="iteration (from 0)", chart_id="mine-best", width=520, min_span=MIN_SPAN,
                             y_title="gap score") + explain.info(["gap_score"], "mine-meanings")


def lineage_html(chain: list[dict]) -> Markup:
    """parent -> child chain of a mined prompt, with each one's score and origin."""
    return macro("mine.html", "lineage")(chain)


def archive_table_html(archive: list[dict], limit: int = 50) -> Markup:
    """The ranked archive (first `limit` prompts), each with its iteration and lineage."""
    return macro("mine.html", "archive")(archive[:limit], len(archive) - limit)


def progress_text(results: dict, run_id: str, status: str) -> Markup:
    """One Markdown line: status, run, iterations done of T, the most biased prompt so far, and
    why the search ended early when it did."""
    archive = results.get("archive") or []
    return macro("mine.html", "progress")(status=status, run_id=run_id, done=len(results.get("iterations", [])),
                                          total=results.get("params", {}).get("T"),
                                          best=archive[0] if archive else None,
                                          claim=(results.get("headline") or {}).get("text"),  # issue 16
                                          end_reason=results.get("end_reason"))


def selected_html(info: dict) -> tuple[Markup, Markup]:
    """(head, gap panel) of one mined prompt (`mine.prompt_details`): its score, lineage and
    missing images, then its gap details or why it has none."""
    head = macro("mine.html", "selected")(node=info["node"], lineage=lineage_html(info["lineage"]),
                                          missing=info.get("missing_images") or 0)
    gap = gap_html(info["gap"]) if info.get("gap") else macro("mine.html", "note")(info.get("note") or "not scored")
    return head, gap


def page(results: dict) -> Markup:
    """A whole Mine Prompts run: settings, best-score chart, ranked archive, top prompt's details."""
    archive = results.get("archive") or []
    top = (results.get("details") or {}).get(archive[0]["id"]) if archive else None
    return macro("mine.html", "page")(
        strategy="random prompts (baseline)" if results.get("strategy") == "random" else "genetic algorithm",
        bias=results.get("bias", "open"), p=results.get("params", {}), iterations=len(results.get("iterations", [])),
        state="complete" if results.get("complete") else "stopped or running (resumable)",
        reconstructed=reconstructed(), chart=mine_chart(results), archive=archive_table_html(archive),
        top_prompt=archive[0]["prompt"] if top else "", top=gap_html(top) if top else "")
