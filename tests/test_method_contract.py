"""The contract every method in METHODS keeps, on the synthetic world with small N: its events end
in exactly one Done; its results survive a JSON round trip and equal the stored run record's;
the CLI's --json prints the stored record's results (plus run_id); its page escapes hostile
strings; its row carries a check, an estimate and a tab or command, and a public GapLens bounds
its requests by exactly that estimate. A new method gets these checks by adding its row to
METHODS and a case below; a row added to METHODS alone gets its budget, command and tab."""
import importlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field

import gradio as gr
import pytest

import tabs
from engine.cli import build_parser, main
from engine.backends.base import CANT_TELL
from engine.common import access
from engine.common.errors import InputError, OverBudgetError
from engine.core.engine import Engine, recorded
from engine.hosting.limits import Budget, Estimate
from engine.methods import METHODS, Method, compare_models, counterfactuals, mine
from engine.models.presets import SYNTHETIC_TABLE
from runhelpers import done_event

HOSTILE = "<img src=x onerror=alert(1)>"
PROMPT = f"a photo of a doctor, {HOSTILE}"
AXES = {"gender": [f"a photo of a male doctor, {HOSTILE}", f"a photo of a female doctor, {HOSTILE}"],
        "age": [f"a photo of a young doctor, {HOSTILE}", f"a photo of an old doctor, {HOSTILE}"]}

# method -> (request fields, the same request as command-line options)
CASES = {
    "generate": ({"prompt": PROMPT, "n": 3}, ["--prompt", PROMPT, "-n", "3"]),
    "single_prompt": ({"prompt": PROMPT, "n": 4, "n_boot": 100}, ["--prompt", PROMPT, "-n", "4", "--n-boot", "100"]),
    "counterfactuals": ({"prompt": PROMPT, "axes": AXES, "n": 4, "n_boot": 100},
                        ["--prompt", PROMPT, "--axes", json.dumps(AXES), "-n", "4", "--n-boot", "100"]),
    "intersectional": ({"prompt": PROMPT, "axes": AXES, "n": 4, "n_boot": 100},
                       ["--prompt", PROMPT, "--axes", json.dumps(AXES), "-n", "4", "--n-boot", "100"]),
    "mine": ({"iterations": 1, "population": 4, "select": 1, "mutations": 2, "n": 4, "bias": f"hair {HOSTILE}"},
             ["-T", "1", "-b", "4", "-s", "1", "-m", "2", "-n", "4", "--bias", f"hair {HOSTILE}"]),
    "mitigate": ({"prompt": PROMPT, "axes": AXES, "n": 8, "n_boot": 100},
                 ["--prompt", PROMPT, "--axes", json.dumps(AXES), "-n", "8", "--n-boot", "100"]),
    "explore": ({"prompt": PROMPT, "n": 4, "concepts": [f"a photo of a man, {HOSTILE}", "a photo of a woman"],
                 "inverse": [f"smiling, {HOSTILE}"], "m": 2},
                ["--prompt", PROMPT, "-n", "4", "--concepts", f"a photo of a man, {HOSTILE}", "a photo of a woman",
                 "--inverse", f"smiling, {HOSTILE}", "-m", "2"]),
    "languages": ({"prompt": PROMPT, "languages": ["en", "de"], "translations": {"de": f"ein Foto von einem Arzt, {HOSTILE}"},
                   "n": 4, "n_boot": 100},
                  ["--prompt", PROMPT, "--languages", "en", "de", "--translation", f"de=ein Foto von einem Arzt, {HOSTILE}",
                   "-n", "4", "--n-boot", "100"]),
    # two generators: the preset's, and the same world named by a relative path (another spec)
    "compare_models": ({"method": "single_prompt",
                        "generators": ["synthetic", f"synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}"],
                        "request": {"prompt": PROMPT, "n": 4, "n_boot": 100}}, []),
}
# the bias check: the same world under another name (identical images, so it passes: exit 0); its suite a file
SUITE = {"prompts": [PROMPT], "n": 4, "axes": ["gender"]}
SUITE_FILE = os.path.join(tempfile.mkdtemp(prefix="contract-suite-"), "suite.json")
with open(SUITE_FILE, "w", encoding="utf-8") as _fh:
    json.dump(SUITE, _fh)
CASES["check"] = ({**SUITE, "base": "synthetic", "candidate": f"synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}",
                   "n_boot": 200, "n_perm": 200},
                  [SUITE_FILE, "--base", "synthetic", "--candidate", f"synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}",
                   "--n-boot", "200", "--n-perm", "200"])
RUNS = [name for name, method in METHODS.items() if method.records]   # validate stores no run of its own


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("contract")), max_images=64)


_events: dict[str, list] = {}


def events_of(name: str, engine) -> list:
    """The method's events on its case (run once per module)."""
    if name not in _events:
        method = METHODS[name]
        _events[name] = list(method.run(method.request(**CASES[name][0]), engine))
    return _events[name]


