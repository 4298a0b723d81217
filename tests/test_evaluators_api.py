"""Issue 43 item 4 (the same defect as issue 42 item 1): two other evaluators through the API of a public
GapLens gave a blank error (jinja2's UndefinedError on 'agreement_matrix'). The labels a visitor is
offered, 'synthetic_vqa:synthetic_world.json' and 'synthetic_colour_vqa:synthetic_world.json', beside the
run's evaluator: the first is the run's own, asked once (it was a second rater agreeing with itself), so
the page the API returns and the run compare two, with Cohen's κ undefined and saying why."""
import pytest

from apphelpers import running_app
from engine.common import access
from engine.core.engine import Engine

pytestmark = pytest.mark.slow

EVALUATORS = "synthetic_vqa:synthetic_world.json,synthetic_colour_vqa:synthetic_world.json"


@pytest.mark.parametrize("public", [True, False], ids=["public", "local"])
def test_two_other_evaluators_through_the_api(data_dir, public):
    from gradio_client import Client

    engine = Engine("synthetic", data_dir=data_dir, public=public)
    with running_app(engine) as url:
        client = Client(url, verbose=False)
        out = client.predict(prompt="a photo of a doctor", n=8, axes=["gender", "age"], evaluators=EVALUATORS,
                             api_name="/single_prompt")
    page = out[2]                                                   # the "axes" output: distributions, comparison
    assert "Evaluator comparison: synthetic_vqa:synthetic_world.json vs synthetic_colour_vqa:synthetic_world.json" \
        in page
    assert page.count("Cohen's κ over the 0 image(s) both answered") == 2
    with access.acting_as(access.HOST):                            # the visitor's run, read as the host
        run = engine.store.list_runs("single_prompt")[0]
        compared = engine.store.get_run(run["id"])["results"]["evaluators"]["axes"]["gender"]
    assert run["status"] == "done"
    assert compared["kappa_method"] == "Cohen" and compared["evaluators"] == [
        "synthetic_vqa:synthetic_world.json", "synthetic_colour_vqa:synthetic_world.json"]
    # the colour world's evaluator answers no gender: κ is undefined and says why
    assert compared["kappa"] is None and compared["kappa_undefined"] == "no image answered by both"
    assert compared["answered"]["synthetic_colour_vqa:synthetic_world.json"] == 0
