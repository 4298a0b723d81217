"""`python -m engine ...` as a researcher scripts it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, data_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GAPLENS_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_generate_prints_one_record_per_image_and_writes_a_run(tmp_path):
    out = cli("generate", "--preset", "synthetic", "--prompt", "a photo of a doctor", "-n", "8", "--json",
              data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [r["seed"] for r in result["images"]] == list(range(8))
    assert all(Path(r["path"]).exists() and len(r["key"]) == 64 for r in result["images"])
    assert "8/8 images" in out.stderr  # progress on stderr
    status = json.loads(cli("status", "--preset", "synthetic", data_dir=tmp_path).stdout)
    assert status["stored_images"] == 8 and status["runs"] == 1
    assert status["data_dir"] == str(tmp_path)   # the whole path (issue 42.19: it said "gaplens")
    relative = json.loads(cli("status", "--preset", "synthetic", data_dir=os.path.relpath(tmp_path, ROOT)).stdout)
    assert relative["data_dir"] == str(tmp_path.resolve()) and relative["runs"] == 1   # also when given relative


def test_bad_input_prints_a_clear_error_and_exits_2(tmp_path):
    for args, needle in [(["--prompt", ""], "empty"), (["--prompt", "a cat", "-n", "100000"], "maximum"),
                         (["--prompt", "a cat", "--generator", "diffusers:no-org/no-model"], "no-org/no-model")]:
        out = cli("generate", "--preset", "synthetic", *args, data_dir=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("error:") or "\nerror:" in out.stderr
        assert needle in out.stderr
        assert "Traceback" not in out.stderr


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GAPLENS_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "plan", "--preset", "sd15", "--gpu-memory", "24"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `| head -0`: the reader is gone before the first line
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_a_counterfactual_with_a_placeholder_nothing_fills_is_refused_before_any_image(tmp_path):
    # issue 34: the axes name {occupation}, the prompt has no placeholder and no fill values are given
    out = cli("counterfactuals", "--preset", "synthetic", "--prompt", "a portrait of a doctor", "--axes",
              '{"gender": ["A photo of a male {occupation}", "A photo of a female {occupation}"]}', data_dir=tmp_path)
    assert out.returncode == 2, out.stderr
    error = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(error) == 1 and error[0].startswith("error: the counterfactual 'A photo of a male {occupation}' "
                                                   "has {occupation}, which neither the prompt nor the fill values")
    assert "Traceback" not in out.stderr
    assert not list(tmp_path.glob("**/*.png"))                            # no image was generated
