"""The README's numbers are what its commands print (issue 42.19): each check runs the command a
README sentence describes, in this process, and compares the numbers the sentence gives with what
the command printed, formatted as the README writes them. A failure shows the sentence to write.
A number the README gives without a check here does not belong in it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.models.presets import SYNTHETIC_TABLE

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def said(pattern: str) -> tuple[str, ...]:
    """The groups of the one README passage `pattern` matches (whitespace in it matches any run of
    whitespace, so a sentence may wrap anywhere)."""
    found = re.findall(re.sub(r"(\\ |\s)+", r"\\s+", pattern), README)
    assert len(found) == 1, f"the README should say this once: {pattern}"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


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
    assert said(r'the synthetic world has biases planted on purpose \("doctor" is\s+drawn (\d+)% male\)') == (
        f"{planted:.0%}".rstrip("%"),)
    shown = {}
    for n in (16, 64):
        gender = command_json(capsys, "single-prompt", "--preset", "synthetic", "--data-dir", str(tmp_path / str(n)),
                              "--prompt", "a photo of a doctor", "-n", str(n))["axes"]["gender"]
        male, low_high = gender["counts"]["male"], gender["share_ci"]["male"]
        shown[n] = (num(male / n, 2), interval(*low_high, digits=2), str(male))
    written = said(r"the gender bar reads (\S+) male (\[\S+, \S+\]) \((\d+) of 16;")
    assert written == shown[16], f"write: the gender bar reads {shown[16][0]} male {shown[16][1]} ({shown[16][2]} of 16;"
    written = said(r"at N = 64 it reads (\S+) (\[\S+, \S+\]) \((\d+) of 64\)")
    assert written == shown[64], f"write: at N = 64 it reads {shown[64][0]} {shown[64][1]} ({shown[64][2]} of 64)"


@pytest.fixture
def flipped_world(tmp_path) -> str:
    """The README's second world: doctors 20% male, their gender-by-age rules removed."""
    table = json.loads(Path(SYNTHETIC_TABLE).read_text())
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.2, "female": 0.8}
    table["rules"] = [r for r in table["rules"] if not (r["subject"] == "doctor" and "gender" in r["then"])]
    path = tmp_path / "flipped_world.json"
    path.write_text(json.dumps(table))
    return str(path)


def test_compare_models_intervals_are_what_the_command_prints(tmp_path, capsys, flipped_world):
    out = command_json(capsys, "single-prompt", "--preset", "synthetic", "--data-dir", str(tmp_path / "store"),
                       "--prompt", "a photo of a doctor", "-n", "48",
                       "--generators", "synthetic", f"synthetic_generator:{flipped_world}")
    male = next(r for r in out["comparison"]["rows"] if r["group"] == "gender" and r["metric"] == "share: male")
    (a, b), d = male["values"], male["differences"][0]
    printed = (num(a["value"]), interval(a["low"], a["high"]), num(b["value"]), interval(b["low"], b["high"]),
               num(d["value"]), interval(d["low"], d["high"]))
    written = said(r"gives male shares (\S+) (\[\S+, \S+\]) vs (\S+) (\[\S+, \S+\]) at N = 48 \(seeds 0–47\), a "
                   r"difference of (\S+) (\[\S+, \S+\])")
    assert written == printed, ("write: gives male shares {} {} vs {} {} at N = 48 (seeds 0–47), a difference of {} {}"
                                .format(*printed))
