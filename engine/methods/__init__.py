"""Methods: each module is one method, `run(request, engine)` a generator of events (`axes` and
`cfsets` hold what several methods share).

`METHODS` is the one place that maps a method's name (as stored in its runs) to what every
client needs: the request dataclass, the run function with its request check and its
estimate (what a request can spend: public budgets bound and charge it, Engine.admit), its
scores and headline for the Runs tab, comparison and export, the page that shows its results
(a module name, so methods never import the reporting layer; `engine.report.page_for` reads
it), its command line (`python -m engine <cli>`, options built from the request's fields by
`engine/cli/`) and its tab (an id: tabs/ maps it to the tab's builder, so the engine never
imports gradio; app.py builds the tabs in this table's order).

Workflows beside the methods that store no run of their own (`records=False`: validate) have
rows too: their request, run, check, estimate and command. The BiasBench tool cannot: it lives in
engine.tools, which imports the methods (the no-cycles contract).

Adding a method: one module here, one page `engine/report/<name>.py`, one row below and one
tab (docs/writing-a-method.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from ..common.scores import Score
from ..hosting.limits import Estimate
from . import (check, compare_models, counterfactuals, explore, generate, intersectional, languages, mine,
               mitigate, single_prompt, validate)


@dataclass(frozen=True)
class Method:
    """One row of METHODS.

    name: the method's name in its runs (`@recorded(name)`) and its page module's name.
    title: how the app and the reports title it.
    request: the request dataclass; its fields with `metadata["help"]` are CLI options.
    run: `run(request, engine)`, a generator of events ending in one `Done`.
    headline: `headline(run_record) -> (text, value)`, the Runs table's line and sort value.
    scores: `scores(results, summary) -> list[Score]`; None: every number is flattened
        (engine.runs.history.flatten_scores).
    cli: the command name (`python -m engine <cli>`, module engine/cli/<name>.py); None: none.
    page: the module whose `page(results) -> Markup` shows the results.
    tab: the id of its tab in the app (`tabs.BUILDERS` maps it to the builder); None: none.
    check: `check(request, engine)`, InputError for a request that cannot run; estimate:
        `estimate(request, until_cap=None, proposed=None) -> limits.Estimate`, the most images
        and LLM calls it can spend. None: the run's (`@recorded(name, check, estimate)`).
    records: whether a run stores a run record under `name` (False: a workflow beside the
        methods, with no headline, page or tab).
    """

    name: str
    title: str
    request: type
    run: Callable[..., Iterator]
    headline: Callable[[dict], tuple[str, float | None]] | None = None
    scores: Callable[[dict, dict], list[Score]] | None = None
    cli: str | None = None
    page: str = ""
    tab: str | None = None
    check: Callable | None = None
    estimate: Callable[..., Estimate] | None = None
    records: bool = True

    def __post_init__(self):
        if not self.page and self.records:
            object.__setattr__(self, "page", f"engine.report.{self.name}")
        for name in ("check", "estimate"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(self.run, name))


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("single_prompt", "Single Prompt", single_prompt.SinglePromptRequest, single_prompt.run,
           single_prompt.headline, single_prompt.scores, cli="single-prompt", tab="single"),
    Method("generate", "Generate", generate.GenerateRequest, generate.run, generate.headline, generate.scores,
           cli="generate"),
    Method("counterfactuals", "Counterfactuals", counterfactuals.CounterfactualsRequest, counterfactuals.run,
           counterfactuals.headline, counterfactuals.scores, cli="counterfactuals", tab="counterfactuals"),
    Method("intersectional", "Intersectional Matrix", intersectional.IntersectionalRequest, intersectional.run,
           intersectional.headline, cli="intersectional", tab="intersectional"),
    Method("mine", "Mine Prompts", mine.MineRequest, mine.run, mine.headline, cli="mine", tab="mine"),
    Method("mitigate", "Mitigate", mitigate.MitigateRequest, mitigate.run, mitigate.headline, cli="mitigate",
           tab="mitigate"),
    Method("explore", "Explore", explore.ExploreRequest, explore.run, explore.headline, explore.scores, cli="explore",
           tab="explore"),
    # no command of its own: `--generators A B` on the audits' commands (engine/cli/compare.py)
    Method("compare_models", "Compare models", compare_models.CompareModelsRequest, compare_models.run,
           compare_models.headline, tab="compare-models"),
    # the bias check of a fine-tune against its base (paired by seed): a command, a page, no tab
    Method("check", "Bias check", check.CheckRequest, check.run, check.headline, check.scores, cli="check"),
    Method("languages", "Languages", languages.LanguagesRequest, languages.run, languages.headline,
           languages.scores, cli="languages", tab="languages"),
    Method("validate", "Validate", validate.ValidateRequest, validate.run, cli="validate", check=validate.check,
           estimate=validate.estimate, records=False),
)}
