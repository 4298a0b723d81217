"""Mine Prompts tab: MineTheGap's genetic search, streamed live (population, best-score chart,
ranked archive, lineage), stoppable and resumable; any stored run (app or CLI) can be opened."""
from __future__ import annotations

import functools
import time

import gradio as gr

from engine.common.errors import InputError
from engine.common.events import Done, Progress
from engine.hosting.space import GpuWork
from engine.methods import mine
from engine.report import mine as report

from .common import (UPDATE_EVERY, View, checked, default, gallery_items, gpu, in_order, options, request_check,
                     streamed, user_errors)

STRATEGY_LABELS = {"ga": "genetic algorithm (MineTheGap)", "random": "random prompts, same budget (baseline)",
                   "source": "rank the prompts a folder/dataset source holds (no new images)"}
STOP_WAIT = 30       # seconds Stop waits for the cancelled run to save its state and close
NO_DETAILS = "Click a prompt in the archive or the population (or pick one above) to see its images and gap."

def _run_choices(engine) -> list[tuple[str, str]]:
    out = []
    for r in mine.list_runs(engine)[:100]:
        s = r.get("summary") or {}
        best = s.get("best_score")
        label = (f"{r['id']} · {r['status']} · {s.get('strategy', r['request'].get('strategy', 'ga'))} · "
                 f"{s.get('iterations', 0)} it" + (f" · best {best:.3f}" if isinstance(best, (int, float)) else ""))
        out.append((label, r["id"]))
    return out


def _pick_choices(results: dict) -> list[tuple[str, str]]:
    return [(f"{a['rank']}. {a['score']:.3f}  {a['prompt']}", a["id"]) for a in results.get("archive", [])]


LIVE = ("progress", "chart", "population", "archive", "pick", "state", "runs")   # a run's outputs, in order


def results_update(engine, run_id: str, results: dict, status: str, with_baseline: bool = False) -> dict:
    """{live output: value} showing a stored run's `results` (the random baseline of the same budget
    drawn beside a GA run `with_baseline`)."""
    pending = results.get("pending") or {}   # its population is empty when the LLM ran out of new prompts
    iteration = pending["iteration"] if pending.get("population") else len(results.get("iterations", [])) - 1
    baseline = _baseline_for(engine, results) if with_baseline else None
    return {"progress": report.progress_text(results, run_id, status), "chart": report.mine_chart(results, baseline),
            "population": mine.population_rows(results, max(0, iteration)) if results.get("nodes") else [],
            "archive": mine.archive_rows(results.get("archive", [])),
            "pick": gr.update(choices=_pick_choices(results)), "state": {"run_id": run_id, "results": results}}


def _baseline_for(engine, results: dict) -> dict | None:
    """The newest random-baseline run with the same budget (T, b, N), to draw next to a GA run."""
    if results.get("strategy") != "ga":
        return None
    p = results.get("params", {})
    for r in mine.list_runs(engine):
        q = r.get("request") or {}
        if q.get("strategy") == "random" and q.get("population") == p.get("b") and q.get("n") == p.get("n"):
            record = engine.store.get_run(r["id"])
            if record and record["results"].get("params", {}).get("T") == p.get("T"):
                return record["results"]
    return None


