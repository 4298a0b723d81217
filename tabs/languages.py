"""Languages tab: the same prompt (or MAGBIG's occupation prompts) in several languages on the same
seeds. Propose translations (LLM or MAGBIG's files), read each back-translation, edit any prompt,
then run: each language's shares side by side, differences from the first language, MAGBIG's
metrics. Thin: engine/methods/languages.py runs it, engine/report/languages.py draws it."""
from __future__ import annotations

import functools

import gradio as gr

from engine.common.events import Done, Progress
from engine.hosting.space import GpuWork
from engine.methods import languages
from engine.methods.axes import known_axes
from engine.report.languages import page

from .common import View, checked, default, gpu, request_check, request_work, streamed, user_errors
from .optional import generation_fields, number_or_none

EXAMPLES = ["a photo of a doctor", "a photo of a nurse", "A photo of the face of a firefighter."]
COLUMNS = ["code", "prompt", "source", "back-translation"]
SINGLE, SET = "one prompt", "a MAGBIG prompt set"
TWO_LANGUAGES = "**Pick two or more languages** (the first is the reference)."
OUTPUTS = ("progress", "view")   # a run's outputs, in order (the table stays what the user proposed and edited:
#                                  what the screen shows is what the next run sends)


def code_choices() -> list[tuple[str, str]]:
    """(label, code) of MAGBIG's ten languages, their variants with prompt files, then the other codes."""
    codes = list(languages.MAGBIG_LANGUAGES) + ["de-f", "de-star", "fr-f", "it-f", "es-f"]
    codes += [c for c in languages.LANGUAGE_NAMES if c not in codes]
    return [(f"{c}: {languages.language_name(c)}", c) for c in codes]


def build(engine) -> list:
    Request = languages.LanguagesRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=340):
            mode = gr.Radio([SINGLE, SET], value=SINGLE, label="Audit", elem_id="lang-mode")
            with gr.Column(elem_id="lang-single") as single:
                prompt = gr.Textbox(label="Prompt, in the first language", placeholder="a photo of a doctor",
                                    elem_id="lang-prompt")
                gr.Examples(EXAMPLES, [prompt])
            prompt_set = gr.Radio([(name, name) for name in languages.PROMPT_SETS], value="magbig-direct",
                                  label="Prompt set (MAGBIG, assets/magbig)", visible=False, elem_id="lang-set")
            occupations = gr.Dropdown(languages.magbig_occupations(), value=list(languages.THESIS_OCCUPATIONS.values()),
                                      multiselect=True, label="Occupations (MAGBIG's names; default: the thesis's 19)",
                                      visible=False, elem_id="lang-occupations")
            codes = gr.Dropdown(code_choices(), value=["en", "de", "de-f"], multiselect=True,
                                label="Languages (the first is the reference)", elem_id="lang-codes",
                                info="a variant after a hyphen: -f feminine forms, -star the German gender star")
            with gr.Row():
                n = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images per language (N)", elem_id="lang-n")
                seed = gr.Number(default(Request, "seed"), label="First seed", precision=0, elem_id="lang-seed")
            axes = gr.CheckboxGroup(list(known_axes()), value=default(Request, "axes"), label="Axes to measure "
                                    "(questions stay in English)", elem_id="lang-axes")
            with gr.Accordion("Generation settings (empty: the model's defaults)", open=False):
                generation = generation_fields("lang", ("steps", "guidance", "width", "height"))
            propose = gr.Button("Propose translations", elem_id="lang-propose")
            table = gr.Dataframe(headers=COLUMNS, datatype=["str"] * 4, interactive=True, wrap=True,
                                 label="Translations (edit a prompt before running; empty: the LLM's)",
                                 elem_id="lang-table", column_count=(4, "fixed"))
            proposed = gr.State({})
            go = gr.Button("Run every language", variant="primary", elem_id="lang-run")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="lang-progress")
            view = gr.HTML(elem_id="lang-view")

    mode.change(lambda m: (gr.update(visible=m == SINGLE), gr.update(visible=m == SET), gr.update(visible=m == SET),
                           gr.update(visible=m == SINGLE), gr.update(visible=m == SINGLE)),
                [mode], [single, prompt_set, occupations, propose, table], api_name=False)
    with_engine = functools.partial
    form = dict(mode=mode, prompt=prompt, prompt_set=prompt_set, occupations=occupations, codes=codes, n=n,
                seed=seed, axes=axes, rows=table, proposed=proposed, **generation.fields)
    suggest_on_gpu = gpu(engine, duration=lambda prompt, codes: GpuWork(llm_calls=languages.proposal_calls(
        [c for c in codes or [] if c])), specs=lambda prompt, codes: [engine.preset.llm])(
        with_engine(propose_rows, engine))

    @user_errors
    @functools.wraps(suggest_on_gpu)
    def suggest(prompt, codes):   # fewer than two languages, or a refused proposal: said without asking for a GPU
        if len([c for c in codes or [] if c]) < 2:
            return gr.skip(), gr.skip(), TWO_LANGUAGES
        languages.check_proposal(engine, prompt, codes)
        return suggest_on_gpu(prompt, codes)

    propose.click(suggest, [prompt, codes], [table, proposed, progress], api_name="languages_propose")
    run = gpu(engine, duration=with_engine(run_work, engine), check=request_check(engine, "languages", languages_request))(
        with_engine(run_languages, engine))
    checked(go.click, engine, "languages", languages_request, inputs_kwargs=form).success(
        run, inputs_kwargs=form, outputs=[progress, view], api_name="languages")
    return [generation.hook(engine)]


