"""The page of a languages run: every language's prompt beside its source and back-translation,
each axis' shares per language with intervals side by side, the paired differences from the first
language, the tests of no language effect, MAGBIG's metrics and, for a prompt set, a language ×
occupation heatmap. Works from the stored results alone (also a partial run's)."""
from __future__ import annotations

from ..common.scores import number
from . import Markup, fmt, render
from .charts import grouped_bars, heatmap

UNDERSTOOD = {True: "", False: "not understood: an English-only model", None: ""}


def _translations(results: dict) -> list[dict]:
    """One row per language (and occupation): its prompt, source and back-translation."""
    rows = []
    names = results.get("names") or {}
    for code, entry in (results.get("translations") or {}).items():
        items = [(None, entry)] if "prompt" in entry else list(entry.items())
        for occupation, e in items:
            rows.append({"code": code, "name": names.get(code, code), "occupation": occupation or "",
                         "prompt": e.get("prompt", ""), "source": e.get("source", ""),
                         "back": e.get("back_translation", ""), "label": UNDERSTOOD.get(e.get("understood"), "")})
    return rows


def _bars(results: dict, axis: str, classes: list[str]) -> Markup:
    codes = [c for c in results["codes"] if (results.get("languages") or {}).get(c, {}).get("shares", {}).get(axis)]
    if not codes or not classes:
        return Markup("")
    names = results.get("names") or {}
    groups, ci = {}, {}
    for code in codes:
        shares = results["languages"][code]["shares"][axis]
        label = f"{code}: {names.get(code, code)}"
        groups[label] = [shares.get(c, {}).get("share") for c in classes]
        ci[label] = [tuple(shares.get(c, {}).get("ci") or (None, None)) for c in classes]
    return grouped_bars(classes, groups, ci=ci, vmax=1.0, title=f"{axis}: share per language (95% intervals)",
                        chart_id=f"languages-bars-{axis}", x_title="share of the images answered")


def _heatmap(results: dict, axis: str, classes: list[str]) -> Markup:
    """Language × occupation: the first class's share (e.g. men's), for a prompt set."""
    occupations = results.get("occupations") or []
    if not occupations or not classes:
        return Markup("")
    cls, rows, hover = classes[0], [], []
    for code in results["codes"]:
        prompts = (results.get("languages") or {}).get(code, {}).get("prompts") or {}
        row, tips = [], []
        for occupation in occupations:
            s = (prompts.get(occupation) or {}).get("shares", {}).get(axis, {}).get(cls) or {}
            row.append(s.get("share"))
            lo, hi = s.get("ci") or (None, None)
            tips.append(f"{code}, {occupation}: {cls} {fmt(s.get('share'), 2)} [{fmt(lo, 2)}, {fmt(hi, 2)}]; "
                        f"'{(prompts.get(occupation) or {}).get('prompt', '')}'")
        rows.append(row)
        hover.append(tips)
    return heatmap(rows, results["codes"], occupations, title=f"{axis}: share '{cls}' by language and occupation",
                   diverging=False, domain=(0.0, 1.0), hover=hover, row_title="language", col_title="occupation",
                   table_id=f"languages-heatmap-{axis}", legend=f"share {cls}")


def _differences(results: dict, axis: str) -> list[dict]:
    rows = []
    pairs = results.get("pairs") or {}
    for code, axes in (results.get("differences") or {}).items():
        for cls, d in (axes.get(axis) or {}).items():
            lo, hi = d.get("ci") or (None, None)
            excludes = number(lo) is not None and number(hi) is not None and (lo > 0 or hi < 0)
            rows.append({"code": code, "class": cls, "delta": d.get("delta"), "low": lo, "high": hi,
                         "n": (pairs.get(code) or {}).get(axis), "excludes": excludes})
    return rows


def _test(test: dict | None) -> dict | None:
    if not test:
        return None
    p = test.get("p")
    return {"method": test.get("method", ""), "statistic": test.get("statistic"), "df": test.get("df"),
            "p": "n/a" if number(p) is None else "< 0.0001" if p < 1e-4 else f"= {p:.4f}", "claim": _claim(p)}


def _claim(p) -> str:
    if number(p) is None:
        return "not tested"
    return "the languages differ (p < 0.05)" if p < 0.05 else "no difference shown at the 5% level"


def page(results: dict) -> Markup:
    """The HTML of a (finished or partial) languages run's results."""
    axes = []
    for axis, values in (results.get("axes") or {}).items():
        shares = [((results.get("languages") or {}).get(c, {}).get("shares") or {}).get(axis) or {}
                  for c in results.get("codes", [])]
        classes = list(values) or sorted({cls for s in shares for cls in s})
        tests = (results.get("tests") or {}).get(axis) or {}
        axes.append({"name": axis, "classes": classes, "bars": _bars(results, axis, classes),
                     "heatmap": _heatmap(results, axis, classes), "differences": _differences(results, axis),
                     "language": _test(tests.get("language")), "stratified": _test(tests.get("stratified")),
                     "interaction": _test(tests.get("interaction")),
                     "magbig": [{"code": code, **scores} for code, scores in
                                ((results.get("magbig") or {}).get(axis) or {}).items() if scores]})
    languages = results.get("languages") or {}
    runs = [{"code": code, "occupation": occupation or "", "run_id": entry.get("run_id", "")}
            for code, value in languages.items()
            for occupation, entry in ([(None, value)] if value.get("run_id") else (value.get("prompts") or {}).items())]
    codes = results.get("codes") or []
    return render("languages.html", prompt=results.get("prompt") or "", prompt_set=results.get("prompt_set") or "",
                  occupations=results.get("occupations") or [], codes=codes, names=results.get("names") or {},
                  first=codes[0] if codes else "", n=results.get("n"), seed=results.get("seed"),
                  model=results.get("model") or {}, translations=_translations(results), axes=axes, runs=runs,
                  notes=results.get("notes") or [])