def same_json(a, b) -> bool:
    """Equal as JSON values (tuples are lists; nan equals nan)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                              and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def test_every_method_has_a_contract_case():
    assert set(CASES) == set(RUNS)


@pytest.mark.parametrize("name", RUNS)
def test_done_comes_last_once_and_its_results_are_the_stored_json(name, engine):
    done = done_event(events_of(name, engine))
    text = json.dumps(done.results)                      # plain JSON: no numpy scalars, no sets
    assert same_json(json.loads(text), done.results)
    record = engine.store.get_run(done.run_id)
    assert record["method"] == name and record["status"] == "done"
    assert same_json(record["results"], done.results)
    assert HOSTILE in text                                # the hostile string reached the results


@pytest.mark.parametrize("name", RUNS)
def test_cli_json_is_the_stored_run_record(name, engine, capsys):
    argv = CASES[name][1]
    if METHODS[name].cli is None:
        pytest.skip(f"{name} has no command")
    assert argv is not None, f"give the command-line options of {name}'s case"
    assert main([METHODS[name].cli, "--preset", "synthetic", "--data-dir", str(engine.store.data_dir), "--json",
                 "--quiet", *argv]) == 0
    printed = json.loads(capsys.readouterr().out)
    record = engine.store.get_run(printed["run_id"])
    assert record["method"] == name
    assert same_json(printed, {"run_id": record["id"], **record["results"]})


@pytest.mark.parametrize("name", RUNS)
def test_hostile_strings_render_escaped_in_the_methods_page(name, engine):
    html = str(importlib.import_module(METHODS[name].page).page(done_event(events_of(name, engine)).results))
    assert html.strip()
    assert HOSTILE not in html and "onerror=alert(1)>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html     # shown, as text


# -- answers beside their class probabilities (issue 35) ---------------------------------------------
ASKS = {"single_prompt", "counterfactuals", "intersectional", "mitigate", "compare_models", "check"}   # rows asking the VQA


def per_image_answers(results) -> list[tuple[dict, dict]]:
    """Every image's (axis -> answer, axis -> class -> p) found anywhere in `results`: beside each
    `answers` (image key -> axis -> answer, or one image's axis -> answer) its `answer_probs`."""
    found = []
    if isinstance(results, dict):
        answers = results.get("answers")
        if isinstance(answers, dict) and answers:
            assert "answer_probs" in results, f"answers without answer_probs beside them: {list(results)}"
            probs = results["answer_probs"]
            if all(isinstance(v, str) for v in answers.values()):
                found.append((answers, probs))
            else:
                assert set(probs) == set(answers)
                found += [(answers[key], probs[key]) for key in answers]
        for value in results.values():
            found += per_image_answers(value)
    elif isinstance(results, list):
        for value in results:
            found += per_image_answers(value)
    return found


@pytest.mark.parametrize("name", RUNS)
def test_every_asked_answer_has_its_class_probabilities_beside_it(name, engine):
    images = per_image_answers(done_event(events_of(name, engine)).results)
    assert bool(images) == (name in ASKS), f"{name}: per-image answers {'missing' if name in ASKS else 'unexpected'}"
    scored = 0
    for answers, probs in images:
        assert set(probs) <= set(answers)
        for axis, p in probs.items():       # the synthetic evaluator scores every question asked with classes
            scored += 1
            assert math.isclose(sum(p.values()), 1.0, abs_tol=1e-6)
            best = max(p, key=p.get)
            # the answer is the most probable class, or "can't tell" where that class is below the threshold
            assert answers[axis] == (best if p[best] >= engine.cant_tell_below else CANT_TELL), (name, axis, p)
    if name in ASKS - {"counterfactuals"}:   # Counterfactuals asks free questions: no classes to score
        assert scored, f"{name}: no answer carries class probabilities"


# -- rows: check, estimate, tab or command; budgets read the row's estimate --------------------------
VISITOR = access.Visitor("session:contract", address="10.0.0.9")
HOURLY = {"hourly_images": 10**6, "hourly_images_total": 10**7, "hourly_llm_calls": 10**6,
          "hourly_llm_calls_total": 10**7}


def visitor_engine(tmp_path, images: int) -> Engine:
    """A public GapLens whose one request may generate `images`; it offers the synthetic world
    under a second name, so a visitor can compare two generators."""
    return Engine("synthetic", data_dir=str(tmp_path / "public"), public=True, max_images=64,
                  budget=Budget(images=images, **HOURLY),
                  public_generators=f"world-copy=synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}")


def visitor_case(name: str) -> dict:
    """The contract case as a visitor may send it (generators they are offered)."""
    if name == "check":
        return {**CASES[name][0], "base": "synthetic", "candidate": "world-copy"}
    return {**CASES[name][0], "generators": ["synthetic", "world-copy"]} if name == "compare_models" else CASES[name][0]


def test_every_row_has_a_check_an_estimate_and_a_tab_or_a_command():
    for name, method in METHODS.items():
        assert callable(method.check) and callable(method.estimate), name
        assert method.tab is None or method.tab in tabs.BUILDERS, f"{name}: tabs.BUILDERS has no tab '{method.tab}'"
        assert method.tab or method.cli, f"{name}: neither a tab nor a command"


def test_validate_has_a_row_that_checks_its_run_and_spends_nothing(engine):
    row = METHODS["validate"]
    with pytest.raises(InputError, match="no run 'no-such-run'"):
        row.check(row.request("no-such-run"), engine)
    assert row.estimate(row.request("no-such-run")) == Estimate(0)
    args = build_parser().parse_args(["validate", "some-run", "--seed", "3"])
    assert args.make_request(args) == row.request("some-run", seed=3) and args.method is row.run


@pytest.mark.parametrize("name", RUNS)
def test_a_public_request_is_bounded_by_its_rows_estimate(name, tmp_path):
    request = METHODS[name].request(**visitor_case(name))
    cost = METHODS[name].estimate(request)
    assert cost.images >= 1
    engine = visitor_engine(tmp_path, cost.images - 1)
    with access.acting_as(VISITOR), pytest.raises(OverBudgetError, match=rf"can generate up to {cost.images}\)"):
        next(METHODS[name].run(request, engine))
    assert engine.store.count("runs") == 0


def test_an_estimate_fills_in_its_requests_own_defaults():
    # Mine: T defaults to mine.DEFAULT_ITERATIONS = 5, b = 12, N = 16, s = 3, 3 re-asks of repeats: T·b·N
    # images and, every question asked at most 3 times, 3·(T·b + (1 + 3)·(T + s·(T − 1))) LLM calls
    assert mine.DEFAULT_ITERATIONS == 5
    assert METHODS["mine"].estimate(mine.MineRequest()) == Estimate(960, 3 * (60 + 4 * (5 + 12)), generations=5)
    # Compare models: the audit's own default N (16 per set), 1 + 4 sets per model, two models
    axes = {"gender": ["a male doctor", "a female doctor"], "age": ["a young doctor", "an old doctor"]}
    request = compare_models.CompareModelsRequest("counterfactuals", ["a", "b"], {"prompt": "a doctor", "axes": axes})
    assert counterfactuals.CounterfactualsRequest("a doctor").n == 16
    assert METHODS["compare_models"].estimate(request) == Estimate(2 * 16 * 5)


@dataclass
class ToyRequest:
    prompt: str = field(default="a photo of a cat", metadata={"help": "the prompt"})
    n: int = field(default=3, metadata={"flag": "-n", "help": "images it pretends to make"})


def toy_check(request: ToyRequest, engine: Engine) -> None:
    engine.check_prompt(request.prompt)


def toy_estimate(request: ToyRequest, until_cap=None, proposed=None) -> Estimate:
    return Estimate(7 * request.n, 2)


@recorded("toy", toy_check, toy_estimate)
def toy_run(request: ToyRequest, engine: Engine, run_record):
    """A method only this test knows."""
    yield run_record.finish({"n": request.n})


def toy_tab(engine) -> list:
    gr.Markdown("the toy tab", elem_id="toy-tab")
    return []


def test_a_new_row_is_budgeted_by_its_estimate_and_gets_a_command_and_a_tab(monkeypatch, tmp_path):
    import app

    toy = Method("toy", "Toy method", ToyRequest, toy_run, lambda record: ("", None), cli="toy", tab="toy")
    monkeypatch.setitem(METHODS, "toy", toy)
    monkeypatch.setitem(tabs.BUILDERS, "toy", toy_tab)
    assert toy.check is toy_check and toy.estimate is toy_estimate
    # its command: options from the request's fields
    args = build_parser().parse_args(["toy", "-n", "5", "--prompt", "a photo of a dog"])
    assert args.make_request(args) == ToyRequest("a photo of a dog", 5) and args.method is toy_run
    # its budget: 7·N images, 2 LLM calls, whatever its name
    engine = visitor_engine(tmp_path, images=20)
    with access.acting_as(VISITOR):
        with pytest.raises(OverBudgetError, match=r"can generate up to 21\)"):
            next(toy_run(ToyRequest(n=3), engine))
        done_event(toy_run(ToyRequest(n=2), engine))
    with engine.store.ledger() as ledger:
        assert sum(row[1] for row in ledger.charges(0, visitor=VISITOR.id)) == 14
    # its tab, titled by the row, after the methods before it
    demo = app.build_app(Engine("synthetic", data_dir=str(tmp_path / "local")))
    titles = [b.label for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    last = [m.title for m in METHODS.values() if m.tab and m.name != "toy"][-1]   # the last row's tab before it
    assert titles[titles.index(last) + 1:] == ["Toy method", "Runs"]
    assert any(getattr(b, "elem_id", None) == "toy-tab" for b in demo.blocks.values())
