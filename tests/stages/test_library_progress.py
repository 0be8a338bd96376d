"""Stages called from Python show their progress as the command line does when someone
watches (stderr a terminal, or a Jupyter kernel: tqdm's rule) and say nothing otherwise
(issue 40: 40 clips through the Python API printed not one line); ``Reporter(progress=...)``
decides, and a subclass keeps the lines (docs/python-api.md)."""

from __future__ import annotations

import io
import sys
import types

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.reporting import Reporter
from featpipe.stages import encode
from featpipe.store import Store


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def store(tmp_path):
    """A store with a stage ``seq`` of 6 real sequences (aeon's BasicMotions, 100 x 6)."""
    aeon = pytest.importorskip("aeon.datasets")
    X, y = aeon.load_basic_motions(split="train")
    store = Store(tmp_path / "store")
    ids = [f"s{i}" for i in range(6)]
    stage = store.stage("import", {"n": 6}, items=from_rows(
        [(i, "", [str(label)], ["train"]) for i, label in zip(ids, y, strict=False)],
        tmp_path))
    for i, item in zip(ids, X, strict=False):
        stage.write_item(i, np.ascontiguousarray(item.T, dtype=np.float32))
    store.set_name("seq", stage)
    return store


def test_on_a_terminal_a_stage_draws_the_command_lines_progress(store, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    run = encode(store, "seq", "avg", name="avg")
    assert run.ok
    drawn = sys.stderr.getvalue()
    assert "\rencode avg [" in drawn and "100%  6/6 items" in drawn
    assert drawn.endswith("\n")  # the final state stays on screen


def test_in_a_notebook_too_and_nowhere_else(store, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    encode(store, "seq", "max", name="max")
    assert sys.stderr.getvalue() == ""  # a pipe, a file, pytest's capture: silent

    class ZMQInteractiveShell:  # what IPython.get_ipython() returns in a Jupyter kernel
        pass

    kernel = types.ModuleType("IPython")
    kernel.get_ipython = ZMQInteractiveShell
    monkeypatch.setitem(sys.modules, "IPython", kernel)
    encode(store, "seq", "arp", name="arp")
    assert "100%  6/6 items" in sys.stderr.getvalue()


def test_the_reporter_decides_when_asked(store, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    encode(store, "seq", "rankpool", name="rp", reporter=Reporter(progress=False))
    assert sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    encode(store, "seq", "tpyramid", name="pyr", reporter=Reporter(progress=True))
    assert sys.stderr.getvalue().startswith("progress: encode pyr 6/6 items in ")

    class Lines(Reporter):  # keeps what the stage says, as docs/python-api.md shows
        def __init__(self):
            super().__init__(progress=False)
            self.lines = []

        def info(self, text):
            self.lines.append(text)

    lines = Lines()
    encode(store, "seq", "avg", name="avg2", reporter=lines)
    assert lines.lines[-1] == "summary: 6 done, 0 skipped (already complete), 0 failed"


def test_a_real_terminal_shows_it_from_a_python_script(store):
    from tests.cli.test_cli import run_with_tty_stderr

    script = ("import sys; from featpipe.store import Store; from featpipe.stages import "
              "encode; encode(Store(sys.argv[1]), 'seq', 'avg', name='avg')")
    code, stdout, terminal = run_with_tty_stderr([store.root], (sys.executable, "-c", script))
    assert code == 0 and stdout == ""
    assert "encode avg [" in terminal and "100%  6/6 items" in terminal
