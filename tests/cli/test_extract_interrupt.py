"""Ctrl-C and SLURM preemption: a real ``featpipe extract`` process and a real signal.

The signal goes to the whole process group, as a terminal's Ctrl-C or ``scancel`` sends it.
The command must keep every finished item (ledger line and file), leave no temporary file,
stop its decoding workers, print one line and exit 128 + the signal number; running the same
command again finishes the stage.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from featpipe.io.video import OpenCVDecoder
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.conftest import REPO
from tests.unit.test_video import write_video

ITEMS = 6


class SlowDecoder(OpenCVDecoder):
    """OpenCV decoding at 20 frames per second, so an item takes about a second."""

    def frames(self, path, want):
        for got in super().frames(path, want):
            time.sleep(0.05)
            yield got


def command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "featpipe", "extract", "-m", str(folder / "manifest.csv"),
            "-s", str(folder / "store"), "-f", "dsift", "--sizes", "4,8", "--step", "4",
            "--every", "1", "--decoder", f"{__name__}:SlowDecoder", "-n", "raw"]


def environment() -> dict:
    tests = str(Path(__file__).resolve().parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), tests]))


def start_slow_extract(folder: Path) -> subprocess.Popen:
    """``ITEMS`` short videos and their manifest in ``folder``, and a ``featpipe extract`` of
    them (about a second an item) started in its own process group."""
    for k in range(ITEMS):
        write_video(folder / f"v{k}.mp4", n_frames=20, size=(96, 80))
    write_manifest(folder, [(f"v{k}", f"v{k}.mp4", "a", "train") for k in range(ITEMS)])
    return subprocess.Popen(command(folder), env=environment(), cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_finished_items_and_stops_cleanly(tmp_path, signum):
    proc = start_slow_extract(tmp_path)
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    stage = None
    while time.monotonic() < deadline:  # wait until one item is done and the next begun
        workers |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        stages = Store(tmp_path / "store").all_stages()
        stage = stages[0] if stages else None
        if stage is not None and stage.done_ids() and list(stage.path.rglob("*.tmp.*")):
            break
        time.sleep(0.05)
    assert stage is not None and stage.done_ids(), "no item finished in time"
    os.killpg(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    done = len(stage.done_ids())
    assert lines[0] == (f"interrupted: {done} items done, {ITEMS - done} left; re-run the "
                        "same command to finish")
    assert 1 <= done < ITEMS
    assert not list(stage.path.rglob("*.tmp.*"))  # the item in flight left nothing behind
    assert not stage.failed()  # an interrupted item is not a failed one
    assert workers and not [p for p in workers if psutil.pid_exists(p)
                            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    again = subprocess.run(command(tmp_path), env=environment(), cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{ITEMS - done} done, {done} skipped" in again.stdout
    assert stage.is_complete()
