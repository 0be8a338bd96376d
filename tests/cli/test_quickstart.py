"""The README's quickstart, as written: its block runs in an empty folder (the run of README.md
by tests/cli/test_docs_run.py, shared), and the results the README states are the ones the
commands print."""

import re

from tests import _docs_blocks as docs
from tests.conftest import REPO


def quickstart() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]


def run_commands(text: str, folder) -> str:
    """Run ``text`` with bash in ``folder`` as the docs runner runs a block; its stdout."""
    block = docs.Block("README.md", 0, "bash", text)
    env = docs.environment(docs.featpipe_bin(folder.parent / f"{folder.name}.bin"))
    return docs.run_block(block, folder, env, {}).stdout


def test_quickstart_runs_as_written():
    section = quickstart()
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    commands = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(commands) == 6 and all(c.startswith("featpipe ") for c in commands)
    assert "--normalize l2" in blocks[0]
    page = docs.page_run("README.md")
    assert page.failure is None, page.failure
    run = next(r for r in page.runs if r.block.text == blocks[0])
    assert run.ran and run.block.skip is None and not run.block.replace
    stated = re.findall(r"`(split ?1: [^`]+)`", section)
    assert len(stated) == 2, stated  # the split and the accuracy the README states
    for line in stated:
        assert line in run.stdout, (line, run.stdout)
    folder = page.folder
    assert (folder / "hrp.npz").stat().st_size > 0 and (folder / "hrp.md").exists()
    # "With --method avg in step 4 the accuracy drops to A"
    avg = re.search(r"With `--method avg` in step 4 the accuracy drops to ([0-9.]+)", section)
    hrp_encode = next(c for c in commands if c.startswith("featpipe encode"))
    classify = next(c for c in commands if c.startswith("featpipe classify"))
    swapped = run_commands(hrp_encode.replace("--method hrp --window 8", "--method avg")
                           .replace("--name hrp", "--name avg") + "\n"
                           + classify.replace("--input hrp", "--input avg")
                           .replace("hrp.json", "avg.json") + "\n", folder)
    assert f"split 1: accuracy {avg.group(1)} " in swapped, swapped
    again = run_commands(blocks[0], folder)  # everything cached
    assert again.count("summary: 0 done, 40 skipped (already complete)") == 2
