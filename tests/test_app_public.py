"""The app in public mode over HTTP (issue 13): two visitors through gradio_client, host-only
actions, budgets, and the file route refusing the store's files."""
import urllib.parse

import pytest

from apphelpers import http_get as _get, running_app
from engine.common import access
from engine.core.engine import Engine
from engine.common.events import Done
from engine.hosting.limits import Budget
from engine.methods import generate

pytestmark = pytest.mark.slow

HOST_TOKEN = "test-host-token-0123456789"


def _measure(client, n: int):
    return client.predict(prompt="a photo of a doctor", n=n, api_name="/single_prompt")


def _run_ids(client) -> set[str]:
    table = client.predict(search="", method="all", status="all", sort="newest", selected=[], api_name="/runs_list")[0]
    return {row[0] for row in table["data"]}


def test_two_visitors_the_host_budgets_and_the_database_over_http(tmp_path, monkeypatch):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=True, max_images=256,
                    budget=Budget(images=8, hourly_images=64))
    with access.acting_as(access.HOST):  # a run of the host's, not published
        host_run = [e for e in generate.run(generate.GenerateRequest("a photo of a host", n=2), engine)
                    if isinstance(e, Done)][0].run_id
    with running_app(engine) as url:
        host = Client(url, headers={"x-gaplens-host-token": HOST_TOKEN}, verbose=False)
        a = Client(url, verbose=False)
        b = Client(url, verbose=False)

        # Visitor A measures a prompt; A sees that run, B does not (nor the host's).
        _measure(a, 4)
        a_runs = _run_ids(a)
        assert len(a_runs) == 1 and host_run not in a_runs
        assert _run_ids(b) == set()
        assert a_runs | {host_run} <= _run_ids(host)
        (a_run,) = a_runs
        with pytest.raises(AppError, match="pick a run first|no run"):
            b.predict(selected=[a_run], api_name="/runs_open")
        # deleting another visitor's run answers as for a run that does not exist (issue 26)
        others = b.predict(selected=[a_run], confirmed=True, keep=False, api_name="/runs_delete")[2]
        missing = b.predict(selected=["20000101-000000-abcdef"], confirmed=True, keep=False, api_name="/runs_delete")[2]
        assert others.replace(a_run, "ID") == missing.replace("20000101-000000-abcdef", "ID")
        assert "Not found" in others and a_run in _run_ids(a)
        # an export is charged the bytes its runs hold (issue 27: downloads are bounded per hour too)
        a.predict(selected=[a_run], api_name="/runs_export_zip")
        with engine.store.ledger() as ledger:
            assert sum(r[3] for r in ledger.charges(0)) == engine.store.runs_usage([a_run]) > 0

        # Host-only: switching the preset and unloading, refused to visitors, allowed to the host.
        for client in (a, b):
            with pytest.raises(AppError, match="for the host of this public GapLens only"):
                client.predict(name="colour", api_name="/use_preset")
            with pytest.raises(AppError, match="for the host of this public GapLens only"):
                client.predict(api_name="/unload")
        assert "colour" in host.predict(name="colour", api_name="/use_preset")
        host.predict(api_name="/unload")
        assert engine.preset.name == "colour"
        host.predict(name="synthetic", api_name="/use_preset")

        # Budgets: refused before any work, with a clear message; nothing stored.
        before = engine.store.count("runs")
        with pytest.raises(AppError, match="over budget: one request may generate at most 8 images"):
            _measure(b, 16)
        assert engine.store.count("runs") == before

        # The file route serves no file of the store: not its images (issue 26: visitors get copies in
        # Gradio's cache, tests/test_app_public_reach.py), never the database or its WAL.
        with access.acting_as(access.HOST):
            image = engine.store.get_images([engine.store.get_run(host_run)["images"][0]["image_key"]])
        (record,) = image.values()
        status, body = _get(f"{url}gradio_api/file={urllib.parse.quote(record.path)}")
        assert status == 403 and not body.startswith(b"\x89PNG")
        data_dir = engine.store.data_dir
        assert (data_dir / "gaplens.sqlite").exists() and (data_dir / "gaplens.sqlite-wal").exists()
        for name in ("gaplens.sqlite", "gaplens.sqlite-wal", "gaplens.sqlite-shm", "images/../gaplens.sqlite"):
            status, body = _get(f"{url}gradio_api/file={urllib.parse.quote(str(data_dir / name))}")
            assert status in (403, 404) and not body.startswith(b"SQLite format 3"), name
        # No host path in what a visitor sees of the status.
        status_text = a.predict(api_name="/status")
        assert str(data_dir) not in status_text and str(tmp_path) not in status_text
        assert "This hour you may still** generate 60 images and make 199 LLM calls" in status_text  # A ran 4
        assert "/assets/synthetic_world.json" not in status_text


def test_visitors_are_keyed_by_their_hugging_face_login_and_the_space_owner_is_the_host(monkeypatch):
    import gradio as gr
    from starlette.requests import Request

    from tabs.common import visitor_of

    def request(username=None, headers=(), session_hash="abc"):
        scope = {"type": "http", "headers": [(k.encode(), v.encode()) for k, v in headers],
                 "session": {"oauth_info": {"userinfo": {"preferred_username": username}}} if username else {}}
        return gr.Request(request=Request(scope), session_hash=session_hash)

    monkeypatch.setenv("SPACE_AUTHOR_NAME", "owner")
    monkeypatch.delenv("GAPLENS_HOSTS", raising=False)
    monkeypatch.setenv("GAPLENS_HOST_TOKEN", HOST_TOKEN)
    assert visitor_of(request("alice")) == access.Visitor("hf:alice")
    assert visitor_of(request("owner")).host
    assert visitor_of(request()) == access.Visitor("session:abc")
    assert visitor_of(request(headers=[("x-gaplens-host-token", HOST_TOKEN)])).host
    assert not visitor_of(request(headers=[("x-gaplens-host-token", "guess")])).host
    assert visitor_of(None) == access.ANONYMOUS
