"""The processes featpipe starts import the featpipe the command imported, whatever the
working folder holds (issue 47, item 3).  Before: from a folder holding an empty
``featpipe/`` (an implicit namespace package, which shadows an editable install's finder)
or another ``featpipe`` package, every item of every extraction failed ("cannot import name
'FORMAT_VERSION' from 'featpipe' (unknown location)", "decoder crashed"): the decoding
workers started as ``python -c``, and Python puts the working folder first on their path.

The command runs as an installed ``featpipe`` does: a script in another folder, featpipe
found by a finder after ``sys.path`` (how an editable install finds it; a site-packages
install is on ``sys.path`` and was never shadowed by an empty folder)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.store import Store
from tests.conftest import REPO
from tests.unit.test_video import write_video

#: an editable install's finder: featpipe from FEATPIPE_TEST_REPO, found after sys.path
FINDER = '''import importlib.machinery, os, sys


class _Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "featpipe":
            return importlib.machinery.PathFinder.find_spec(
                name, [os.environ["FEATPIPE_TEST_REPO"]])
        return None


sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, _Finder)
'''
#: the console script pip writes for featpipe
SCRIPT = "import sys\nfrom featpipe.cli import main\nsys.exit(main())\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(command, environment) of featpipe as an editable install runs it."""
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(FINDER)
    (hooks / "featpipe_cli.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(hooks), FEATPIPE_TEST_REPO=str(REPO))
    return [sys.executable, str(hooks / "featpipe_cli.py")], env


@pytest.mark.parametrize("folder", ["empty", "fake"])
def test_extract_and_encode_succeed_from_a_folder_holding_a_featpipe(tmp_path, installed,
                                                                     folder):
    command, env = installed
    work = tmp_path / "work"
    (work / "featpipe").mkdir(parents=True)
    if folder == "fake":
        (work / "featpipe" / "__init__.py").write_text(
            'raise ImportError("the featpipe of the working folder was imported")\n')
    write_video(tmp_path / "v.mp4", n_frames=8, size=(64, 48))
    (tmp_path / "m.csv").write_text(f"id,path,label,split1\nv,{tmp_path / 'v.mp4'},a,train\n")
    store = Store(tmp_path / "s")
    rows = [(f"t{i}", "", ["a"], ["train"]) for i in range(6)]
    sequences = store.stage("import", {"n": 6}, items=from_rows(rows, tmp_path))
    for i in range(6):
        sequences.write_item(f"t{i}", np.full((5, 3), i, np.float32))
    store.set_name("seq", sequences)

    def featpipe(*args):
        proc = subprocess.run([*command, *map(str, args)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc

    extracted = featpipe("extract", "-m", tmp_path / "m.csv", "-s", store.root, "-f", "dsift",
                         "--every", "4", "-n", "d")
    assert "1 done, 0 skipped" in extracted.stdout
    assert store.resolve("d").read_item("v").shape[1] == 128
    encoded = featpipe("encode", "-s", store.root, "--input", "seq", "-m", "avg", "--jobs", 2,
                       "--name", "avg")
    assert "6 done, 0 skipped" in encoded.stdout
    np.testing.assert_array_equal(store.resolve("avg").read_item("t4"), np.full(3, 4.0))


def test_the_import_path_handed_down_puts_this_featpipe_first_only_where_needed(monkeypatch):
    """Its place is kept when it is on sys.path (moving it would put site-packages before
    the user's PYTHONPATH); first when a finder found it; empty entries are left out."""
    from featpipe.processes import child_environment, featpipe_folder, import_path

    own = featpipe_folder()
    monkeypatch.setattr(sys, "path", ["", "/a", own, "/b"])
    assert import_path().split(os.pathsep) == ["/a", own, "/b"]
    monkeypatch.setattr(sys, "path", ["", "/a", "/b", "/a"])
    assert import_path().split(os.pathsep) == [own, "/a", "/b"]
    assert child_environment({"X": "1"}) == {"X": "1", "PYTHONPATH": import_path()}


def test_featpipes_command_line_in_a_child_ignores_a_featpipe_in_its_folder(tmp_path):
    """``featpipe_command()`` (SLURM array tasks, their report job, submit's dask command):
    this Python, ``-P -m featpipe``, which runs this featpipe from a folder whose
    ``featpipe/`` would raise if it were imported."""
    from featpipe import __version__
    from featpipe.processes import child_environment, featpipe_command

    assert featpipe_command() == [sys.executable, "-P", "-m", "featpipe"]
    (tmp_path / "featpipe").mkdir()
    (tmp_path / "featpipe" / "__init__.py").write_text(
        'raise ImportError("the featpipe of the working folder was imported")\n')
    proc = subprocess.run([*featpipe_command(), "--version"], cwd=tmp_path,
                          env=child_environment(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert __version__ in proc.stdout
