"""A fresh page, as a visitor waits for it: the app started as `python app.py --preset synthetic`,
opened in headless Chromium with an empty cache each time (issue 42.14; target: a link's first
chart in ≤ 3 s on a quiet machine).

    python bench/page_load.py [--repeats 3] [--before REV]   # e.g. --before $(git merge-base main HEAD)

Every time is the whole wait, measured around the browser from the moment the address is asked
for (navigation, the page, its scripts, the start-up load events, the server's work), not a part
the server timed itself:
- page_kb: the page's HTML as sent (what the browser downloads before it can draw anything);
- front_form_s: a fresh page until its Single Prompt form can be typed in;
- sp_click_to_done_s, sp_reported_s: Single Prompt on the synthetic world (N = 16, two
  evaluators) from the click until the page says Done, and the seconds that line reports;
- link_first_chart_s (headline, last): an Explore link (`?tab=explore&tree=…`) opened in a fresh
  context until its first chart is drawn.

`--before REV` also serves that git revision of this repository (`git archive` into a temporary
folder, its own app.py and store) beside the working tree, measures the two in turn, repeat by
repeat, and prints `before_<name>` before each `<name>`. Medians of `--repeats`, after one warm-up
each (the server's first chart imports Altair).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import ROOT, report   # also puts tests/ (apphelpers) on the path

SEED_TREE = """
import sys
from engine.core.engine import Engine
from engine.methods import explore
from engine.common.events import Done
engine = Engine("synthetic", data_dir=sys.argv[1])
done = [e for e in explore.run(explore.ExploreRequest(prompt="a photo of a doctor", n=16), engine)
        if isinstance(e, Done)][-1]
print(done.run_id)
"""
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
       "OMP_NUM_THREADS": "1"}
TIMEOUT_MS = 120_000


def serve(app_dir: Path, data_dir: Path):
    """Starts `python app.py --preset synthetic` in `app_dir` on a free port; returns (url, process)."""
    from apphelpers import free_port

    port = free_port()
    env = {**os.environ, **ENV}
    proc = subprocess.Popen([sys.executable, "app.py", "--preset", "synthetic", "--data-dir", str(data_dir),
                             "--port", str(port)], cwd=app_dir, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "config", timeout=5):
                return url, proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the app in {app_dir} exited with {proc.returncode}")
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the app in {app_dir} did not start within 180 s")


def seed_tree(app_dir: Path, data_dir: Path) -> str:
    """An Explore tree of 16 synthetic images in `data_dir`, made by `app_dir`'s own engine; its id."""
    out = subprocess.run([sys.executable, "-c", SEED_TREE, str(data_dir)], cwd=app_dir, env={**os.environ, **ENV},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def fresh(browser, url: str, until) -> dict:
    """Opens `url` in a new context (empty cache) and waits for `until(page)`; returns the seconds
    from asking for the page to `until`, the page and its context, and the page's size."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    sizes = {}
    page.on("response", lambda r: sizes.setdefault("page", r) if r.request.resource_type == "document" else None)
    start = time.perf_counter()
    page.goto(url, wait_until="commit", timeout=TIMEOUT_MS)
    until(page)
    out = {"seconds": time.perf_counter() - start, "page": page, "context": context}
    body = sizes["page"].body() if "page" in sizes else b""
    out["page_kb"] = len(body) / 1024
    return out


def measure_once(browser, url: str, tree: str) -> dict:
    """One fresh front page (its form, then a Single Prompt run) and one fresh link (its first chart)."""
    got = fresh(browser, url, lambda page: page.wait_for_selector("#sp-prompt textarea", timeout=TIMEOUT_MS))
    wall, reported = single_prompt(got["page"])
    got["context"].close()
    out = {"page_kb": got["page_kb"], "front_form_s": got["seconds"], "sp_click_to_done_s": wall,
           "sp_reported_s": reported}
    got = fresh(browser, f"{url}?tab=explore&tree={tree}",
                lambda page: page.wait_for_selector(".gl-vega[data-rendered] svg", timeout=TIMEOUT_MS))
    got["context"].close()
    return out | {"link_first_chart_s": got["seconds"]}


def single_prompt(page) -> tuple[float, float]:
    """Single Prompt for 'a photo of a nurse' (N = 16, seed chosen per call so nothing is cached)
    with a second evaluator: (seconds from the click to Done, seconds the Done line reports)."""
    import re

    page.fill("#sp-prompt textarea", "a photo of a nurse")
    page.fill("#sp-seed input[type=number]", str(int(time.time() * 1000) % 100000))
    page.fill("#sp-evaluators-pick textarea", "clip_vqa:synthetic")
    start = time.perf_counter()
    page.click("#sp-generate")
    page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=TIMEOUT_MS)
    wall = time.perf_counter() - start
    text = page.inner_text("#sp-progress")
    found = re.search(r"in ([0-9.]+) s", text)
    return wall, float(found.group(1)) if found else float("nan")


def measure(apps: dict[str, Path], repeats: int) -> dict[str, dict]:
    """{name: {measure: median}} for each app folder, served side by side and measured in turn
    (repeat by repeat, so a machine that gets busier meanwhile slows every app alike)."""
    from apphelpers import CHROMIUM_ARGS, chromium_path
    from playwright.sync_api import sync_playwright

    data_dirs, servers, seen = [], {}, {name: [] for name in apps}
    try:
        for name, app_dir in apps.items():
            data_dirs.append(Path(tempfile.mkdtemp(prefix="page-load-bench-")))
            tree = seed_tree(app_dir, data_dirs[-1])
            servers[name] = (*serve(app_dir, data_dirs[-1]), tree)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            try:
                for name, (url, _, tree) in servers.items():   # a warm-up each: the first chart imports Altair
                    measure_once(browser, url, tree)
                for i in range(repeats):
                    for name, (url, _, tree) in servers.items():
                        seen[name].append(measure_once(browser, url, tree))
                        print(f"# {name} {i + 1}/{repeats}: {seen[name][-1]}", file=sys.stderr, flush=True)
            finally:
                browser.close()
    finally:
        for _, proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        for data_dir in data_dirs:
            shutil.rmtree(data_dir, ignore_errors=True)
    return {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]} for name, runs in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default=None, metavar="REV", help="also measure this git revision, side by side")
    args = ap.parse_args()
    apps, old = {"now": ROOT}, None
    try:
        if args.before:
            old = Path(tempfile.mkdtemp(prefix="page-load-before-"))
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            apps = {"before": old, "now": ROOT}
        medians = measure(apps, args.repeats)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    headline = "link_first_chart_s"
    values = {}
    for key in [k for k in medians["now"] if k != headline] + [headline]:
        if "before" in medians:
            values[f"before_{key}"] = medians["before"][key]
        values[key] = medians["now"][key]
    report(**values)


if __name__ == "__main__":
    main()