def build(engine) -> list:
    """Lay out the tab; returns its page-load hooks as (fn, outputs) pairs."""
    Request = mine.MineRequest   # noqa: N806 - the widgets start at its defaults
    gr.Markdown("Mine the prompts this model is most biased on: a genetic search over LLM-written prompts "
                "scored by the MineTheGap gap score (images vs. LLM variations of the prompt).  \n" + report.reconstructed(),
                elem_id="mine-intro")
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            bias = gr.Dropdown(list(mine.BIAS_MODES), value=default(Request, "bias"), allow_custom_value=True,
                               label="Bias to mine", elem_id="mine-bias",
                               info="open-set, or a specific bias (type any axis, e.g. 'hair colour')")
            strategy = gr.Radio(options(Request, "strategy", STRATEGY_LABELS), value=default(Request, "strategy"),
                                label="Search", elem_id="mine-strategy")
            with gr.Row():
                iterations = gr.Slider(1, 30, value=mine.DEFAULT_ITERATIONS, step=1, label="Iterations T",
                                       info="the paper: 30", elem_id="mine-T")
                population = gr.Slider(2, mine.MAX_POPULATION, value=default(Request, "population"), step=1,
                                       label="Population b", elem_id="mine-b")
            with gr.Row():
                select = gr.Slider(1, 16, value=default(Request, "select"), step=1, label="Selected s",
                                   elem_id="mine-s")
                mutations = gr.Slider(1, 8, value=default(Request, "mutations"), step=1, label="Mutations m",
                                      info="random r = b − s·m", elem_id="mine-m")
            with gr.Row():   # the text variations default to N, as in the request
                n = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images per prompt N", elem_id="mine-n")
                n_var = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                                  label="Text variations per prompt", elem_id="mine-nvar")
            with gr.Accordion("Score and search options (reconstructed defaults)", open=False):
                alpha = gr.Slider(5, 50, value=default(Request, "alpha"), step=5, label="Gap score α (percentile)")
                combine = gr.Radio(options(Request, "combine"), value=default(Request, "combine"),
                                   label="Gap score combination")
                keep_parents = gr.Checkbox(default(Request, "keep_parents"), label="Keep parents (elitism)",
                                           info="off: the selected prompts are archived and replaced by their "
                                                "mutations, as in the paper's animation")
                with gr.Row():
                    seed = gr.Number(default(Request, "seed"), label="GA seed", precision=0)
                    image_seed = gr.Number(default(Request, "image_seed"), label="First image seed", precision=0)
            budget = gr.Markdown("", elem_id="mine-budget")
            with gr.Row():
                estimate = gr.Button("Estimate budget", elem_id="mine-estimate")
                start = gr.Button("Start mining", variant="primary", elem_id="mine-start")
                stop = gr.Button("Stop", variant="stop", elem_id="mine-stop")
            with gr.Accordion("Stored runs (app or `python -m engine mine`)", open=True):
                runs = gr.Dropdown([], label="Run", elem_id="mine-runs", allow_custom_value=True)
                with gr.Row():
                    refresh = gr.Button("Refresh", size="sm", elem_id="mine-refresh")
                    open_btn = gr.Button("Open", size="sm", elem_id="mine-open")
                    resume = gr.Button("Resume (up to T iterations)", size="sm", elem_id="mine-resume")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="mine-progress")
            chart = gr.HTML(elem_id="mine-chart")
            # the short columns are as wide as their longest word at 1440 px, so nothing wraps mid-word
            population_table = gr.Dataframe(headers=mine.POPULATION_COLUMNS, label="Population (this iteration)",
                                            interactive=False, wrap=True, max_height=300, elem_id="mine-population",
                                            column_widths=["9%", "37%", "15%", "15%", "24%"])
            archive_table = gr.Dataframe(headers=mine.ARCHIVE_COLUMNS,
                                         label="Archive: the most biased prompts found (click one to open it)",
                                         interactive=False, wrap=True, max_height=360, elem_id="mine-archive",
                                         column_widths=["9%", "14%", "30%", "14%", "14%", "19%"])
    pick = gr.Dropdown([], label="Open an archived prompt", elem_id="mine-pick", allow_custom_value=True)
    lineage = gr.HTML(NO_DETAILS, elem_id="mine-lineage")
    gallery = gr.Gallery(label="Images of the prompt", columns=8, height=240, elem_id="mine-gallery",
                         object_fit="contain", allow_preview=True)
    details = gr.HTML(elem_id="mine-gap")
    state = gr.State({})

    settings_inputs = [bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                       keep_parents, seed, image_seed]
    live_outputs = [progress, chart, population_table, archive_table, pick, state, runs]

    with_engine = functools.partial   # every handler takes the engine first
    checked_new = request_check(engine, "mine", make_request)
    probe = gpu(engine, duration=lambda *values: GpuWork(images=1, llm_calls=2),   # an LLM call (re-asked) and an image
                check=checked_new)(with_engine(preview, engine))
    start_run = gpu(engine, duration=lambda **form: mine_work(engine, make_request(**form)), check=checked_new)(
        with_engine(start_mining, engine))
    resumed = with_engine(resume_request, engine)
    resume_run = gpu(engine, duration=lambda **form: mine_work(engine, resumed(**form)),
                     check=request_check(engine, "mine", resumed))(with_engine(resume_mining, engine))
    refresh_runs = user_errors(with_engine(runs_update, engine))

    estimate.click(probe, settings_inputs, [budget], api_name="mine_budget")
    start_event = checked(start.click, engine, "mine", make_request, inputs=settings_inputs).success(
        start_run, settings_inputs, live_outputs, api_name="mine")
    resume_event = checked(resume.click, engine, "mine", with_engine(resume_request, engine),
                           inputs=[runs, iterations]).success(resume_run, [runs, iterations], live_outputs,
                                                              api_name="mine_resume")
    stop.click(with_engine(stop_mining, engine), [state], live_outputs, cancels=[start_event, resume_event],
               api_name="mine_stop")
    refresh.click(refresh_runs, None, [runs], api_name=False)
    restored = [iterations, population, select, mutations, n, n_var, alpha, combine, keep_parents, seed, image_seed,
                strategy, bias]   # Open restores every setting of the run, not only T
    open_btn.click(user_errors(with_engine(open_run, engine)), [runs],
                   live_outputs[:-1] + restored + [lineage, gallery, details], api_name=False)
    pick.change(user_errors(with_engine(show_prompt, engine)), [state, pick], [lineage, gallery, details],
                api_name=False)
    archive_table.select(select_row, [state], [pick], api_name=False)
    population_table.select(select_row, [state], [pick], api_name=False)
    return [(refresh_runs, [runs])]


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
def make_request(bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                 keep_parents, seed, image_seed) -> mine.MineRequest:
    """The request the form's values make."""
    return mine.MineRequest(iterations=int(iterations), population=int(population), select=int(select),
                            mutations=int(mutations), n=int(n), n_variations=int(n_var), alpha=float(alpha),
                            combine=combine, keep_parents=bool(keep_parents), bias=(bias or "open").strip(),
                            strategy=strategy, seed=int(seed or 0), image_seed=int(image_seed or 0))


