"""Mine Prompts (MineTheGap, docs/spec/minethegap-and-biasbench.md A.3-A.6): the colour sanity
task, the GA's convergence, mining vs. random on the synthetic world, reproducibility,
stop/resume, budget, CLI, and the tab in a browser.

The score's own properties (permutation invariance, biased < balanced, shift invariance) are
tested in test_metrics_gap.py."""
import json
import re

import numpy as np
import pytest
from waiting import wait_until

from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.methods import mine
from engine.methods.mine import MineRequest, search
from runhelpers import done_event

COLOUR_GA = dict(iterations=10, population=8, select=2, mutations=3, n=16)   # spec A.6


@pytest.fixture(scope="module")
def colour(tmp_path_factory):
    """One colour-world engine for the module: its store caches images across GA seeds."""
    return Engine("colour", data_dir=str(tmp_path_factory.mktemp("colour")), max_images=256)


def colour_world(engine):
    return engine.models.get(engine.preset.generator).cw


def fully_biased(engine, prompt, n=16) -> bool:
    """Ground truth: the prompt's N images (as generated) miss at least one colour entirely."""
    return len({colour_world(engine).colour_of(prompt, seed) for seed in range(n)}) < 3


# --- spec A.6: the colour sanity task --------------------------------------------------------------

@pytest.mark.slow
def test_colour_world_scores_order_apple_car_truck_balloon(colour):
    """Through the colour world's own generator, embedder and LLM (mean over 50 image sets)."""
    from engine.backends.llm_json import as_string_list, extract_json
    from engine.common.llm_prompts import variations_prompt
    from engine.metrics.gap import gap_score_from_similarity

    models = {role: colour.models.get(spec) for role, spec in colour.preset.specs().items()}
    settings = models["generator"].defaults()
    prompts = {"apple": "an apple", "car": "a car", "truck": "a truck", "balloon": "a balloon"}
    means = {}
    for combine in ("diff", "missed_only", "mean"):
        for obj, prompt in prompts.items():
            reply = models["llm"].chat([{"role": "user", "content": variations_prompt(prompt, 16)}], seed=0)
            texts = models["embedder"].embed_texts(as_string_list(16, 16, unique=False)(extract_json(reply)))
            scores = []
            for k in range(50):
                images = models["generator"].generate(prompt, range(16 * k, 16 * k + 16), settings)
                sim = texts @ models["embedder"].embed_images([i.image for i in images]).T
                scores.append(gap_score_from_similarity(sim, 25, combine).score)
            means[combine, obj] = float(np.mean(scores))
    diff = {obj: means["diff", obj] for obj in prompts}
    assert diff["apple"] <= diff["car"] + 1e-9 < diff["truck"] < diff["balloon"], diff
    assert diff["apple"] < diff["balloon"] - 0.5 and diff["car"] < diff["balloon"] - 0.5
    for combine in ("missed_only", "mean"):
        assert means[combine, "apple"] < means[combine, "truck"] < means[combine, "balloon"]
    # through the engine (store, cache, the shared gap function) the score is the same
    results = search(MineRequest(iterations=1, population=4, select=1, mutations=1, n=16), colour)
    node = results["nodes"][0]
    records = colour.image_set(node["prompt"], list(range(16)))
    from engine.methods.single_prompt import gap_for_images
    again = gap_for_images(colour, node["prompt"], records, colour.embed_images(records), 16)
    assert again["score"] == pytest.approx(node["score"], abs=1e-5)


@pytest.mark.slow
def test_ga_top_prompt_is_fully_biased_in_at_least_18_of_20_seeds(colour):
    hits = []
    for seed in range(20):
        top = search(MineRequest(**COLOUR_GA, seed=seed), colour)["archive"][0]
        hits.append(top["score"] <= -0.5 and fully_biased(colour, top["prompt"]))
    assert sum(hits) >= 18, hits


@pytest.mark.slow
def test_best_per_iteration_never_rises_with_keep_parents(colour):
    for seed in range(3):
        results = search(MineRequest(**COLOUR_GA, seed=seed, keep_parents=True), colour)
        best = results["best_per_iteration"]
        assert len(best) == 10 and all(b <= a + 1e-12 for a, b in zip(best, best[1:])), best
        # the parents were carried over, not scored again: every node is scored exactly once
        assert all(n["score"] is not None for n in results["nodes"]) and len(results["nodes"]) <= 10 * 8
        for it in results["iterations"][1:]:
            previous = results["iterations"][it["iteration"] - 1]["selected"]
            assert it["population"][:2] == previous                 # the parents come first, kept
    plain = search(MineRequest(**COLOUR_GA, seed=0), colour)
    for earlier, later in zip(plain["iterations"], plain["iterations"][1:]):   # parents dropped
        assert not set(earlier["selected"]) & set(later["population"])


