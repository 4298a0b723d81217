"""An LLM-using request's worst case is its real maximum, checked before anything is spent (issue 42,
item 13): per METHODS row, a counting fake LLM answers every JSON question unusably until its last
allowed attempt (the most calls a question can make), and the request makes no more calls than its
row's estimate; a visitor whose hour holds one call less is refused before the first call, and one
whose hour holds exactly the estimate finishes. Propose (TIBET's three turns and the JSON turn's
re-asks) is checked whole before its first call."""
import json
import os

import pytest

from engine.backends.llm_json import JSON_ATTEMPTS, RETRY_MESSAGE
from engine.common import access
from engine.common.errors import OverBudgetError
from engine.core.engine import Engine
from engine.hosting.limits import Budget
from engine.methods import METHODS, cfsets
from engine.models.presets import SYNTHETIC_TABLE
from runhelpers import done_event

PROMPT = "a photo of a doctor"
# emotion with two of assets/axes.json's three values: no known question, the LLM is asked for one
EMOTION = {"emotion": ["a photo of a happy doctor", "a photo of a sad doctor"],
           "gender": ["a photo of a male doctor", "a photo of a female doctor"]}
# row -> cases (request fields); every row of METHODS has one, the LLM-using ones their worst paths
CASES = {
    "single_prompt": [{"prompt": PROMPT, "n": 2, "n_boot": 100}],
    "generate": [{"prompt": PROMPT, "n": 2}],
    "counterfactuals": [{"prompt": PROMPT, "n": 2, "n_boot": 0}],                     # the LLM proposes the axes
    "intersectional": [{"prompt": PROMPT, "n": 2, "n_boot": 0},                       # proposal, then questions
                       {"prompt": PROMPT, "n": 2, "n_boot": 0, "axes": EMOTION}],
    "mitigate": [{"prompt": PROMPT, "n": 2, "n_boot": 0, "select": ["gender", "emotion"], "quality": False}],
    "mine": [{"iterations": 2, "population": 3, "select": 1, "mutations": 1, "n": 2}],
    "explore": [{"prompt": PROMPT, "n": 2, "concepts": ["a photo of a man", "a photo of a woman"],
                 "inverse": ["smiling"], "m": 1}],
    "compare_models": [{"method": "counterfactuals", "generators": ["synthetic", "world-copy"],   # a second name
                        "request": {"prompt": PROMPT, "n": 2, "n_boot": 0}}],                    # of the world
    "validate": [None],   # a stored run's id, made first
    "check": [{"base": "synthetic", "candidate": "synthetic_generator:doctor-male-95", "prompts": [PROMPT], "n": 2, "axes": ["gender"],
               "n_boot": 100, "n_perm": 100}],                                            # no LLM at all
    "languages": [{"prompt": PROMPT, "languages": ["en", "de", "fr"], "n": 2, "axes": ["gender"], "n_boot": 100}],
}
CALLS = [(name, i) for name, cases in CASES.items() for i in range(len(cases))]
RETRY = RETRY_MESSAGE.split("{reason}")[0]


def test_every_row_has_a_case():
    assert set(CASES) == set(METHODS)


class WorstCaseLLM:
    """The synthetic LLM behind a counter: every question (a conversation, its re-asks counted with it)
    gets an unusable reply until its JSON_ATTEMPTS-th call, then the synthetic world's answer to it."""

    def __init__(self, engine, monkeypatch):
        llm = engine.models.get(engine.preset.llm)
        self.original, self.calls, self.asked = llm.chat, 0, {}
        monkeypatch.setattr(llm, "chat", self.chat)

    def chat(self, messages, **kw):
        self.calls += 1
        retried = messages[-1]["role"] == "user" and messages[-1]["content"].startswith(RETRY)
        question = messages[:-2] if retried else messages
        key = json.dumps(question)
        self.asked[key] = self.asked.get(key, 0) + 1
        return self.original(question, **kw) if self.asked[key] >= JSON_ATTEMPTS else "Sorry, no JSON today."


