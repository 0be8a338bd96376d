"""The walkthrough (docs/walkthrough.md), command for command: rendered clips in class folders, a
manifest with a generated stratified split, the example pipeline file that ships with the
package, run dry, run, and run again.  The page's block runs once (tests/cli/test_docs_run.py's
run of the page, shared); this test reads what each command printed."""

import re

from tests import _docs_blocks as docs
from tests.conftest import REPO


def accuracy(stdout: str, step: str) -> float:
    section = stdout.split(f": {step} (classify)")[1]
    return float(re.search(r"split 1: accuracy ([0-9.]+)", section).group(1))


def test_walkthrough():
    walkthrough = (REPO / "docs" / "walkthrough.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", walkthrough, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["featpipe example clips clips",
                        "featpipe manifest build clips -o clips.csv --test-fraction 0.5 "
                        "--seed 0", "featpipe example pipeline > pipeline.toml",
                        "featpipe run pipeline.toml --dry-run", "featpipe run pipeline.toml",
                        "featpipe run pipeline.toml"]
    page = docs.page_run("docs/walkthrough.md")
    assert page.failure is None, page.failure
    run = next(r for r in page.runs if r.block.text == block)
    assert run.ran
    made, plan, first, again = re.split(r"^(?=step 1/\d+: )", run.stdout, flags=re.M)
    assert made.startswith("40 clips of 24 frames in clips/ (away, left, right, towards)\n")
    assert not (page.folder / "clips" / "manifest.csv").exists()
    assert "split1: 20 train, 20 test" in made
    shipped = (REPO / "featpipe" / "templates" / "pipeline.toml").read_text("utf-8")
    assert (page.folder / "pipeline.toml").read_text("utf-8") == shipped
    # sift, grid, avg and hrp run as one pass over each clip: only avg and hrp are written
    assert plan.count("dry run: 40 to compute, 0 already complete") == 1
    assert "step 1/6: sift (extract), with grid, avg, hrp in one pass" in plan
    planned = re.findall(r"^stage (\S+)", plan, re.M)
    assert re.findall(r"^stage (\S+)", first, re.M) == planned and len(planned) == 2
    avg, hrp = accuracy(first, "avg-result"), accuracy(first, "hrp-result")
    # reversed classes share their frames: order-blind pooling is far below rank pooling
    assert hrp >= avg + 0.3, (avg, hrp)
    stated = re.search(r"prints `split 1: accuracy ([0-9.]+) \(\d+/20\)` for average pooling "
                       r"and `([0-9.]+) \(\d+/20\)` for\s+hierarchical rank pooling", walkthrough)
    assert (avg, hrp) == (float(stated.group(1)), float(stated.group(2)))
    report = (page.folder / "reports" / "hrp.md").read_text()
    assert "![Confusion matrix (rows normalised), split 1](hrp.split1.confusion.png)" in report
    assert again.count("summary: 0 done, 40 skipped (already complete)") == 1
    assert accuracy(again, "hrp-result") == hrp
