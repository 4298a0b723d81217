"""Text from outside is checked once, where it enters (issue 43, items 3 and 6; STYLE.md §11): one
validator (engine/common/texts.py) for the page and the API, the command line and imports, so the
store never holds a string it cannot encode and what the app stores re-imports; and `runs list` and
the Runs tab survive a store written before, which may hold such strings already."""
import json
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.common.errors import InputError
from engine.common.texts import MAX_TEXT_CHARS, check_texts, readable, text_problem
from engine.core.engine import Engine
from engine.runs import imports
from engine.runs.history import list_runs

ROOT = Path(__file__).resolve().parent.parent
SURROGATE = "a photo of a \ud800 doctor"


def test_one_sentence_names_what_keeps_a_text_out():
    assert text_problem("x" * MAX_TEXT_CHARS) is None and text_problem("a \U0001F600 doctor") is None
    assert text_problem("x" * 1001) == "is 1001 characters long; the maximum is 1000"
    assert "NUL character (at character 2)" in text_problem("a\x00b")
    assert "unpaired surrogate (U+D800, at character 14)" in text_problem(SURROGATE)
    with pytest.raises(InputError, match=r"^axes\.gender holds an unpaired surrogate \(U\+DCFF"):
        check_texts({"gender": ["a man", "a \udcff"]}, "axes")
    with pytest.raises(InputError, match="nests more than 16 levels deep"):
        check_texts(json.loads("[" * 40 + "]" * 40), "request")
    with pytest.raises(InputError, match="has 501 items; at most 500"):
        check_texts(["a"] * 501, "concepts")
    assert readable({"a\ud800": ["b\x00c", "\U0001F600"]}) == {"a\ufffd": ["bc", "\U0001F600"]}


@pytest.mark.parametrize("text", ["a photo", "x" * 1000, "x" * 1001, "a\x00b", SURROGATE, "\udcff", "", "ü 😀"])
def test_imports_refuse_exactly_what_the_app_refuses_to_store(text):
    """One validator: a text of an archive is refused exactly when the app would not have stored it."""
    refused_by_import = False
    try:
        imports.SCHEMAS["run_images"]["label"](text)
    except ValueError:
        refused_by_import = True
    assert refused_by_import == (text_problem(text, 1000) is not None)


def test_a_prompt_with_a_nul_or_a_surrogate_is_refused_before_any_run_exists(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path))
    from engine.methods import METHODS

    sp = METHODS["single_prompt"]
    for prompt, problem in (("a photo\x00 of a doctor", "NUL"), (SURROGATE, "unpaired surrogate")):
        with pytest.raises(InputError, match=f"^prompt holds .*{problem}"):
            list(sp.run(sp.request(prompt=prompt, n=2), engine))
    with pytest.raises(InputError, match=r"^axes holds an unpaired surrogate"):
        list(sp.run(sp.request(prompt="a photo of a doctor", n=2, axes=["gender", "hair \ud800"]), engine))
    assert engine.store.count("runs") == 0 and engine.store.count("images") == 0


def test_what_the_app_stores_re_imports(tmp_path):
    """A run made by the app (hostile but legal texts) exports and imports into another store."""
    from engine.methods import METHODS
    from engine.report.export import export_zip

    engine = Engine("synthetic", data_dir=str(tmp_path / "a"))
    sp = METHODS["single_prompt"]
    done = [e for e in sp.run(sp.request(prompt="a photo of a \u00e9l\u00e8ve \U0001F600 <b>", n=2), engine)][-1]
    export_zip(engine.store, [done.run_id], tmp_path / "run.zip")
    other = Engine("synthetic", data_dir=str(tmp_path / "b"))
    assert imports.import_zip(other.store, tmp_path / "run.zip")["imported"] == [done.run_id]


def _seed_bad_run(data_dir: Path) -> str:
    """A store as an earlier GapLens left it: a failed run whose request holds an unpaired surrogate
    (JSON-escaped, as json.dumps stores it) and a NUL, as a visitor's `extra_axes` once made."""
    from engine.store.store import Store

    store = Store(data_dir)
    run_id = store.create_run("single_prompt", {"prompt": "a photo of a doctor", "axes": ["gender"]},
                              {"generator": "synthetic_generator:synthetic_world.json"}, "0")
    store.update_run(run_id, status="failed", error="UnicodeEncodeError: surrogates not allowed")
    store.close()
    with sqlite3.connect(data_dir / "gaplens.sqlite") as db:
        db.execute("UPDATE runs SET request=?, summary=? WHERE id=?",
                   (json.dumps({"prompt": "a photo of a \ud800 doctor\x00", "axes": ["gender", "hair \ud800"]}),
                    json.dumps({"note": "\udcff"}), run_id))
        # and a byte that is no UTF-8 at all, as only another tool can write it (sqlite3 then refused every read)
        db.execute("UPDATE runs SET error=CAST(X'55ff' AS TEXT) WHERE id=?", (run_id,))
    return run_id


def _engine_cli(*args: str | bytes) -> subprocess.CompletedProcess:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}   # strict UTF-8 on stdout, as on most terminals
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                          timeout=300)


