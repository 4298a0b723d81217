"""The README's numbers are what its commands print (issue 42.19): each check runs the command a
README sentence describes, in this process, and compares the numbers the sentence gives with what
the command printed, formatted as the README writes them. A failure shows the sentence to write.
Every measured share, interval and p-value the README gives is checked here (the planted values
they are compared with are the world table's, timings are bench/'s); one without a check does not
belong in the README."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.models.presets import SYNTHETIC_TABLE
from test_compare_models import flipped_world  # noqa: F401 - the README's second world (a fixture)
from test_intersectional import pilot_engine  # noqa: F401 - the README's pilot world (a fixture)

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def said(pattern: str) -> tuple[str, ...]:
    """The groups of the one README passage `pattern` matches (whitespace in it matches any run of
    whitespace, so a sentence may wrap anywhere)."""
    found = re.findall(re.sub(r"(\\ |\s)+", r"\\s+", pattern), README)
    assert len(found) == 1, f"the README should say this once: {pattern}"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def agrees(pattern: str, printed: tuple, sentence: str) -> None:
    """The README passage `pattern` matches gives the numbers `printed`; else the failure says to
    write `sentence` (its {} filled with them)."""
    assert said(pattern) == tuple(printed), "write: " + sentence.format(*printed)


def num(x: float, digits: int = 3) -> str:
    """`x` as the README writes it: fixed digits, a real minus sign."""
    return f"{x:.{digits}f}".replace("-", "−")


def interval(low: float, high: float, digits: int = 3) -> str:
    return f"[{num(low, digits)}, {num(high, digits)}]"


def command_json(capsys, *args) -> dict:
    """What `python -m engine ARGS --json` prints on stdout, run in this process."""
    from engine.__main__ import main

    capsys.readouterr()
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_quick_starts_doctor_share_is_what_single_prompt_prints_and_the_world_plants(tmp_path, capsys):
    world = json.loads(Path(SYNTHETIC_TABLE).read_text())
    planted = world["subjects"]["doctor"]["dist"]["gender"]["male"]
    agrees(r'the synthetic world has biases planted on purpose \("doctor" is\s+drawn (\d+)% male\)',
           (f"{planted:.0%}".rstrip("%"),), '("doctor" is drawn {}% male)')
    shown = {}
    for n in (16, 64):
        gender = command_json(capsys, "single-prompt", "--preset", "synthetic", "--data-dir", str(tmp_path / str(n)),
                              "--prompt", "a photo of a doctor", "-n", str(n))["axes"]["gender"]
        male, low_high = gender["counts"]["male"], gender["share_ci"]["male"]
        shown[n] = (num(male / n, 2), interval(*low_high, digits=2), str(male))
    agrees(r"the gender bar reads (\S+) male (\[\S+, \S+\]) \((\d+) of 16;", shown[16],
           "the gender bar reads {} male {} ({} of 16;")
    agrees(r"at N = 64 it reads (\S+) (\[\S+, \S+\]) \((\d+) of 64\)", shown[64], "at N = 64 it reads {} {} ({} of 64)")


def test_compare_models_intervals_are_what_the_command_prints(tmp_path, capsys, flipped_world):
    out = command_json(capsys, "single-prompt", "--preset", "synthetic", "--data-dir", str(tmp_path / "store"),
                       "--prompt", "a photo of a doctor", "-n", "48",
                       "--generators", "synthetic", f"synthetic_generator:{flipped_world}")
    male = next(r for r in out["comparison"]["rows"] if r["group"] == "gender" and r["metric"] == "share: male")
    (a, b), d = male["values"], male["differences"][0]
    printed = (num(a["value"]), interval(a["low"], a["high"]), num(b["value"]), interval(b["low"], b["high"]),
               num(d["value"]), interval(d["low"], d["high"]), interval(*d["unpaired"]))
    assert d["paired"]   # both sets ran on seeds 0-47
    agrees(r"gives male shares (\S+) (\[\S+, \S+\]) vs (\S+) (\[\S+, \S+\]) at N = 48 \(seeds 0–47\), a "
           r"difference of (\S+) (\[\S+, \S+\]) paired by seed \(unpaired (\[\S+, \S+\])\)", printed,
           "gives male shares {} {} vs {} {} at N = 48 (seeds 0–47), a difference of {} {} paired by seed "
           "(unpaired {})")


def test_explores_leans_and_inverse_queries_are_what_the_command_prints(tmp_path, capsys):
    man, woman = "a photo of a man", "a photo of a woman"

    def explore(*args) -> dict:
        return command_json(capsys, "explore", "--preset", "synthetic", "--data-dir", str(tmp_path), "--quiet",
                            "--concepts", man, woman, *args)

    def lean(lean: dict) -> str:
        return f"{num(lean['share'], 2)} {interval(*lean['ci'], digits=2)}"

    doctor, firefighter, nurse = (explore("--prompt", f"a photo of a {job}", "-n", "48")["lean"]
                                  for job in ("doctor", "firefighter", "nurse"))
    inverse = explore("--prompt", "a photo of a doctor", "-n", "4", "--inverse", "an old doctor", "a young doctor",
                      "-m", "48")["inverse"]
    printed = (lean(doctor[man]), lean(firefighter[man]), lean(nurse[woman]), lean(inverse["an old doctor"][man]),
               lean(inverse["a young doctor"][man]))
    agrees(r'doctor leans "a man" (\S+ \[\S+, \S+\]) \(planted 0.8\), firefighter (\S+ \[\S+, \S+\]) \(0.9\), '
           r'nurse leans "a woman" (\S+ \[\S+, \S+\]) \(0.9\); inverse queries with m = 48: "an old doctor" '
           r'(\S+ \[\S+, \S+\]) male vs "a young doctor" (\S+ \[\S+, \S+\])', printed,
           'doctor leans "a man" {} (planted 0.8), firefighter {} (0.9), nurse leans "a woman" {} (0.9); inverse '
           'queries with m = 48: "an old doctor" {} male vs "a young doctor" {}')


@pytest.mark.slow
def test_the_intersectional_pilot_and_librarian_numbers_are_what_the_method_gives(tmp_path, pilot_engine):
    from engine.core.engine import Engine
    from engine.methods import intersectional as ic
    from runhelpers import done_event

    engine = pilot_engine
    axes = {"gender": ["a photo of a male pilot", "a photo of a female pilot"],
            "age": ["a photo of a young pilot", "a photo of a middle-aged pilot", "a photo of an old pilot"],
            "emotion": ["a photo of a pilot who is happy", "a photo of a pilot who is serious",
                        "a photo of a pilot who is sad"]}
    r = done_event(ic.run(ic.IntersectionalRequest("a photo of a pilot", axes=axes, n=96, n_boot=200), engine)).results
    s = r["sensitivity"]
    i, j = s["axes"].index("age"), s["axes"].index("gender")
    printed = (num(s["matrix"][i][j], 2), interval(s["ci_low"][i][j], s["ci_high"][i][j], digits=2),
               f"{r['p_values']['age']['gender']:.0e}".replace("e-0", "e-"))
    agrees(r"N = 96\s+gives IS\(age → gender\) = (\S+) (\[\S+, \S+\]) \(exact: −0.40\), its edge kept at p = (\S+),",
           printed, "gives IS(age → gender) = {} {} (exact: −0.40), its edge kept at p = {},")
    librarian = Engine("synthetic", data_dir=str(tmp_path / "librarian"))
    axes = {"clothing": ["a photo of a librarian in formal attire", "a photo of a librarian in informal attire"],
            "age": ["a photo of a young librarian", "a photo of a middle-aged librarian", "a photo of an old librarian"]}
    r = done_event(ic.run(ic.IntersectionalRequest("a photo of a librarian", axes=axes, n=48, n_boot=0),
                          librarian)).results
    p = r["p_values"]["clothing"]["age"]
    assert ("clothing", "age") in {(e["source"], e["target"]) for e in r["kept_edges"]}
    agrees(r"\(edge kept,\s+p ≈ (\S+) at N = 48\)", (f"{p:.0e}".replace("e-0", "e-"),), "(edge kept, p ≈ {} at N = 48)")


def test_mitigates_doctor_numbers_are_what_the_command_prints(tmp_path, capsys):
    axes = json.dumps({"gender": ["a photo of a male doctor", "a photo of a female doctor"],
                       "age": ["a photo of a young doctor", "a photo of a middle-aged doctor", "a photo of an old doctor"]})

    def mitigate(*args) -> dict:
        return command_json(capsys, "mitigate", "--preset", "synthetic", "--data-dir", str(tmp_path), "--quiet",
                            "--prompt", "a photo of a doctor", "--axes", axes, "--seed", "1", *args)

    def percent(x: float) -> str:
        return f"{x:.0%}"

    one = mitigate("-n", "24", "--priorities", "gender=0.7,age=0.3")
    every = mitigate("-n", "24", "--priorities", "gender=0.7,age=0.3", "--strategy", "all")
    (first, last), gender = one["states"], one["report"]["gender"]
    start, final = gender["initial"], gender["final"]
    printed = (num(first["tau"]), interval(*first["tau_ci"]), num(last["tau"]), interval(*last["tau_ci"]),
               one["steps"][0]["axis"], " → ".join(num(s["tau"]) for s in every["states"]),
               "/".join(map(str, final["counts"])), interval(final["low"][0], final["high"][0], digits=2),
               percent(start["shares"][0]), f"[{percent(start['low'][0])}, {percent(start['high'][0])}]")
    agrees(r"priorities gender 0.7, age 0.3\): τ (\S+) (\[\S+, \S+\]) → (\S+) (\[\S+, \S+\]) in one step "
           r"\((\w+)\), while mitigating every axis takes two \(([^)]*)\); the final gender distribution is "
           r"(\S+) \(its 95% interval (\[\S+, \S+\]) holds 0.5\), from (\S+) male (\[\S+, \S+\])", printed,
           "priorities gender 0.7, age 0.3): τ {} {} → {} {} in one step ({}), while mitigating every axis takes two "
           "({}); the final gender distribution is {} (its 95% interval {} holds 0.5), from {} male {}")
    age = mitigate("-n", "20", "--priorities", "gender=0.5,age=0.5", "--epsilon", "0.01",
                   "--target", "age=young:0.3,middle-aged:0.4,old:0.3")["report"]["age"]
    printed = ("/".join(f"{s:.0%}".rstrip("%") for s in age["initial"]["shares"]) + "%",
               "/".join(map(str, age["final"]["counts"])),
               "/".join(f"{s:.0%}".rstrip("%") for s in age["final"]["shares"]) + "%")
    agrees(r"With age 30/40/30 and N = 20,\s+age goes from (\S+) to (\S+) images = (\S+)\.", printed,
           "With age 30/40/30 and N = 20, age goes from {} to {} images = {}.")