def resume_request(engine, run_id, iterations) -> mine.MineRequest:
    """The request that continues the stored run `run_id` up to `iterations` (T only ever grows here)."""
    if not run_id:
        raise InputError("pick a stored run to resume")
    stored_T = mine.load_resumable(engine, run_id)["results"]["params"]["T"]
    return mine.MineRequest(resume=run_id, iterations=max(int(iterations), stored_T))


def mine_work(engine, request: mine.MineRequest) -> GpuWork:
    """The GPU work of a search (a resume's: of the iterations it has left, with its run's settings): T·b·N
    images, each embedded for its gap score, and its LLM calls (engine.methods.mine.estimate)."""
    priced = mine.priced_request(request, engine)
    cost = mine.estimate(priced)
    return GpuWork(images=cost.images, steps=priced.steps, embeddings=cost.images, llm_calls=cost.llm_calls)


def preview(engine, *values) -> str:
    """The budget the form's settings imply (the probe may make one LLM call and one image)."""
    return "**Budget:** " + mine.budget_text(mine.estimate_budget(make_request(*values), engine, probe=True))


def start_mining(engine, bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                 keep_parents, seed, image_seed):
    """Yields the live outputs of a new run (LIVE order)."""
    yield from stream(engine, make_request(bias, strategy, iterations, population, select, mutations, n, n_var,
                                           alpha, combine, keep_parents, seed, image_seed))


def resume_mining(engine, run_id, iterations):
    """Yields the live outputs of the stored run `run_id` continued up to `iterations`."""
    yield from stream(engine, resume_request(engine, run_id, iterations))


def stream(engine, request: mine.MineRequest):
    """Run the method and yield its live outputs (LIVE order; tabs.common.streamed). Stop marks the run
    stopped in the store, which `until_stopped` reads (on ZeroGPU this runs in `spaces`' worker process),
    and cancels the event (`cancels=`); either way the method is closed, which keeps its state."""
    view = View()
    events = until_stopped(engine, mine.run(request, engine), view)
    yield from streamed(events, functools.partial(render, engine), LIVE,
                        frequent=(Progress, mine.PromptScored), view=view)


def until_stopped(engine, events, view: View):
    """`events` until the store says their run is stopped (Stop, pressed in whichever process serves
    the page), read every UPDATE_EVERY seconds; closing this closes the method, which saves its state."""
    checked_at = 0.0
    try:
        for event in events:
            run_id = view.kept.get("run_id")
            if run_id and time.perf_counter() - checked_at >= UPDATE_EVERY:
                checked_at = time.perf_counter()
                status = engine.store.run_status(run_id)
                if status is not None and status[0] == "stopped":
                    break
            yield event
    finally:
        events.close()   # a Stop (or a closed page) marks the run stopped and saves its state