def test_runs_list_and_its_export_survive_a_store_that_already_holds_a_surrogate(tmp_path):
    run_id = _seed_bad_run(tmp_path)
    for args in ([], ["--status", "failed"], ["--json"]):
        listed = _engine_cli("runs", "list", "--data-dir", str(tmp_path), *args)
        assert listed.returncode == 0, listed.stderr.decode()
        assert run_id in listed.stdout.decode("utf-8") and "a photo of a \ufffd doctor" in listed.stdout.decode()
    shown = _engine_cli("runs", "show", run_id, "--json", "--data-dir", str(tmp_path))
    assert shown.returncode == 0 and json.loads(shown.stdout)["request"]["axes"] == ["gender", "hair \ufffd"]
    engine = Engine("synthetic", data_dir=str(tmp_path))
    assert [r["prompt"] for r in list_runs(engine.store, status="failed")] == ["a photo of a \ufffd doctor"]
    from engine.report.export import export_zip   # and it exports into an archive that imports again

    export_zip(engine.store, [run_id], tmp_path / "old.zip")
    with zipfile.ZipFile(tmp_path / "old.zip") as zf:
        assert "\\ud800" not in zf.read("gaplens/runs.jsonl").decode()
    fresh = Engine("synthetic", data_dir=str(tmp_path / "fresh"))
    assert imports.import_zip(fresh.store, tmp_path / "old.zip")["imported"] == [run_id]


def test_a_byte_that_is_not_utf8_on_the_command_line_is_one_sentence(tmp_path):
    """`$'\\xff'` arrives in argv as U+DCFF (surrogateescape): refused naming the option, nothing stored."""
    made = _engine_cli("single-prompt", "--preset", "synthetic", "--data-dir", str(tmp_path), "--prompt",
                       b"a photo of a \xff doctor", "-n", "2", "--quiet")
    assert made.returncode == 2
    assert made.stderr.decode().startswith("error: --prompt holds an unpaired surrogate (U+DCFF, at character 14)")
    assert "Traceback" not in made.stderr.decode()
    listed = _engine_cli("runs", "list", "--data-dir", str(tmp_path))
    assert listed.returncode == 0 and listed.stdout.decode().startswith("no runs")


def test_an_archive_whose_run_holds_a_surrogate_or_a_nul_is_refused(tmp_path):
    for request in ({"prompt": "a \ud800"}, {"prompt": "a\x00b"}):
        path = tmp_path / "bad.zip"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("gaplens/manifest.json", json.dumps({"format": "gaplens-export", "format_version": 1}))
            zf.writestr("gaplens/runs.jsonl", json.dumps({
                "id": "r1", "method": "single_prompt", "status": "done", "request": json.dumps(request),
                "results": "{}", "summary": "{}", "models": "{}", "version": "0", "error": None, "created": 1.0,
                "updated": 1.0}) + "\n")
        engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
        with pytest.raises(InputError, match=r"runs.jsonl line 1: 'request' is not valid \(a text in it\.prompt holds"):
            imports.import_zip(engine.store, path)
        assert engine.store.count("runs") == 0


@pytest.fixture
def app_url(tmp_path):
    from apphelpers import running_app

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), max_images=16)
    with running_app(engine) as url:
        yield url, engine, tmp_path / "store"


def _error(message: dict) -> str:
    assert message.get("success") is False, message
    return message["output"]["error"] or ""


@pytest.mark.slow
def test_a_surrogate_through_the_api_is_one_sentence_and_stores_nothing(app_url):
    """`\\ud800` in a prompt and in `extra_axes`, as JSON escapes (httpx and so gradio_client cannot
    send an unpaired surrogate; a script posting JSON can): a sentence naming the field, no run,
    and the visitor's Runs list and next run still work."""
    from gradio_client import Client

    from publicserver import call

    url, engine, _ = app_url
    assert _error(call(url, "single_prompt", prompt=SURROGATE, n=2)).startswith(
        "“Prompt” holds an unpaired surrogate (U+D800, at character 14)")
    assert _error(call(url, "single_prompt", prompt="a photo of a doctor", n=2, extra_axes="hair \ud800")).startswith(
        "“More axes (free text, comma-separated)” holds an unpaired surrogate (U+D800, at character 6)")
    assert _error(call(url, "runs_list", search="\ud800 doctor")).startswith("“Search” holds an unpaired surrogate")
    assert _error(call(url, "runs_open", selected=["\ud800"])).startswith("“Selected runs” holds an unpaired")
    assert engine.store.count("runs") == 0
    client = Client(url, verbose=False)
    assert _runs(client) in ([], [[""] * 7])
    assert "Done" in client.predict(prompt="a photo of a doctor", n=2, api_name="/single_prompt")[1]
    assert len(_runs(client)) == 1


def _runs(client, status: str = "all") -> list[list]:
    """The Runs table's rows as /runs_list gives them."""
    return client.predict(search="", method="all", status=status, sort="newest", selected=[], page=1,
                          api_name="/runs_list")[0]["data"]


@pytest.mark.slow
def test_the_runs_tab_lists_a_store_that_already_holds_a_surrogate(tmp_path):
    from gradio_client import Client

    from apphelpers import running_app

    run_id = _seed_bad_run(tmp_path)
    engine = Engine("synthetic", data_dir=str(tmp_path))
    with running_app(engine) as url:
        client = Client(url, verbose=False)
        for status in ("all", "failed"):
            rows = _runs(client, status)
            assert [r[0] for r in rows] == [run_id] and rows[0][2] == "a photo of a \ufffd doctor"
        assert "a photo of a \ufffd doctor" in client.predict(selected=[run_id], api_name="/runs_open")[0]


@pytest.mark.slow
def test_the_spot_check_name_is_a_text_of_at_most_1000_characters(app_url):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    url, engine, _ = app_url
    client = Client(url, verbose=False)
    run_id = client.predict(prompt="a photo of a doctor", n=2, api_name="/single_prompt")[1].split("`")[1]
    with pytest.raises(AppError, match="“Your name \\(stored with each answer\\)” is 1001 characters long; the "
                                       "maximum is 1000"):
        client.predict(run_value=[run_id], axis_name="gender", n=5, name="x" * 1001, api_name="/runs_spot_start")
    assert engine.store.label_rows(run_id) == []
