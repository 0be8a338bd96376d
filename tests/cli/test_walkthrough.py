"""The walkthrough (docs/walkthrough.md), command for command: rendered clips in class folders, a
manifest with a generated stratified split, the example pipeline file that ships with the
package, run dry, run, and run again."""

import re

from tests.conftest import REPO


def accuracy(stdout: str, step: str) -> float:
    section = stdout.split(f": {step} (classify)")[1]
    return float(re.search(r"split 1: accuracy ([0-9.]+)", section).group(1))


def test_walkthrough(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    walkthrough = (REPO / "docs" / "walkthrough.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", walkthrough, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands[:3] == ["featpipe example clips clips",
                            "featpipe manifest build clips -o clips.csv --test-fraction 0.5 "
                            "--seed 0", "featpipe example pipeline > pipeline.toml"]
    clips = cli("example", "clips", "clips", check=True)
    assert clips.stdout == "40 clips of 24 frames in clips/ (away, left, right, towards)\n"
    assert not (tmp_path / "clips" / "manifest.csv").exists()
    built = cli("manifest", "build", "clips", "-o", "clips.csv", "--test-fraction", "0.5",
                "--seed", "0", check=True)
    assert "split1: 20 train, 20 test" in built.stdout and built.stderr == ""
    shipped = cli("example", "pipeline", check=True).stdout
    assert shipped == (REPO / "featpipe" / "templates" / "pipeline.toml").read_text("utf-8")
    (tmp_path / "pipeline.toml").write_text(shipped, encoding="utf-8")
    plan = cli("run", "pipeline.toml", "--dry-run", check=True)
    # sift, grid, avg and hrp run as one pass over each clip: only avg and hrp are written
    assert plan.stdout.count("dry run: 40 to compute, 0 already complete") == 1
    assert "step 1/6: sift (extract), with grid, avg, hrp in one pass" in plan.stdout
    planned = re.findall(r"^stage (\S+)", plan.stdout, re.M)
    first = cli("run", "pipeline.toml", check=True)
    assert re.findall(r"^stage (\S+)", first.stdout, re.M) == planned and len(planned) == 2
    avg, hrp = accuracy(first.stdout, "avg-result"), accuracy(first.stdout, "hrp-result")
    # reversed classes share their frames: order-blind pooling is far below rank pooling
    assert hrp >= avg + 0.3, (avg, hrp)
    stated = re.search(r"prints `split 1: accuracy ([0-9.]+) \(\d+/20\)` for average pooling "
                       r"and `([0-9.]+) \(\d+/20\)` for\s+hierarchical rank pooling", walkthrough)
    assert (avg, hrp) == (float(stated.group(1)), float(stated.group(2)))
    report = (tmp_path / "reports" / "hrp.md").read_text()
    assert "![Confusion matrix (rows normalised), split 1](hrp.split1.confusion.png)" in report
    again = cli("run", "pipeline.toml", check=True)
    assert again.stdout.count("summary: 0 done, 40 skipped (already complete)") == 1
    assert accuracy(again.stdout, "hrp-result") == hrp
