"""Records what MAGBIG's own evaluation code computes on GapLens's count tables (the fixtures of
tests/test_languages.py::test_magbig_metrics_equal_the_repositorys_code_on_count_tables).

    pip install --target /tmp/magbig_env pandas==1.5.3 numpy==1.26.4
    PYTHONPATH=/tmp/magbig_env python tests/data/magbig_reference/make_fixtures.py /path/to/MAGBIG [--git]

(the pandas MAGBIG's script was written for: from pandas 2 on, its `results.iloc[:, 1] = ...` keeps
the text column's object dtype and `score_fairness` then fails on it).

It runs MAGBIG's `generate_evaluate/exp_max_unfairness.py` unchanged, as a script (`exec` of the
file's text), with `utils_debias` replaced by a module holding only that file's `score_fairness` and
`sample_from` (taken from the repository's `utils_debias.py` by `ast`: the rest of that module
imports TensorFlow, dlib and CLIP for image classification, which the metric does not use), on a
temporary folder with the inputs the script reads: `prompts/final_occupations.txt` and
`results/SD_1-5/occupations_fairface_<location>.txt` (one count table per location, in the format
`classify_images.py` writes). `np.random.seed(seed)` is set before the script runs; the script's
frame of results is recorded before and after its rounding to 2 decimals. Nothing of MAGBIG's code
is kept here: it is read from the checkout given (a work tree, or a bare git directory with
`--git`), by commit.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pandas as pd

LOCATIONS = ["generated", "sega", "baseline", "baseline_ext", "baseline_neg"]   # the script's `locs`
HERE = Path(__file__).resolve().parent


def read(repo: str, path: str, git: bool) -> str:
    if git:
        return subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True, text=True,
                              check=True).stdout
    return Path(repo, path).read_text()


def functions_of(source: str, names: list[str]) -> types.ModuleType:
    """A module holding only the functions `names` of `source` (with numpy as np)."""
    tree = ast.parse(source)
    kept = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    module = types.ModuleType("utils_debias")
    module.np = np
    exec(compile(ast.Module(body=kept, type_ignores=[]), "utils_debias.py", "exec"), module.__dict__)
    return module


def run_case(repo: str, git: bool, tables: dict[str, list[list[int]]], seed: int, num_ims: int, num_occs: int,
             num_samples: int) -> dict:
    script = read(repo, "generate_evaluate/exp_max_unfairness.py", git)
    utils = functions_of(read(repo, "generate_evaluate/utils_debias.py", git), ["score_fairness", "sample_from"])
    n_prompts = len(next(iter(tables.values())))
    frames = []
    real_round = pd.DataFrame.round

    def spy(self, *args, **kwargs):   # records the frame the script rounds, returns what it would
        frames.append(self.copy())
        return real_round(self, *args, **kwargs)

    with tempfile.TemporaryDirectory() as work:
        os.makedirs(f"{work}/prompts")
        os.makedirs(f"{work}/results/SD_1-5")
        with open(f"{work}/prompts/final_occupations.txt", "w") as f:
            f.write("occupation   header\n" + "".join(f"occupation{i}   x\n" for i in range(n_prompts)))
        for location, rows in tables.items():
            with open(f"{work}/results/SD_1-5/occupations_fairface_{location}.txt", "w") as f:
                for i, (man, woman) in enumerate(rows):
                    f.write(f"occupation{i}\nman: {man}, woman: {woman}\n")
        cwd, argv = os.getcwd(), sys.argv
        sys.modules["utils_debias"] = utils
        pd.DataFrame.round = spy
        try:
            os.chdir(work)
            sys.argv = ["exp_max_unfairness.py", "--num_ims", str(num_ims), "--num_occs", str(num_occs),
                        "--num_samples", str(num_samples)]
            np.random.seed(seed)
            exec(compile(script, "exp_max_unfairness.py", "exec"), {"__name__": "__main__"})
            rounded = pd.read_csv(f"{work}/results/SD_1-5/fairness_fairface_occupations.csv")
        finally:
            os.chdir(cwd)
            sys.argv = argv
            pd.DataFrame.round = real_round
            sys.modules.pop("utils_debias", None)
    unrounded = frames[-1]
    as_dict = lambda frame: {row["location"]: {k: float(row[k]) for k in frame.columns if k != "location"}
                             for _, row in frame.iterrows()}
    return {"seed": seed, "num_ims": num_ims, "num_occs": num_occs, "num_samples": num_samples,
            "tables": tables, "unrounded": as_dict(unrounded), "rounded": as_dict(rounded)}


def count_tables(seed: int, n_prompts: int, images) -> dict[str, list[list[int]]]:
    """One (man, woman) count table per location: `images` answered per prompt (an int, or a list to
    draw from), men's share drawn uniformly, a few prompts all men or all women."""
    rng = np.random.default_rng(seed)
    tables = {}
    for location in LOCATIONS:
        rows = []
        for i in range(n_prompts):
            n = int(images if isinstance(images, int) else rng.choice(images))
            share = [1.0, 0.0][i % 2] if i < 2 else rng.uniform()
            men = int(rng.binomial(n, share))
            rows.append([men, n - men])
        tables[location] = rows
    return tables


def main(repo: str, git: bool) -> None:
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    cases = [run_case(repo, git, count_tables(1, 20, 48), seed=0, num_ims=10, num_occs=10, num_samples=1000),
             run_case(repo, git, count_tables(2, 12, [5, 16, 48]), seed=7, num_ims=48, num_occs=5, num_samples=500)]
    out = {"_doc": "MAGBIG's exp_max_unfairness.py run on these count tables by make_fixtures.py (see its docstring)",
           "magbig_commit": commit, "pandas": pd.__version__, "numpy": np.__version__, "cases": cases}
    (HERE / "exp_max_unfairness.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / 'exp_max_unfairness.json'} from MAGBIG {commit}")


if __name__ == "__main__":
    main(sys.argv[1], "--git" in sys.argv[2:])