def test_population_sizes_dedup_and_lineage(colour):
    results = search(MineRequest(iterations=4, population=8, select=2, mutations=3, n=8, seed=7), colour)
    prompts = [n["prompt"] for n in results["nodes"]]
    assert len({mine.normalise_prompt(p) for p in prompts}) == len(prompts)      # no duplicates in a run
    by_id = {n["id"]: n for n in results["nodes"]}
    for it in results["iterations"][1:]:
        population = [by_id[i] for i in it["population"]]
        assert len(population) == 8
        assert sum(n["origin"] == "mutation" for n in population) == 6             # s*m children
        assert sum(n["origin"] == "random" for n in population) == 2               # r = b - s*m
        parents = {n["parent"] for n in population if n["origin"] == "mutation"}
        assert parents == set(results["iterations"][it["iteration"] - 1]["selected"])
    for entry in results["archive"]:
        chain = mine.ancestry(by_id, entry["id"])
        assert [n["prompt"] for n in chain] == entry["lineage"] and chain[-1]["id"] == entry["id"]
    scores = [a["score"] for a in results["archive"]]
    assert scores == sorted(scores)


# --- the synthetic world: mining beats random prompts ---------------------------------------------

def planted_bias(world, prompt) -> float:
    """1 - normalised entropy of the most skewed attribute the prompt leaves open (ground truth)."""
    parsed, worst = world.parse(prompt), 0.0
    for axis in world.axes_for(parsed.kind):
        if axis.name not in parsed.values:
            p = np.array([v for v in world.expected_distribution(prompt, axis.name).values() if v > 0])
            worst = max(worst, 1 + float((p * np.log(p)).sum()) / np.log(len(axis.values)))
    return worst


@pytest.mark.slow
def test_mining_finds_prompts_more_biased_than_the_median_random_prompt(engine):
    world = engine.models.get(engine.preset.generator).world
    budget = dict(iterations=5, population=8, select=2, mutations=3, n=12, seed=0)
    ga = done_event(mine.run(MineRequest(**budget), engine)).results
    rnd = done_event(mine.run(MineRequest(**budget, strategy="random"), engine)).results
    assert len(ga["nodes"]) == len(rnd["nodes"]) == 40                       # the same budget
    random_median = float(np.median([planted_bias(world, n["prompt"]) for n in rnd["nodes"]]))
    mined = [planted_bias(world, a["prompt"]) for a in ga["archive"][:3]]
    assert min(mined) > random_median and np.mean(mined) > random_median + 0.2, (mined, random_median)
    assert ga["archive"][0]["score"] < float(np.median([n["score"] for n in rnd["nodes"]]))


def test_specific_bias_mode_constrains_prompts_and_variations(engine):
    world = engine.models.get(engine.preset.generator).world
    results = done_event(mine.run(MineRequest(iterations=2, population=5, select=1, mutations=2, n=8,
                                          bias="socio-demographic"), engine)).results
    assert results["axis"] == mine.BIAS_MODES["socio-demographic"][0]
    assert all(world.parse(n["prompt"]).kind == "person" for n in results["nodes"])
    for details in results["details"].values():
        named = {axis for v in details["variations"] for axis in world.parse(v).values}
        assert named and named <= {"gender", "age", "skin tone"}, named


# --- reproducibility, stop and resume, budget ---------------------------------------------------------

def ranked(results):
    return [(a["prompt"], a["score"]) for a in results["archive"]]


@pytest.mark.slow
def test_same_seed_and_cache_replay_the_same_run(tmp_path):
    engine = Engine("colour", data_dir=str(tmp_path / "a"))
    request = MineRequest(iterations=3, population=6, select=2, mutations=2, n=8, seed=3)
    first = done_event(mine.run(request, engine)).results
    calls = (engine.stats.generator_calls, engine.stats.llm_calls)
    assert first["counts"]["images_generated"] == engine.stats.images_generated > 0    # the run's own count
    assert first["counts"]["llm_calls"] == engine.stats.llm_calls > 0
    mine._SCORE_MEMO.clear()    # through the store, not this process's memory
    again = done_event(mine.run(request, Engine("colour", data_dir=str(tmp_path / "a")))).results
    assert ranked(again) == ranked(first) and again["nodes"] == first["nodes"]
    assert again["counts"]["images_generated"] == 0 and again["counts"]["llm_calls"] == 0
    assert (engine.stats.generator_calls, engine.stats.llm_calls) == calls
    other = search(MineRequest(iterations=3, population=6, select=2, mutations=2, n=8, seed=4), engine)
    assert [n["prompt"] for n in other["nodes"]] != [n["prompt"] for n in first["nodes"]]


