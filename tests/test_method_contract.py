"""The contract every method in METHODS keeps, on the synthetic world with small N: its events end
in exactly one Done; its results survive a JSON round trip and equal the stored run record's;
the CLI's --json prints the stored record's results (plus run_id); its page escapes hostile
strings. A new method gets these checks by adding its row to METHODS and a case below."""
import importlib
import json
import math
import os

import pytest

from engine.cli import main
from engine.core.engine import Engine
from engine.methods import METHODS
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
    # two generators: the preset's, and the same world named by a relative path (another spec)
    "compare_models": ({"method": "single_prompt",
                        "generators": ["synthetic", f"synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}"],
                        "request": {"prompt": PROMPT, "n": 4, "n_boot": 100}}, []),
}


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
    assert set(CASES) == set(METHODS)


@pytest.mark.parametrize("name", list(METHODS))
def test_done_comes_last_once_and_its_results_are_the_stored_json(name, engine):
    done = done_event(events_of(name, engine))
    text = json.dumps(done.results)                      # plain JSON: no numpy scalars, no sets
    assert same_json(json.loads(text), done.results)
    record = engine.store.get_run(done.run_id)
    assert record["method"] == name and record["status"] == "done"
    assert same_json(record["results"], done.results)
    assert HOSTILE in text                                # the hostile string reached the results


@pytest.mark.parametrize("name", list(METHODS))
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


@pytest.mark.parametrize("name", list(METHODS))
def test_hostile_strings_render_escaped_in_the_methods_page(name, engine):
    html = str(importlib.import_module(METHODS[name].page).page(done_event(events_of(name, engine)).results))
    assert html.strip()
    assert HOSTILE not in html and "onerror=alert(1)>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html     # shown, as text
