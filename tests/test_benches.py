"""Issue 46 item 5: every bench runs in CI at tiny sizes, so none rots (bench/single_prompt_speed.py had
stopped at an ImportError). Each runs as a subprocess, as a person runs it, and must end with its
`name=value` lines; what it measures is not asserted (benches measure, tests check behaviour).
bench/gpu_smoke.py has its own test (tests/test_gpu_smoke.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

# each bench and the arguments of its smallest run
SMOKE = {
    "abstention": ["-n", "20"],
    "api_concurrency": ["4", "0.01", "2"],
    "end_to_end": ["--n", "4", "--steps", "1", "--batch-size", "2", "--repeats", "1"],
    "engine_overhead": ["--n", "2", "--steps", "1", "--repeats", "1"],
    "evaluation_cost": ["--tiny", "--spot-checks", "2"],
    "explore_speed": ["--repeats", "1", "--n", "50"],
    "explore_tree_attacks": ["--chain", "30"],
    "finetune_check": ["--null", "3", "--n", "8", "--prompts", "2"],
    "interval_coverage": [],
    "languages": ["--n", "4", "--set-n", "2"],
    "metric_speed": ["--repeats", "1"],
    "mine_resume_speed": ["4", "2"],
    "mine_throughput": ["--iterations", "2", "--population", "8", "-n", "4"],
    "page_load": ["--repeats", "1"],
    "public_flood": ["2", "4"],
    "public_soak": ["20"],
    "scale_out": ["--occupations", "1", "--n", "2", "--processes", "2", "--projection"],
    "served_images": ["--n", "4", "--repeats", "1"],
    "single_prompt_speed": ["--n", "4", "--metric-images", "100", "--n-boot", "100"],
    "store_scale": ["--images", "200", "--runs", "100", "--repeats", "1"],
    "study_scale": ["200"],
    "tibet_modes": ["{counterfactuals_json}", "--random", "5"],
}


def test_every_bench_has_a_smoke_run():
    benches = {p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_")}
    assert benches - {"gpu_smoke"} == set(SMOKE)


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    # a short TMPDIR of its own: Chromium's socket path under pytest's tmp_path can pass the 107 bytes a Unix
    # socket may have ("Socket path too long")
    with tempfile.TemporaryDirectory(prefix="glb-", dir="/tmp") as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
               "GAPLENS_BENCH_DIR": str(tmp_path / "models"), "GAPLENS_DATA_DIR": str(tmp_path / "store"), "TMPDIR": tmp}
        return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_bench_runs_at_a_tiny_size(name, tmp_path):
    args = list(SMOKE[name])
    if "{counterfactuals_json}" in args:   # tibet_modes reads a stored Counterfactuals run's JSON
        made = _run(["-m", "engine", "counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a doctor",
                     "-n", "4", "--data-dir", str(tmp_path / "cf"), "--json", "--quiet"], tmp_path)
        assert made.returncode == 0, made.stderr[-2000:]
        path = tmp_path / "counterfactuals.json"
        path.write_text(json.dumps(json.loads(made.stdout)))
        args = [str(path) if a == "{counterfactuals_json}" else a for a in args]
    out = _run([str(BENCH / f"{name}.py"), *args], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert lines and re.fullmatch(r"[A-Za-z_][\w]*=.+", lines[-1]), out.stdout[-2000:]
