"""The README's quickstart, as written: every shell block of its section runs in an empty folder,
and the results the README states are the ones the commands print."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO


def quickstart() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]


def run_block(block: str, cwd) -> str:
    """Run ``block`` with bash, ``featpipe`` being this interpreter's featpipe of this tree."""
    bin_dir = cwd / ".bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "featpipe").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m featpipe "$@"\n')
    (bin_dir / "featpipe").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (block, proc.stdout, proc.stderr)
    return proc.stdout


def test_quickstart_runs_as_written(tmp_path):
    section = quickstart()
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    commands = [line for line in blocks[0].splitlines() if line.strip()]
    assert len(commands) == 6 and all(c.startswith("featpipe ") for c in commands)
    assert "--normalize l2" in blocks[0]
    stdout = run_block(blocks[0], tmp_path)
    stated = re.findall(r"`(split ?1: [^`]+)`", section)
    assert len(stated) == 2, stated  # the split and the accuracy the README states
    for line in stated:
        assert line in stdout, (line, stdout)
    assert (tmp_path / "hrp.npz").stat().st_size > 0 and (tmp_path / "hrp.md").exists()
    # "With --method avg in step 4 the accuracy drops to A"
    avg = re.search(r"With `--method avg` in step 4 the accuracy drops to ([0-9.]+)", section)
    hrp_encode = next(c for c in commands if c.startswith("featpipe encode"))
    classify = next(c for c in commands if c.startswith("featpipe classify"))
    swapped = run_block(hrp_encode.replace("--method hrp --window 8", "--method avg")
                        .replace("--name hrp", "--name avg") + "\n"
                        + classify.replace("--input hrp", "--input avg")
                        .replace("hrp.json", "avg.json"), tmp_path)
    assert f"split 1: accuracy {avg.group(1)} " in swapped, swapped
    again = run_block(blocks[0], tmp_path)  # everything cached
    assert again.count("summary: 0 done, 40 skipped (already complete)") == 2
