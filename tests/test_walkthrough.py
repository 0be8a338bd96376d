"""The README walkthrough, command for command: rendered clips in class folders, a manifest with
a generated stratified split, docs/walkthrough.toml run dry, run, and run again."""

import os
import re
import shutil
import subprocess
import sys

from conftest import REPO, run_cli


def accuracy(stdout: str, step: str) -> float:
    section = stdout.split(f": {step} (classify)")[1]
    return float(re.search(r"split 1: accuracy ([0-9.]+)", section).group(1))


def test_readme_walkthrough(tmp_path):
    subprocess.run([sys.executable, "-c", "from featpipe.demo.motion import render_dataset; "
                    "render_dataset('clips', per_class=10)"], cwd=tmp_path, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    built = run_cli("manifest", "build", "clips", "-o", "clips.csv", "--test-fraction", "0.5",
                    "--seed", "0", cwd=tmp_path)
    assert "split1: 20 train, 20 test" in built.stdout and built.stderr == ""
    shutil.copy(REPO / "docs" / "walkthrough.toml", tmp_path / "walkthrough.toml")
    plan = run_cli("run", "walkthrough.toml", "--dry-run", cwd=tmp_path)
    assert "dry run: 40 to compute, 0 already complete" in plan.stdout
    assert "dry run: would run after sift" in plan.stdout
    first = run_cli("run", "walkthrough.toml", cwd=tmp_path)
    avg, hrp = accuracy(first.stdout, "avg-result"), accuracy(first.stdout, "hrp-result")
    # reversed classes share their frames: order-blind pooling is far below rank pooling
    assert hrp >= avg + 0.3, (avg, hrp)
    report = (tmp_path / "reports" / "hrp.md").read_text()
    assert "![Confusion matrix (rows normalised), split 1](hrp.split1.confusion.png)" in report
    again = run_cli("run", "walkthrough.toml", cwd=tmp_path)
    assert again.stdout.count("summary: 0 done, 40 skipped (already complete)") == 4
    assert accuracy(again.stdout, "hrp-result") == hrp