def render(engine, event, view: View) -> dict:
    """{live output: value} for one event of a run: the status line and the population live, the
    stored results after each iteration and at the end."""
    kept = view.kept
    if isinstance(event, mine.MineStarted):
        kept["run_id"] = event.run_id
        return {"progress": f"**Started** run `{event.run_id}`", "state": {"run_id": event.run_id}}
    if isinstance(event, Progress):
        eta = f", about {event.eta_s:.0f} s left" if event.eta_s else ""
        kept["message"] = f"**{event.message or event.stage}**{eta}"
    elif isinstance(event, mine.PromptScored):
        population = kept.setdefault("population", {})
        if any(row[-1] != event.iteration for row in population.values()):
            population.clear()
        node = event.node
        population[node["id"]] = [node["id"], node["prompt"], round(node["score"], 4), node["origin"],
                                  node.get("parent") or "", event.iteration]
    elif isinstance(event, mine.IterationDone):
        record = engine.store.get_run(kept.get("run_id"))
        if record and record["results"].get("iterations"):
            return results_update(engine, kept["run_id"], record["results"], f"Iteration {event.iteration + 1} done")
        return {}
    elif isinstance(event, Done):
        return {**results_update(engine, event.run_id, event.results, "Done", with_baseline=True),
                "runs": runs_update(engine, picked=event.run_id)}
    else:
        return {}
    rows = [r[:-1] for r in sorted(kept.get("population", {}).values(), key=lambda r: r[2])]
    return {"progress": f"{kept.get('message', '')} ({view.waited():.1f} s, run "
                        f"`{kept.get('run_id', '')}`)", "population": rows}


def stop_mining(engine, view_state):
    """Stop: marks the visitor's running run stopped in the store (which the process running it, maybe
    ZeroGPU's worker, reads between steps), waits until that process has ended the run (stopped, or
    done when it finished first: `RunStatus.ended`), and shows what the store holds then."""
    run_id = (view_state or {}).get("run_id")
    record = engine.store.get_run(run_id) if run_id else None
    if record is None:
        return in_order(LIVE, {"progress": "Nothing is running."})
    if record["status"] != "running":   # e.g. Stop after the run finished: leave its results alone
        return in_order(LIVE, {"progress": f"Nothing is running: run `{run_id}` is {record['status']}."})
    engine.store.update_run(run_id, status="stopped")
    deadline, status = time.time() + STOP_WAIT, None
    while time.time() < deadline:   # the run's own process ends it: saves its state, or finishes first
        status = engine.store.run_status(run_id)
        if status is None or status.ended:
            break
        time.sleep(0.1)
    record = engine.store.get_run(run_id)
    if record is None:
        return in_order(LIVE, {"progress": "Stopped."})
    if status is not None and not status.ended:
        return in_order(LIVE, {"progress": f"Stop asked: run `{run_id}` is still finishing its current step after "
                                           f"{STOP_WAIT} s; it keeps its state when it closes, and the run list "
                                           f"says how it ended (Refresh)"})
    said = {"done": "Done (it finished before Stop took effect)",
            "failed": f"Failed: {record.get('error') or 'see the run'}"}.get(
        record["status"], "Stopped; everything computed is kept. Resume it below")
    return in_order(LIVE, {**results_update(engine, run_id, record["results"], said),
                           "runs": runs_update(engine, picked=run_id)})


def runs_update(engine, picked=None):
    """The stored runs as the run picker's choices (and the run `picked`)."""
    return gr.update(choices=_run_choices(engine), **({} if picked is None else {"value": picked}))


def open_run(engine, run_id):
    """A stored run shown as the live outputs would show it, with every setting of the form restored."""
    if not run_id:
        raise InputError("pick a stored run to open")
    record = mine.load_resumable(engine, run_id)
    results = record["results"]
    shown = results_update(engine, run_id, results, f"Run {record['status']}", with_baseline=True)
    p, q = results["params"], results.get("request") or {}
    settings = [gr.update(value=v) for v in (p["T"], p["b"], p["s"], p["m"], p["n"], p["n_variations"],
                                              p["alpha"], p["combine"], p["keep_parents"], p["seed"],
                                              p["image_seed"], results.get("strategy", "ga"),
                                              q.get("bias") or results.get("bias") or "open")]
    return (*in_order(LIVE[:-1], shown), *settings, NO_DETAILS, [], "")


def show_prompt(engine, view_state, node_id):
    """(lineage, gallery, gap) of one prompt of the shown run."""
    results = (view_state or {}).get("results")
    if not results or not node_id:
        return NO_DETAILS, [], ""
    info = mine.prompt_details(engine, results, node_id, view_state["run_id"])
    head, gap = report.selected_html(info)
    return head, gallery_items(info["images"]), gap


def select_row(view_state, evt: gr.SelectData):
    """The prompt a click on a row of the archive or the population picks."""
    row = evt.row_value or []
    results = (view_state or {}).get("results") or {}
    texts = {str(v) for v in row}
    node = next((n for n in results.get("nodes", []) if n["id"] in texts or n["prompt"] in texts), None)
    return gr.update(value=node["id"] if node else None)
