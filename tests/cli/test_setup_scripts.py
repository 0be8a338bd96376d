"""bin/demo and bin/test respect an active virtual environment: they install into it, and only
what is missing (the checkout when featpipe itself is missing), never over an installed
featpipe."""

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bin"))
import missing  # noqa: E402  (bin/missing.py, which both scripts call)


def test_missing_lists_the_checkout_then_only_the_absent_requirements():
    present = {"featpipe", "torch", "scikit-video", "aeon", "matplotlib"}
    assert missing.missing(["cnn", "demo"], lambda name: name in present) == []
    assert missing.missing(["cnn", "demo"], lambda name: name in present - {"aeon"}) == \
        ["aeon>=1.0"]
    assert missing.missing(["cnn", "demo"], lambda name: name != "featpipe") == \
        ["--editable", ".[cnn,demo]"]
    everything = missing.missing(["all"], lambda name: name == "featpipe")
    assert {"torch>=2.1", "dask>=2024.1", "aeon>=1.0", "pytest>=8"} <= set(everything)


def _shims(folder: Path, python: Path) -> Path:
    """A ``python`` that logs ``-m pip`` calls instead of running them, and a ``featpipe`` that
    logs its arguments."""
    folder.mkdir()
    log = folder / "calls.log"
    (folder / "python").write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "-m pip" ]; then echo "pip $*" >> "{log}"; exit 0; fi\n'
        f'exec "{python}" "$@"\n')
    (folder / "featpipe").write_text(f'#!/bin/sh\necho "featpipe $*" >> "{log}"\n')
    for shim in ("python", "featpipe"):
        (folder / shim).chmod(0o755)
    return log


def _bin_demo(venv: Path, shims: Path):
    env = {**os.environ, "VIRTUAL_ENV": str(venv),
           "PATH": f"{shims}{os.pathsep}{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(REPO / "bin" / "demo"), "--quick"], env=env, text=True,
                          capture_output=True, timeout=300)


def test_bin_demo_installs_nothing_into_a_complete_environment(tmp_path):
    had_venv = (REPO / ".venv").exists()
    log = _shims(tmp_path / "shims", Path(sys.executable))
    proc = _bin_demo(Path(sys.prefix), tmp_path / "shims")
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == ["featpipe demo --quick"]
    assert "installing" not in proc.stderr
    assert (REPO / ".venv").exists() == had_venv  # no .venv of its own


def test_bin_demo_installs_the_checkout_into_the_active_environment(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    log = _shims(tmp_path / "shims", venv / "bin" / "python")
    proc = _bin_demo(venv, tmp_path / "shims")
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == [
        "pip -m pip install -q torch==2.13.0", "pip -m pip install -q --editable .[cnn,demo]",
        "featpipe demo --quick"]
    assert f"bin/demo: installing what is missing into {venv}: --editable .[cnn,demo]" in proc.stderr
