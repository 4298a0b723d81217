"""The app's tabs: widgets plus a few short handlers each. Never imports torch or model libraries.

`BUILDERS` maps a tab's id (a row's `tab` in engine.methods.METHODS, and the tab's id in the
page) to its `build(engine) -> load hooks`; app.py builds one tab per row that names one, in
the table's order, then Runs."""
from . import compare_models, counterfactuals, explore, intersectional, languages, mine, mitigate, runs, single_prompt

BUILDERS = {"single": single_prompt.build, "counterfactuals": counterfactuals.build,
            "intersectional": intersectional.build, "mine": mine.build, "mitigate": mitigate.build,
            "compare-models": compare_models.build, "explore": explore.build, "languages": languages.build,
            "runs": runs.build}
