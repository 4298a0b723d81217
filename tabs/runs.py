"""Runs tab: every run in the store (any method, app or CLI): search, sort, open, compare,
delete, export, import, and user-study packs. Thin: engine/runs/history.py, engine/report/export.py and
engine/tools/study.py do the work; engine/report draws the runs as their tabs show them."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import gradio as gr

from engine.runs import history as runs
from engine.tools import study
from engine.methods.axes import known_axes
from engine.common.errors import GapLensError, InputError
from engine.runs.imports import import_zip
from engine.common.names import safe_stem
from engine.report import export
from engine.report import runs as runs_page
from engine.report import study as study_page

from . import spotcheck
from .common import LoadHook, export_dir, gallery_items, user_errors

HEADERS = ["run", "method", "prompt", "generator", "date", "headline score", "status"]
ALL = "all"

# A clicked row joins the selection when its event answers; until then the page remembers the click, and
# every event that reads the selection sends it with the clicks not yet answered (`with_clicks`), so a
# second click, or Compare, right after a first click is never answered with a selection lacking it.
SELECTION_JS = """
if (!window.glRunsSelection) {
  const clicked = [];   // ids of clicked rows whose events have not answered yet, oldest first
  document.addEventListener('pointerdown', (e) => {
    const cell = e.target.closest && e.target.closest('#runs-table [data-row][data-col]');
    if (!cell) return;
    const first = document.querySelector(`#runs-table [data-row="${cell.dataset.row}"][data-col="0"]`);
    const id = first && first.innerText.trim();
    if (id) clicked.push(id);
  }, true);
  window.glRunsSelection = (selected) => {
    const shown = Array.isArray(selected) ? selected : (selected ? [selected] : []);
    return [...shown, ...clicked.filter((id, i) => !shown.includes(id) && clicked.indexOf(id) === i)];
  };
  window.glRunsClickAnswered = () => { clicked.shift(); };
}
"""


def with_clicks(inputs: list, selected) -> str:
    """The `js` of an event with `inputs` that reads the selection `selected` (one of them): the
    selection sent is the one shown plus the rows clicked whose events have not answered yet."""
    i = inputs.index(selected)
    return (f"(...values) => {{ const v = values.slice(0, {len(inputs)}); "
            f"if (window.glRunsSelection) v[{i}] = window.glRunsSelection(v[{i}]); return v; }}")


def _ids(selected) -> list[str]:
    if not selected:
        return []
    if isinstance(selected, str):
        selected = [selected]
    return [s.strip() for s in selected if s and s.strip()]


def _choice_label(row: dict) -> str:
    return f"{row['id']} · {row['method']} · {row['prompt'][:40]}"


def build(engine) -> list:
    """Lay out the tab; returns its page-load hooks as (fn, outputs) pairs."""
    gr.Markdown("Every run in the store, from the app or the command line (`python -m engine ...`). "
                "Click a row to open it and add it to the selection; select two or more to compare them, "
                "export them or build a user study from their image sets.")
    with gr.Row():
        search = gr.Textbox(label="Search", placeholder="words in the prompt, method, model, status or run id",
                            elem_id="runs-search", scale=3)
        method = gr.Dropdown([ALL], value=ALL, label="Method", elem_id="runs-method", scale=1)
        status = gr.Dropdown([ALL, *runs.STATUSES], value=ALL, label="Status", elem_id="runs-status-filter", scale=1)
        sort = gr.Dropdown(list(runs.SORTS), value="newest", label="Sort by", elem_id="runs-sort", scale=1)
        page = gr.Number(1, precision=0, minimum=1, label=f"Page ({runs.PAGE_SIZE} runs each)",
                         elem_id="runs-page", scale=0, min_width=110)
        refresh = gr.Button("Refresh", scale=0, elem_id="runs-refresh")
    # one line per row (wrapped headline cells made rows ~100 px tall): at least ten rows on a 900 px screen
    table = gr.Dataframe(headers=HEADERS, interactive=False, elem_id="runs-table", wrap=False, max_height=480,
                         label="Runs (click a row to open it)",
                         column_widths=["17%", "12%", "20%", "12%", "14%", "18%", "7%"])
    with gr.Row():
        selected = gr.Dropdown([], value=[], multiselect=True, allow_custom_value=True, label="Selected runs",
                               info="clicked rows are added here; you can also paste run ids",
                               elem_id="runs-selected", scale=4)
        clear = gr.Button("Clear selection", scale=0, size="sm")
    with gr.Row():
        open_btn = gr.Button("Open", variant="primary", elem_id="runs-open")
        compare_btn = gr.Button("Compare", elem_id="runs-compare-btn")
        json_btn = gr.Button("Export scores (JSON + CSV)", elem_id="runs-export-scores")
        zip_btn = gr.Button("Export zip (images + metadata.jsonl)", elem_id="runs-export-zip")
        html_btn = gr.Button("Export HTML report", elem_id="runs-export-html")
    with gr.Row():
        confirm = gr.Checkbox(False, label="Yes, delete the selected runs", elem_id="runs-confirm", scale=2)
        keep_images = gr.Checkbox(False, label="keep their images", scale=1)
        delete_btn = gr.Button("Delete", variant="stop", elem_id="runs-delete", scale=0, size="sm")
    with gr.Row():
        message = gr.Markdown("", elem_id="runs-message")
        files = gr.File(label="Downloads", file_count="multiple", interactive=False, elem_id="runs-files",
                        height=110)
    comparison = gr.HTML(elem_id="runs-comparison")   # first: a comparison is what Compare asked for
    view = gr.HTML(elem_id="runs-view")
    gallery = gr.Gallery(label="Images of the run", columns=8, height=280, elem_id="runs-gallery",
                         object_fit="contain", allow_preview=True)
    exported = gr.State([])   # every file this session exported, listed under Downloads
    gr.HTML("", js_on_load=SELECTION_JS, elem_id="runs-selection-js", container=False, padding=False)
    spotcheck.build(engine, lambda selected: (_ids(selected) or [None])[-1], selected, "runs-spot")

    with gr.Accordion("Import runs from an exported zip", open=False):
        upload = gr.File(label="GapLens export (.zip)", file_types=[".zip"], elem_id="runs-import-file")
        import_btn = gr.Button("Import", elem_id="runs-import")

    with gr.Accordion("User study: build a pack from the selected runs, then analyse the answers", open=False):
        gr.Markdown("Each image set of the selected runs becomes a condition behind an opaque id. Participants "
                    "get one offline HTML form; the answer key (run, prompt, model, automatic score of every "
                    "set) stays with you. Forms follow a Williams Latin square: with the default number of "
                    "raters every set is equally often at every position (and side, for pairs).")
        with gr.Row():
            question = gr.Radio([("1–5 bias rating of each set", "rating"),
                                 ("which of two sets is more diverse", "pair")], value="rating",
                                label="Question", elem_id="study-question")
            axis = gr.Dropdown(["overall", *known_axes()], value="gender", allow_custom_value=True,
                               label="About (axis)", elem_id="study-axis")
        with gr.Row():
            per_set = gr.Slider(1, 32, value=10, step=1, label="Images shown per set", elem_id="study-images")
            seed = gr.Number(0, precision=0, label="Seed", elem_id="study-seed")
            raters = gr.Number(0, precision=0, minimum=0, maximum=study.MAX_FORMS,
                               label="Raters / forms (0 = one full counterbalancing cycle)", elem_id="study-raters")
            checks = gr.Slider(0, 6, value=2, step=1, label="Attention checks per form", elem_id="study-checks")
        build_btn = gr.Button("Build study pack", elem_id="study-build")
        pack_info = gr.Markdown(elem_id="study-info")
        pack_file = gr.File(label="Study pack (.zip)", interactive=False, elem_id="study-pack")
        gr.Markdown("**Analyse answers**: the pack zip (or its `researcher/answer_key.json`) and the answer "
                    "CSVs the participants sent back.")
        with gr.Row():
            key_file = gr.File(label="Pack zip or answer key", file_types=[".zip", ".json"], elem_id="study-key")
            answer_files = gr.File(label="Answers (.csv)", file_count="multiple", file_types=[".csv"],
                                   elem_id="study-answers")
        exclude = gr.Checkbox(True, label="Exclude raters who failed an attention check", elem_id="study-exclude")
        analyse_btn = gr.Button("Analyse", elem_id="study-analyse")
        analysis = gr.HTML(elem_id="study-analysis-out")

    with_engine = functools.partial   # every handler takes the engine first
    list_runs = user_errors(with_engine(runs_list, engine))
    open_selected = user_errors(with_engine(open_run, engine))

    def click_row(selected, evt: gr.SelectData):   # Gradio passes the event data by this annotation
        return add_clicked(engine, selected, evt)

    list_inputs = [search, method, status, sort, selected, page]
    list_outputs = [table, selected, method, message]
    listing = dict(js=with_clicks(list_inputs, selected))
    refresh.click(list_runs, list_inputs, list_outputs, api_name="runs_list", **listing)
    for trigger in (search.submit, method.change, status.change, sort.change, page.submit):
        trigger(list_runs, list_inputs, list_outputs, api_name=False, **listing)
    # every click counts, also while an earlier one's event runs (Gradio's default drops it)
    table.select(click_row, [selected], [selected, view, gallery], api_name=False, trigger_mode="multiple",
                 js=with_clicks([selected], selected)).then(None, js="() => { window.glRunsClickAnswered(); }")
    clear.click(lambda: gr.Dropdown(value=[]), None, [selected], api_name=False)
    open_btn.click(open_selected, [selected], [view, gallery], api_name="runs_open", js=with_clicks([selected], selected))
    compare_btn.click(user_errors(with_engine(compare, engine)), [selected], [comparison], api_name="runs_compare",
                      js=with_clicks([selected], selected))
    relist = dict(fn=lambda *values: list_runs(*values)[:3], inputs=list_inputs, outputs=list_outputs[:3],
                  api_name=False, **listing)   # after delete/import: refresh the table, keep the action's message
    delete_btn.click(user_errors(with_engine(delete, engine)), [selected, confirm, keep_images],
                     [selected, confirm, message, view, gallery], api_name="runs_delete",
                     js=with_clicks([selected, confirm, keep_images], selected)).then(**relist)
    for button, fmt in ((json_btn, "scores"), (zip_btn, "zip"), (html_btn, "html")):
        button.click(user_errors(with_engine(export_runs, engine, fmt)), [selected, exported],
                     [files, message, exported], api_name=f"runs_export_{fmt}", js=with_clicks([selected, exported], selected))
    import_btn.click(user_errors(with_engine(import_runs, engine)), [upload], [selected, message],
                     api_name="runs_import").then(**relist)
    study_inputs = [selected, question, axis, per_set, seed, raters, checks]
    build_btn.click(user_errors(with_engine(build_study, engine)), study_inputs, [pack_file, pack_info],
                    api_name="study_build", js=with_clicks(study_inputs, selected))
    analyse_btn.click(user_errors(analyse), [key_file, answer_files, exclude], [analysis], api_name="study_analyse")
    # opening the tab re-lists with the filters and selection as they are: runs made since are there
    return [LoadHook(lambda: list_runs("", ALL, ALL, "newest", [])[:3], [table, selected, method],
                     on_tab_open=relist)]


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
def runs_list(engine, search, method, status, sort, selected, page=1):
    """(table rows, the selection kept, the method filter's choices, a count line) of one page of runs."""
    store = engine.store
    shown = runs.list_page(store, search or "", None if method in (None, "", ALL) else method,
                           None if status in (None, "", ALL) else status, sort or "newest", int(page or 1))
    rows = shown["rows"]
    data = [[r["id"], r["method"], r["prompt"], r["generator"], r["date"], r["headline"],
             r["status"] + (" · published" if engine.public and r["published"] else "")] for r in rows]
    keep = [s for s in _ids(selected) if store.get_run(s) is not None]
    where = f" (page {shown['page']} of {shown['pages']})" if shown["pages"] > 1 else ""
    return (data, gr.Dropdown(choices=[(_choice_label(r), r["id"]) for r in rows], value=keep),
            gr.Dropdown(choices=[ALL, *shown["methods"]]),
            f"{len(rows)} of {shown['total']} run(s) shown{where}; {store.count_runs()} in the store.")


def open_run(engine, selected):
    """(page, gallery) of the last selected run, as its tab shows it."""
    ids = _ids(selected)
    if not ids:
        raise InputError("pick a run first: click a row of the table")
    opened = runs_page.open_run(engine.store, ids[-1])
    records = [r for r, _ in opened["records"]]
    labels = [f"seed {r.seed}" + (f" · {label}" if label else "") for r, label in opened["records"]]
    return opened["html"] + spotcheck.checked_html(engine.store, ids[-1]), gallery_items(records, labels)


def add_clicked(engine, selected, evt: gr.SelectData):
    """(selection, page, gallery): the clicked row's run added to the selection and opened."""
    row = evt.row_value or []
    if not row:
        return gr.skip(), gr.skip(), gr.skip()
    ids = _ids(selected)
    if row[0] not in ids:
        ids.append(row[0])
    html, items = open_run(engine, [row[0]])
    return gr.Dropdown(value=ids), html, items


def compare(engine, selected):
    """The selected runs' scores side by side."""
    return runs_page.compare_html(runs.compare_runs(engine.store, _ids(selected)), engine.store)


def delete(engine, selected, confirmed, keep):
    """Deletes the selected runs (and the images no other run uses, unless `keep`)."""
    ids = _ids(selected)
    if not ids:
        raise InputError("pick the runs to delete first")
    if not confirmed:
        raise InputError("tick 'Yes, delete the selected runs' first")
    removed = runs.delete_runs(engine.store, ids, keep_images=bool(keep))
    text = (f"Deleted {removed['runs']} run(s) and {removed['images']} image(s) no other run used."
            + (f" Not found: {', '.join(removed['missing'])}." if removed["missing"] else ""))
    return gr.Dropdown(value=[]), False, text, "", []


def export_runs(engine, fmt: str, selected, earlier=None):
    """(files, message, files): the selected runs exported as `fmt` (scores: JSON + CSV; zip; html); the
    files are the session's `earlier` exports (newest first) after these, so no download replaces another."""
    store = engine.store
    ids = _ids(selected)
    if not ids:
        raise InputError("pick the runs to export first")
    stem = safe_stem(ids[0]) if len(ids) == 1 else f"gaplens-{len(ids)}-runs-{time.strftime('%Y%m%d-%H%M%S')}"
    engine.charge(what=f"export {fmt}", export_bytes=store.runs_usage(ids))   # public: bytes an hour
    out = export_dir()
    if fmt == "scores":
        paths = (export.export_files(store, ids, "json", out / f"{stem}.scores.json")
                 + export.export_files(store, ids, "csv", out / f"{stem}.scores.csv"))
    else:
        paths = export.export_files(store, ids, fmt, out / f"{stem}.{fmt}")
    every = [str(p) for p in paths] + [p for p in earlier or [] if Path(p).is_file()]   # old ones are cleaned up
    return every, f"Exported {len(ids)} run(s): " + ", ".join(Path(p).name for p in paths), every


def import_runs(engine, path):
    """(selection, message): the runs of an exported zip added to the store and selected."""
    if not path:
        raise InputError("upload an exported .zip first")
    report = import_zip(engine.store, path)
    text = (f"Imported {len(report['imported'])} run(s) ({report['images_added']} new image(s), "
            f"{report['answers']} VQA answers, {report['embeddings']} embeddings)"
            + (f"; already in the store: {', '.join(report['skipped'])}" if report["skipped"] else "") + ".")
    return gr.Dropdown(value=report["imported"]), text


def build_study(engine, selected, question, axis, per_set, seed, raters, checks):
    """(pack zip, summary) of a user study over the selected runs' image sets."""
    ids = _ids(selected)
    if not ids:
        raise InputError("select the runs whose image sets the study compares")
    pack = study.build_pack(engine, ids, question=question, axis=axis or "overall", images_per_set=per_set,
                            seed=int(seed or 0), n_raters=raters or None, n_attention=checks)
    path = study.write_pack(pack, export_dir() / f"study-{safe_stem(question)}-seed{int(seed or 0)}.zip",
                            study_page.form_page(pack))
    try:   # public: a pack is a download, charged its bytes like an export
        engine.charge(what="study pack", export_bytes=Path(path).stat().st_size)
    except GapLensError:
        Path(path).unlink(missing_ok=True)
        raise
    summary = study.pack_summary(pack)
    missing = summary["sets"] - summary["sets_with_automatic_score"]
    note = (f"\n\n{missing} set(s) have no automatic score for this question; Spearman will leave them out."
            if missing else "")
    return path, f"**Study pack built**: {summary['text']}{note}"


def analyse(key_path, answer_paths, exclude_inattentive):
    """The study's analysis from its answer key and the participants' answer CSVs."""
    if not key_path:
        raise InputError("upload the study pack zip (or its answer_key.json) first")
    if not answer_paths:
        raise InputError("upload the answers CSV file(s)")
    texts = study.read_answers(answer_paths if isinstance(answer_paths, list) else [answer_paths])
    return study_page.analysis_html(study.analyse(study.load_key(key_path), texts, bool(exclude_inattentive)))