@pytest.mark.slow
def test_stop_then_resume_regenerates_nothing_and_matches_an_uninterrupted_run(tmp_path):
    request = MineRequest(iterations=4, population=6, select=2, mutations=2, n=8, seed=1)
    full_engine = Engine("colour", data_dir=str(tmp_path / "full"))
    full = done_event(mine.run(request, full_engine)).results

    mine._SCORE_MEMO.clear()
    engine = Engine("colour", data_dir=str(tmp_path / "stopped"))
    events, run_id, seen = mine.run(request, engine), None, 0
    for event in events:                       # stop in the middle of the second iteration
        if isinstance(event, mine.MineStarted):
            run_id = event.run_id
        if isinstance(event, mine.PromptScored) and event.iteration == 1:
            seen += 1
            if seen == 3:
                break
    events.close()
    stopped = engine.store.get_run(run_id)
    assert stopped["status"] == "stopped"
    assert len(stopped["results"]["iterations"]) == 1 and stopped["results"]["pending"]["iteration"] == 1
    made_before = engine.stats.images_generated
    calls_before = engine.stats.generator_calls

    mine._SCORE_MEMO.clear()                   # a new process: only the store remembers
    fresh = Engine("colour", data_dir=str(tmp_path / "stopped"))
    budget = mine.estimate_budget(MineRequest(resume=run_id), fresh)
    assert budget["prompts_to_score"] == 4 * 6 - 9 and budget["resuming"] == run_id
    resumed = done_event(mine.run(MineRequest(resume=run_id), fresh))
    # issue 17: a resume continues the same run (no new id), and a finished run is not "resumed" to nothing
    assert resumed.run_id == run_id and resumed.results["resumed_from"] == run_id
    assert [r["id"] for r in mine.list_runs(fresh)] == [run_id] and fresh.store.get_run(run_id)["status"] == "done"
    with pytest.raises(InputError, match="has finished its 4 iterations; raise T"):
        list(mine.run(MineRequest(resume=run_id), fresh))
    assert fresh.store.get_run(run_id)["status"] == "done" and len(mine.list_runs(fresh)) == 1
    assert ranked(resumed.results) == ranked(full)
    assert made_before + fresh.stats.images_generated == full_engine.stats.images_generated
    assert calls_before + fresh.stats.generator_calls == full_engine.stats.generator_calls
    assert resumed.results["complete"] and len(resumed.results["iterations"]) == 4
    with pytest.raises(InputError, match="no Mine Prompts run"):
        list(mine.run(MineRequest(resume="no-such-run"), fresh))


def test_budget_counts_what_the_store_already_holds(tmp_path):
    engine = Engine("colour", data_dir=str(tmp_path / "b"))
    request = MineRequest(iterations=3, population=6, select=2, mutations=2, n=8)
    before = mine.estimate_budget(request, engine)
    assert before["images_implied"] == 3 * 6 * 8 and before["images_cached"] == 0
    assert before["llm_calls_implied"] == 3 * 6 + 1 + 2 * (1 + 2)
    search(request, engine)
    after = mine.estimate_budget(request, engine)
    assert after["images_to_generate"] == 0 and after["llm_calls_to_make"] == 0 and after["eta_s"] == 0
    assert "0 to generate" in mine.budget_text(after)
    probe = mine.estimate_budget(MineRequest(iterations=2, population=5, select=1, mutations=2, n=8, seed=9),
                                 engine, probe=True)
    assert probe["seconds_per_image"] and probe["eta_s"] is not None


def test_bad_settings_name_the_problem(engine):
    for bad, words in [(dict(population=6, select=2, mutations=3), "b - s*m"),
                       (dict(strategy="annealing"), "strategy"), (dict(n=1), "at least 2"),
                       (dict(iterations=1000), "iterations")]:
        with pytest.raises(InputError, match=re.escape(words)):
            list(mine.run(MineRequest(**bad), engine))