# -- handlers: (engine, the inputs' values) -> the outputs' values ----------------------------------------------

def propose_rows(engine, prompt, codes):
    """The translations table filled before anything runs: each language's prompt (MAGBIG's file or the LLM's)
    and its back-translation; the proposal kept to tell an edited prompt from the LLM's."""
    codes = [c for c in codes or [] if c]
    if len(codes) < 2:
        return gr.skip(), gr.skip(), TWO_LANGUAGES
    entries = languages.propose_translations(engine, prompt, codes, seed=0)
    rows = table_rows(entries)
    return rows, {row[0]: row[1] for row in rows}, (f"**{len(rows)} translations proposed**: read each back-"
                                                    "translation, edit any prompt, then run.")


def table_rows(entries: dict) -> list[list[str]]:
    """[code, prompt, source, back-translation] per language after the first."""
    first = next(iter(entries), None)
    return [[code, e.get("prompt", ""), e.get("source", ""), e.get("back_translation", "")]
            for code, e in entries.items() if code != first and "prompt" in e]


def translations_of(rows, proposed: dict | None) -> tuple[dict, dict]:
    """({code: prompt}, {code: source}) of the table's filled rows; a prompt that differs from the
    proposal is "edited"."""
    texts, sources = {}, {}
    values = rows.values.tolist() if hasattr(rows, "values") else rows or []
    for row in values:
        if len(row) < 2 or not str(row[0] or "").strip() or not str(row[1] or "").strip():
            continue
        code, text = str(row[0]).strip().lower(), " ".join(str(row[1]).split())
        texts[code] = text
        source = str(row[2] if len(row) > 2 and row[2] else "given")
        before = (proposed or {}).get(code)
        sources[code] = source if before is not None and " ".join(str(before).split()) == text else (
            f"{source}, edited" if before is not None else "given")
    return texts, sources


def languages_request(mode, prompt, prompt_set, occupations, codes, n, seed, axes, rows=None, proposed=None,
                      **generation) -> languages.LanguagesRequest:
    """The request the form's values make (the table's prompts for the languages it fills)."""
    settings = {name: number_or_none(generation.get(name), float if name == "guidance" else int)
                for name in ("steps", "guidance", "width", "height")}
    common = dict(languages=list(codes or []), n=int(n), seed=int(seed or 0), axes=list(axes or []), **settings)
    if mode == SET:
        return languages.LanguagesRequest(prompt_set=prompt_set or "magbig-direct",
                                          occupations=list(occupations or []), **common)
    texts, sources = translations_of(rows, proposed)
    first = (codes or [""])[0]
    texts = {c: t for c, t in texts.items() if c != first and c in (codes or [])}
    return languages.LanguagesRequest(prompt=prompt or "", translations=texts,
                                      sources={c: s for c, s in sources.items() if c in texts}, **common)


def run_work(engine, **form) -> GpuWork:
    """The GPU work of a run: every language's (and occupation's) images, each asked every axis' question,
    and the LLM's translations and back-translations (the method's estimate: request_work)."""
    request = languages_request(**form)
    return request_work(engine, "languages", request, questions=len(request.axes))


def run_languages(engine, mode, prompt, prompt_set, occupations, codes, n, seed, axes, rows=None, proposed=None,
                  **generation):
    request = languages_request(mode, prompt, prompt_set, occupations, codes, n, seed, axes, rows, proposed,
                                **generation)
    yield from streamed(languages.run(request, engine), render, OUTPUTS)


def render(event, view: View) -> dict:
    """{output: value} for one event of a run."""
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, languages.PromptsSettled):
        return {"progress": "**Every language's prompt is settled** (the page lists them with their back-"
                            "translations when the run is done)"}
    if isinstance(event, Done):
        runs = event.summary.get("runs", 0)
        return {"progress": f"**Done**: {len(event.results['codes'])} languages, {runs} Single Prompt runs, in "
                            f"{event.summary.get('seconds', 0):.1f} s (run `{event.run_id}`).",
                "view": str(page(event.results))}
    return {}

