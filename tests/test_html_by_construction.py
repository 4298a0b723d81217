"""HTML is made by construction: only templates under engine/report/templates hold markup.

Outside engine/report no module builds HTML from an f-string; inside it no Python string holds
markup at all (its modules prepare data; the templates, rendered with autoescape, hold the
tags). A new f-string of HTML anywhere fails here, naming its file and line."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "engine" / "report"
TAG = re.compile(r"<\s*/?\s*(?:div|span|p|td|tr|th|table|thead|tbody|caption|li|ul|ol|svg|text|rect|line|circle|"
                 r"polyline|g|title|h[1-6]|a|img|b|i|em|strong|code|pre|details|summary|iframe|figure|figcaption|"
                 r"section|script|style|sup|sub|br|label|input|select|option|button|textarea|html|head|body|"
                 r"meta|link|footer|small)[\s>/]", re.I)


def sources():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".git", ".venv", "venv", "build") or "site-packages" in rel.parts:
            continue
        yield path, rel


def docstrings(tree) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def markup_strings(path: Path, literal_too: bool) -> list[int]:
    """Line numbers of every f-string (and, with `literal_too`, every plain string that is not a
    docstring) holding an HTML tag."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = docstrings(tree)
    inside_f = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif literal_too and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip and id(node) not in inside_f:
            text = node.value
        else:
            continue
        if TAG.search(text):
            found.append(node.lineno)
    return found


@pytest.mark.slow
def test_no_module_builds_html_from_strings():
    found = []
    for path, rel in sources():
        found += [f"{rel}:{line}" for line in markup_strings(path, literal_too=REPORT in path.parents)]
    assert found == [], "HTML belongs in engine/report/templates: " + ", ".join(found)


def test_the_check_sees_html_in_strings(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""A <b>docstring</b> may name tags."""\nname = "x"\nrow = f"<td class=\'n\'>{name}</td>"\n'
                   'ok = f"{name} <= 3 and 2 < 5"\nplain = "<span>x</span>"\n')
    assert markup_strings(bad, literal_too=False) == [3]
    assert sorted(markup_strings(bad, literal_too=True)) == [3, 5]