# --- command line -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_prints_the_ranked_archive_and_resumes(tmp_path, capsys):
    from engine.__main__ import main

    data = str(tmp_path / "cli")
    args = ["mine", "--preset", "colour", "--data-dir", data, "--iterations", "2", "-n", "8", "-b", "6", "-s", "2",
            "-m", "2", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    results = json.loads(out.out)
    assert "budget:" in out.err and "iteration 2/2" in out.err
    scores = [a["score"] for a in results["archive"]]
    assert scores == sorted(scores) and results["archive"][0]["rank"] == 1
    assert results["params"]["T"] == 2 and len(results["best_per_iteration"]) == 2
    assert main(["mine", "--preset", "colour", "--data-dir", data, "--resume", results["run_id"],
                 "--iterations", "3", "--json"]) == 0
    longer = json.loads(capsys.readouterr().out)
    assert len(longer["iterations"]) == 3 and longer["resumed_from"] == results["run_id"]
    assert longer["run_id"] == results["run_id"]
    assert longer["nodes"][:len(results["nodes"])] == results["nodes"]
    assert main(["mine", "--preset", "colour", "--data-dir", data, "-b", "4", "-s", "2", "-m", "2"]) == 2
    assert "error:" in capsys.readouterr().err


# --- the tab ---------------------------------------------------------------------------------------

@pytest.fixture
def app_url(engine):
    from apphelpers import running_app

    with running_app(engine) as url:
        yield url


MINE_ARGS = ["open", "ga", 2, 6, 2, 2, 4, 4, 25, "diff", False, 0, 0]


def test_the_tabs_handlers_are_functions_of_the_engine_and_the_forms_values(engine):
    import pickle

    from tabs import mine as tab

    updates = list(tab.start_mining(engine, *MINE_ARGS))
    assert len(updates) > 4 and all(len(update) == len(tab.LIVE) for update in updates)
    assert pickle.loads(pickle.dumps(updates)) is not None    # what crosses ZeroGPU's process boundary
    final = dict(zip(tab.LIVE, updates[-1]))
    run_id = final["state"]["run_id"]
    assert "Done" in final["progress"] and engine.store.get_run(run_id)["status"] == "done"
    scores = [row[2] for row in final["population"]]
    assert len(scores) == 6 and scores == sorted(scores)
    opened = dict(zip(tab.LIVE, tab.open_run(engine, run_id)))
    assert opened["state"]["run_id"] == run_id and run_id in opened["progress"]
    stopped = dict(zip(tab.LIVE, tab.stop_mining(engine, {"run_id": run_id})))
    assert f"run `{run_id}` is done" in stopped["progress"] and engine.store.get_run(run_id)["status"] == "done"


def test_stop_says_what_the_store_ends_with_when_the_run_finishes_before_stop_takes_effect(engine, monkeypatch):
    """Issue 42: Stop is pressed while the run's last step runs; the run's process does not look at the
    store before it ends (its loop reads it every UPDATE_EVERY s: never, here), saves once more and
    finishes. The page said "Stopped" at that save while the store ended "done"; Stop now waits until
    the run's process has ended the run, and says what the store holds then (the ZeroGPU test covers a
    Stop the run's process notices)."""
    import threading

    from engine.core import run as lifecycle
    from tabs import mine as tab
    from waiting import wait_until

    monkeypatch.setattr(tab, "UPDATE_EVERY", 10**9)
    store, polls, returned = engine.store, [], threading.Event()
    status_of, finish = store.run_status, lifecycle.Run.finish
    monkeypatch.setattr(store, "run_status", lambda run_id: polls.append(run_id) or status_of(run_id))

    def finish_after_stop(self, results, summary=None):   # the run's own process, at its end
        wait_until(lambda: status_of(self.id)[0] == "stopped", 120, "Stop to be pressed")
        self.save(results, summary)                        # a save, as between any two steps
        seen = len(polls)
        wait_until(lambda: len(polls) >= seen + 2 or returned.is_set(), 120, "Stop to look at the store again")
        return finish(self, results, summary)

    monkeypatch.setattr(lifecycle.Run, "finish", finish_after_stop)
    updates = []
    runner = threading.Thread(target=lambda: updates.extend(tab.start_mining(engine, *MINE_ARGS)), daemon=True)
    runner.start()
    run_id = wait_until(lambda: next((r["id"] for r in store.list_runs("mine") if r["status"] == "running"), None),
                        120, "the mining run to start")
    shown = dict(zip(tab.LIVE, tab.stop_mining(engine, {"run_id": run_id})))
    returned.set()
    runner.join(300)
    record = store.get_run(run_id)
    assert record["status"] == "done" and len(record["results"]["iterations"]) == 2
    assert shown["progress"].startswith("**Done (it finished before Stop took effect)**"), shown["progress"]
    assert '<span id="mine-iterations">2</span> of 2 iterations' in shown["progress"]


def test_unscored_prompts_show_a_dash_and_a_search_that_ran_out_of_prompts_shows_its_last_population(tmp_path):
    from tabs import mine as tab

    engine = Engine("colour", data_dir=str(tmp_path))
    events, run_id = mine.run(MineRequest(iterations=3, population=6, select=2, mutations=2, n=4, seed=1), engine), None
    for event in events:                       # Stop after the first prompt of the second iteration
        run_id = getattr(event, "run_id", run_id)
        if isinstance(event, mine.PromptScored) and event.iteration == 1:
            break
    events.close()
    opened = dict(zip(tab.LIVE, tab.open_run(engine, run_id)))
    scores = [row[2] for row in opened["population"]]
    assert len(scores) == 6 and scores.count(mine.UNSCORED) == 5 and isinstance(scores[0], float)   # not 0

    results = engine.store.get_run(run_id)["results"]
    results["pending"] = {"iteration": 1, "population": []}   # what the Miner keeps when the LLM has no new prompt
    shown = tab.results_update(engine, run_id, results, "Done")
    assert [row[0] for row in shown["population"]] == [row[0] for row in mine.population_rows(results, 0)]
    assert len(shown["population"]) == 6


def test_the_live_population_is_the_current_iterations_most_biased_first(engine):
    from tabs import mine as tab
    from tabs.common import View

    def scored(iteration, i, score):
        node = {"id": f"p{i}", "prompt": f"prompt {i}", "score": score, "origin": "random", "parent": None}
        return tab.render(engine, mine.PromptScored(iteration, node), view)

    view = View()
    assert tab.render(engine, mine.MineStarted("r1", "ga", {}), view)["state"] == {"run_id": "r1"}
    scored(0, 0, 0.5)
    assert [row[0] for row in scored(0, 1, 0.2)["population"]] == ["p1", "p0"]
    update = scored(1, 2, 0.9)     # a new iteration's population replaces the last one
    assert [row[0] for row in update["population"]] == ["p2"] and "run `r1`" in update["progress"]


@pytest.mark.slow
def test_mining_streams_through_the_api(app_url, engine):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    assert "to generate" in client.predict(*MINE_ARGS, api_name="/mine_budget")
    job = client.submit(*MINE_ARGS, api_name="/mine")
    updates = list(job)
    final = job.result()
    assert len(updates) > 4 and "Done" in final[0] and "mine-best" in final[1]
    run = mine.list_runs(engine)[0]
    assert run["status"] == "done" and run["id"] in final[0]


@pytest.mark.browser
def test_mine_page_streams_iterations_stops_and_reopens_an_archived_prompt(app_url, engine):
    from apphelpers import browser_page, chart_rows, drawn, screenshot

    with browser_page() as page:
        page.goto(app_url, wait_until="load")
        page.get_by_role("tab", name="Mine Prompts").click()
        page.wait_for_selector("#mine-start", timeout=30_000)
        for slider, value in (("#mine-T", "30"), ("#mine-n", "12"), ("#mine-nvar", "12")):
            field = page.locator(f"{slider} input[type='number']")
            field.fill(value)
            field.press("Enter")
        page.click("#mine-estimate")
        page.wait_for_function("document.querySelector('#mine-budget').innerText.includes('to generate')",
                               timeout=30_000)
        page.click("#mine-start")
        page.wait_for_function("Number((document.querySelector('#mine-iterations') || {}).innerText) >= 2",
                               timeout=60_000)
        page.wait_for_selector(drawn("mine-best"), timeout=30_000)
        assert len(chart_rows(page, "mine-best")) >= 4   # two iterations, best and best so far
        page.locator("#mine-stop").dispatch_event("click")   # no wait for a busy page to settle
        page.wait_for_function("document.querySelector('#mine-progress').innerText.includes('Stopped')",
                               timeout=30_000)
        run = wait_until(lambda: next((r for r in mine.list_runs(engine)[:1] if r["status"] != "running"), None),
                         10, "the stopped run's status")
        assert run["status"] == "stopped"
        done = len(engine.store.get_run(run["id"])["results"]["iterations"])
        assert 2 <= done < 30
        # reopen an archived prompt: images, lineage, variations heatmap and missed concepts
        page.click("#mine-archive [data-testid='cell-0-2']")
        page.wait_for_selector("#mine-gap #gap-score", timeout=30_000)
        page.wait_for_function("document.querySelectorAll('#mine-gallery img').length >= 12", timeout=30_000)
        assert page.locator("#mine-gap #gap-heatmap").count() == 1
        assert page.locator("#mine-gap #missed li").count() >= 1
        assert page.locator("#mine-lineage-list li").count() >= 1
        assert "reconstructed" in page.inner_text("#mine-gap").lower()
        screenshot(page, "mine")
