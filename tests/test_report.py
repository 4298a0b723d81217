"""The reporting layer's pieces: number filters, page lookup, escaping by construction."""
import math

import pytest
from markupsafe import Markup

from engine import report
from engine.report import charts, clip, fmt, fmt_ci, generic, mitigate, page_for, render, signed


@pytest.mark.parametrize("value, digits, text", [
    (0.12345, 3, "0.123"), (-0.0004, 3, "0.000"), (-0.0, 2, "0.00"), (-1e-12, 4, "0.0000"), (-0.0006, 3, "-0.001"),
    (None, 3, "n/a"), (math.nan, 3, "n/a"), (2, 2, "2.00"), ("12", 3, "12")])
def test_fmt_never_prints_a_negative_zero(value, digits, text):
    assert fmt(value, digits) == text


def test_fmt_ci_signed_and_clip():
    assert fmt_ci(-0.0001, (-0.0002, 0.5)) == "0.000 [0.000, 0.500]"
    assert fmt_ci(0.5, None) == "0.500 [n/a, n/a]"
    assert [signed(v, 2) for v in (0.123, -0.05, -0.001, 0.0, None)] == ["+0.12", "-0.05", "0.00", "0.00", "n/a"]
    assert clip("abcdef", 4) == "abc…" and clip("abcdef", 4, keep="end") == "…def" and clip("abc", 4) == "abc"
    assert clip(None) == ""


def test_templates_use_the_filters_and_escape():
    env = report.environment()
    out = env.from_string("{{ x|fmt }} {{ x|fmt_ci((x, 1)) }} {{ s|clip(5) }} {{ s }}").render(x=-0.0001, s="<b>'hi'</b>")
    assert out == "0.000 0.000 [0.000, 1.000] &lt;b&gt;&#39;… &lt;b&gt;&#39;hi&#39;&lt;/b&gt;"
    assert render("note.html", text="<script>") == Markup('<p class="gl-note">&lt;script&gt;</p>')


def test_page_for_finds_method_pages_and_guesses_no_module_names():
    assert page_for("mitigate") is mitigate.page
    for name in ("some_new_method", "os", "../../x", "report.runs", "__init__", ""):
        assert page_for(name) is generic.page


def test_chart_labels_are_escaped_and_attributes_quoted():
    svg = charts.bar_chart(['a"b<c'], [0.5], title="t'x", chart_id='id" onload="x')
    assert 'data-chart="id&#34; onload=&#34;x"' in svg and "a\\&#34;b&lt;c" in svg and "t&#39;x" in svg
    assert "<c" not in svg
