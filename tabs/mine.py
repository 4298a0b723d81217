"""Mine Prompts tab: MineTheGap's genetic search, streamed live (population, best-score chart,
ranked archive, lineage), stoppable and resumable; any stored run (app or CLI) can be opened."""
from __future__ import annotations

import time

import gradio as gr

from engine.common.errors import InputError
from engine.common.events import Done, Progress, Scores, Warning
from engine.methods import mine
from engine.report import mine as report

from .common import checked, default, gallery_items, gpu, gpu_seconds_for, options, user_errors, with_notes

STRATEGY_LABELS = {"ga": "genetic algorithm (MineTheGap)", "random": "random prompts, same budget (baseline)",
                   "source": "rank the prompts a folder/dataset source holds (no new images)"}
UPDATE_EVERY = 0.5   # seconds between two progress/population updates of the page
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


class _View:
    """The latest value of every live output; each event changes some, the rest are skipped."""

    NAMES = ("progress", "chart", "population", "archive", "pick", "state", "runs")

    def __init__(self):
        self.values = {name: gr.skip() for name in self.NAMES}
        self.state: dict = {}
        self.notes: list[str] = []     # the run's warnings, listed under its status line

    def update(self, **changes):
        if "progress" in changes and self.notes:
            changes["progress"] = with_notes(changes["progress"], self.notes)
        for name, value in changes.items():
            self.values[name] = value
        return tuple(changes.get(name, gr.skip()) for name in self.NAMES)

    def everything(self):
        return tuple(self.values[name] for name in self.NAMES)

    def show_results(self, run_id: str, results: dict, status: str, baseline: dict | None = None):
        iteration = len(results.get("iterations", [])) - 1
        if results.get("pending"):
            iteration = results["pending"]["iteration"]
        self.state = {"run_id": run_id, "results": results}
        return self.update(progress=report.progress_text(results, run_id, status), chart=report.mine_chart(results, baseline),
                           population=mine.population_rows(results, max(0, iteration)) if results.get("nodes") else [],
                           archive=mine.archive_rows(results.get("archive", [])),
                           pick=gr.update(choices=_pick_choices(results)), state=self.state)


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
            population_table = gr.Dataframe(headers=mine.POPULATION_COLUMNS, label="Population (this iteration)",
                                            interactive=False, wrap=True, max_height=300, elem_id="mine-population")
            archive_table = gr.Dataframe(headers=mine.ARCHIVE_COLUMNS,
                                         label="Archive: the most biased prompts found (click one to open it)",
                                         interactive=False, wrap=True, max_height=360, elem_id="mine-archive")
    pick = gr.Dropdown([], label="Open an archived prompt", elem_id="mine-pick", allow_custom_value=True)
    lineage = gr.HTML(NO_DETAILS, elem_id="mine-lineage")
    gallery = gr.Gallery(label="Images of the prompt", columns=8, height=240, elem_id="mine-gallery",
                         object_fit="contain", allow_preview=True)
    details = gr.HTML(elem_id="mine-gap")
    state = gr.State({})

    settings_inputs = [bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                       keep_parents, seed, image_seed]
    live_outputs = [progress, chart, population_table, archive_table, pick, state, runs]

    def make_request(bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                     keep_parents, seed, image_seed) -> mine.MineRequest:
        return mine.MineRequest(iterations=int(iterations), population=int(population), select=int(select),
                                mutations=int(mutations), n=int(n), n_variations=int(n_var), alpha=float(alpha),
                                combine=combine, keep_parents=bool(keep_parents), bias=(bias or "open").strip(),
                                strategy=strategy, seed=int(seed or 0), image_seed=int(image_seed or 0))

    def mine_seconds(iterations=mine.DEFAULT_ITERATIONS, population=default(Request, "population"),
                     n=default(Request, "n"), **rest):
        # T·b prompts of N images; per prompt an LLM mutation (or a random prompt) and its text variations
        try:
            prompts = max(1, int(iterations)) * max(1, int(population))
        except (TypeError, ValueError):
            prompts = mine.DEFAULT_ITERATIONS * default(Request, "population")
        return gpu_seconds_for(engine, n, sets=prompts, llm_calls=2 * prompts)

    @gpu(engine, duration=lambda **form: gpu_seconds_for(engine, 1, llm_calls=2))   # the probe: 1 LLM call, 1 image
    def preview(*values):
        return "**Budget:** " + mine.budget_text(mine.estimate_budget(make_request(*values), engine, probe=True))

    def stream(request: mine.MineRequest):
        """Run the method and map its events onto the live outputs (frequent ones throttled). Stop marks the
        run stopped in the store, which this loop reads (on ZeroGPU it runs in `spaces`' worker process),
        and cancels the event (`cancels=`); either way the method is closed, which keeps its state."""
        view = _View()
        events = mine.run(request, engine)
        population: dict[str, list] = {}
        run_id, message, started, last, checked = "", "", time.perf_counter(), 0.0, 0.0
        try:
            for event in events:
                if run_id and time.perf_counter() - checked >= UPDATE_EVERY:
                    checked = time.perf_counter()
                    record = engine.store.get_run(run_id)
                    if record is not None and record["status"] == "stopped":
                        break     # Stop was pressed (in whichever process serves the page)
                if isinstance(event, Progress):
                    eta = f", about {event.eta_s:.0f} s left" if event.eta_s else ""
                    message = f"**{event.message or event.stage}**{eta}"
                elif isinstance(event, Scores) and event.name == "prompt":
                    node = event.values
                    if any(row[-1] != node["iteration"] for row in population.values()):
                        population.clear()
                    population[node["id"]] = [node["id"], node["prompt"], round(node["score"], 4), node["origin"],
                                              node.get("parent") or "", node["iteration"]]
                if isinstance(event, Progress) or (isinstance(event, Scores) and event.name == "prompt"):
                    if time.perf_counter() - last >= UPDATE_EVERY:    # a few updates a second at most
                        last = time.perf_counter()
                        rows = [r[:-1] for r in sorted(population.values(), key=lambda r: r[2])]
                        yield view.update(progress=f"{message} ({last - started:.1f} s, run `{run_id}`)",
                                          population=rows)
                elif isinstance(event, Scores) and event.name == "run":
                    run_id = event.values["run_id"]
                    view.state = {"run_id": run_id}
                    yield view.update(progress=f"**Started** run `{run_id}`", state=view.state)
                elif isinstance(event, Warning):    # shown with this run, not as a toast over it
                    view.notes.append(event.message)
                elif isinstance(event, Scores) and event.name == "iteration":
                    record = engine.store.get_run(run_id)
                    if record and record["results"].get("iterations"):
                        view.show_results(run_id, record["results"], f"Iteration {event.values['iteration'] + 1} done")
                        yield view.everything()
                elif isinstance(event, Done):
                    view.show_results(event.run_id, event.results, "Done", _baseline_for(engine, event.results))
                    view.values["runs"] = gr.update(choices=_run_choices(engine), value=event.run_id)
                    yield view.everything()
        finally:
            events.close()   # a Stop (or a closed page) marks the run stopped and saves its state

    def _stopped(run_id: str, view: _View):
        record = engine.store.get_run(run_id)
        if record is None:
            return view.update(progress="Stopped.")
        status = ("Done (it finished before Stop took effect)" if record["status"] == "done"
                  else "Stopped; everything computed is kept. Resume it below")
        view.show_results(run_id, record["results"], status)
        view.values["runs"] = gr.update(choices=_run_choices(engine), value=run_id)
        return view.everything()

    @gpu(engine, duration=mine_seconds)
    def start_mining(bias, strategy, iterations, population, select, mutations, n, n_var, alpha, combine,
                     keep_parents, seed, image_seed):
        yield from stream(make_request(bias, strategy, iterations, population, select, mutations, n, n_var, alpha,
                                       combine, keep_parents, seed, image_seed))

    def resume_request(run_id, iterations) -> mine.MineRequest:
        if not run_id:
            raise InputError("pick a stored run to resume")
        stored_T = mine.load_resumable(engine, run_id)["results"]["params"]["T"]   # T only ever grows here
        return mine.MineRequest(resume=run_id, iterations=max(int(iterations), stored_T))

    @gpu(engine, duration=lambda run_id, iterations: mine_seconds(iterations=iterations))
    def resume_mining(run_id, iterations):
        yield from stream(resume_request(run_id, iterations))

    def stop_mining(view_state):
        """Stop: marks the visitor's running run stopped in the store (which the process running it, maybe
        ZeroGPU's worker, reads), waits until that process saved its state, and shows what was kept."""
        run_id = (view_state or {}).get("run_id")
        record = engine.store.get_run(run_id) if run_id else None
        view = _View()
        if record is None:
            return view.update(progress="Nothing is running.")
        if record["status"] != "running":   # e.g. Stop after the run finished: leave its results alone
            return view.update(progress=f"Nothing is running: run `{run_id}` is {record['status']}.")
        asked = time.time()
        engine.store.update_run(run_id, status="stopped")
        deadline = asked + STOP_WAIT
        while time.time() < deadline:   # the run's own process saves its state when it closes the run
            record = engine.store.get_run(run_id)
            if record is None or record["updated"] > asked + 1e-3:
                break
            time.sleep(0.1)
        return _stopped(run_id, view)

    @user_errors
    def refresh_runs():
        return gr.update(choices=_run_choices(engine))

    @user_errors
    def open_run(run_id):
        if not run_id:
            raise InputError("pick a stored run to open")
        record = mine.load_resumable(engine, run_id)
        results = record["results"]
        view = _View()
        view.show_results(run_id, results, f"Run {record['status']}", _baseline_for(engine, results))
        p, q = results["params"], results.get("request") or {}
        settings = [gr.update(value=v) for v in (p["T"], p["b"], p["s"], p["m"], p["n"], p["n_variations"],
                                                  p["alpha"], p["combine"], p["keep_parents"], p["seed"],
                                                  p["image_seed"], results.get("strategy", "ga"),
                                                  q.get("bias") or results.get("bias") or "open")]
        return (*view.everything()[:-1], *settings, NO_DETAILS, [], "")

    @user_errors
    def show_prompt(view_state, node_id):
        results = (view_state or {}).get("results")
        if not results or not node_id:
            return NO_DETAILS, [], ""
        info = mine.prompt_details(engine, results, node_id, view_state["run_id"])
        head, gap = report.selected_html(info)
        return head, gallery_items(info["images"]), gap

    def select_row(view_state, evt: gr.SelectData):
        row = evt.row_value or []
        results = (view_state or {}).get("results") or {}
        texts = {str(v) for v in row}
        node = next((n for n in results.get("nodes", []) if n["id"] in texts or n["prompt"] in texts), None)
        return gr.update(value=node["id"] if node else None)

    estimate.click(preview, settings_inputs, [budget], api_name="mine_budget")
    start_event = checked(start.click, engine, "mine", make_request, inputs=settings_inputs).success(
        start_mining, settings_inputs, live_outputs, api_name="mine")
    resume_event = checked(resume.click, engine, "mine", resume_request, inputs=[runs, iterations]).success(
        resume_mining, [runs, iterations], live_outputs, api_name="mine_resume")
    stop.click(stop_mining, [state], live_outputs, cancels=[start_event, resume_event], api_name="mine_stop")
    refresh.click(refresh_runs, None, [runs], api_name=False)
    restored = [iterations, population, select, mutations, n, n_var, alpha, combine, keep_parents, seed, image_seed,
                strategy, bias]   # Open restores every setting of the run, not only T
    open_btn.click(open_run, [runs], live_outputs[:-1] + restored + [lineage, gallery, details], api_name=False)
    pick.change(show_prompt, [state, pick], [lineage, gallery, details], api_name=False)
    archive_table.select(select_row, [state], [pick], api_name=False)
    population_table.select(select_row, [state], [pick], api_name=False)
    return [(refresh_runs, [runs])]