def make_engine(path, monkeypatch, hourly_llm_calls: int | None = None) -> tuple[Engine, WorstCaseLLM]:
    public = hourly_llm_calls is not None
    budget = Budget(images=64, hourly_images=10**6, hourly_images_total=10**7, hourly_llm_calls=hourly_llm_calls,
                    hourly_llm_calls_total=10**7, ga_generations=100, mitigation_steps=100) if public else None
    engine = Engine("synthetic", data_dir=str(path), max_images=64, public=public, budget=budget,
                    public_generators=f"world-copy=synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}")
    return engine, WorstCaseLLM(engine, monkeypatch)


def request_of(name: str, i: int, engine: Engine):
    fields = CASES[name][i]
    if name == "validate":   # its run: made by the host
        made = METHODS["single_prompt"].request(prompt=PROMPT, n=2, n_boot=100, gap=False)
        with access.acting_as(access.HOST):
            fields = {"run": done_event(METHODS["single_prompt"].run(made, engine)).run_id}
    if name == "compare_models" and not engine.public:   # the host names the world's copy itself
        fields = {**fields, "generators": ["synthetic", f"synthetic_generator:{os.path.relpath(SYNTHETIC_TABLE)}"]}
    return METHODS[name].request(**fields)


def worst_case(name: str, request, engine: Engine) -> int:
    """The row's estimate as admission reads it for a visitor (Engine.admit)."""
    return METHODS[name].estimate(request, until_cap=engine.max_set_images(), proposed=engine.budget.images
                                  if engine.public else None).llm_calls


@pytest.mark.parametrize("name,i", CALLS)
def test_no_request_makes_more_llm_calls_than_its_rows_estimate(name, i, tmp_path, monkeypatch):
    engine, llm = make_engine(tmp_path, monkeypatch)
    request = request_of(name, i, engine)
    llm.calls = 0
    done_event(METHODS[name].run(request, engine))
    estimate = worst_case(name, request, engine)
    assert llm.calls <= estimate, f"{name}: {llm.calls} LLM calls, estimated at most {estimate}"
    if name in ("counterfactuals", "intersectional", "mitigate", "compare_models") and "axes" not in CASES[name][i]:
        assert llm.calls >= cfsets.PROPOSE_CALLS   # the proposal's worst case was reached, and counted


@pytest.mark.parametrize("name,i", [(n, i) for n, i in CALLS if n not in ("generate", "explore", "validate", "check")])
def test_a_visitor_is_refused_before_the_first_call_unless_the_worst_case_fits(name, i, tmp_path, monkeypatch):
    visitor = access.Visitor("session:llm", address="10.0.0.7")
    for room in ("short", "exact"):
        engine, llm = make_engine(tmp_path / room, monkeypatch, hourly_llm_calls=10**6)
        with access.acting_as(visitor):
            request = request_of(name, i, engine)
            estimate = worst_case(name, request, engine)
            engine.budget.hourly_llm_calls = estimate - 1 if room == "short" else estimate
            llm.calls = 0
            if room == "short":
                with pytest.raises(OverBudgetError, match=f"each visitor may make {estimate - 1} LLM calls per hour; "
                                                          f"{estimate - 1} are left this hour and this request "
                                                          f"needs up to {estimate}"):
                    next(METHODS[name].run(request, engine))
                assert llm.calls == 0 and engine.store.count_runs() == 0
            else:
                done_event(METHODS[name].run(request, engine))   # never over budget half way
                assert 0 < llm.calls <= estimate


def test_propose_checks_its_whole_worst_case_before_its_first_call(tmp_path, monkeypatch):
    """The Propose button (engine.methods.cfsets.propose_for): with fewer calls left than TIBET's turns and
    the JSON turn's re-asks can make, refused before any call; with that many, it ends within them."""
    engine, llm = make_engine(tmp_path, monkeypatch, hourly_llm_calls=cfsets.PROPOSE_CALLS - 1)
    visitor = access.Visitor("session:propose", address="10.0.0.8")
    with access.acting_as(visitor):
        with pytest.raises(OverBudgetError, match=f"this request needs up to {cfsets.PROPOSE_CALLS}"):
            cfsets.propose_for(engine, PROMPT, [])
        assert llm.calls == 0
        engine.budget.hourly_llm_calls = cfsets.PROPOSE_CALLS
        axes, _ = cfsets.propose_for(engine, PROMPT, [])
    assert axes and llm.calls == cfsets.PROPOSE_CALLS == 2 + JSON_ATTEMPTS
