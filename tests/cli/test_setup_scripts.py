"""bin/demo and bin/test respect an active virtual environment: they install into it, and only
what is missing (the checkout when featpipe itself is missing), never over an installed
featpipe; the install path runs the real pip in a fresh environment, and a failed step names
itself under pip's own error."""

import os
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

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
        "pip -m pip install torch==2.13.0", "pip -m pip install --editable .[cnn,demo]",
        "featpipe demo --quick"]  # pip shows what it does: no -q
    assert f"bin/demo: installing what is missing into {venv}: --editable .[cnn,demo]" \
        in proc.stderr


# The real pip on the newcomer's path: a fresh virtual environment (with the pip that
# `python -m venv` brings) in which featpipe is missing, so the scripts install this checkout
# with the arguments they pass.  The fresh environment reaches the test environment's
# packages (numpy, torch, ...) through a `.pth` file listing a folder of links to them, every
# one but featpipe's own, so pip finds the dependencies satisfied and installs featpipe alone
# (its build back-end comes from the package index, as a newcomer's does).

def _fresh_environment(folder: Path, with_packages: bool = True) -> Path:
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    if with_packages:
        links = folder / "packages"
        links.mkdir()
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if not entry.name.startswith(("featpipe", "__editable__", "pip", "_distutils_hack",
                                          "distutils-precedence")):
                (links / entry.name).symlink_to(entry)
        site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print("
                               "sysconfig.get_paths()['purelib'])"], capture_output=True,
                              text=True, check=True).stdout.strip()
        (Path(site) / "test-packages.pth").write_text(f"{links}\n")
    return venv


def _in_environment(venv: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "VIRTUAL_ENV": str(venv),
            "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", **(extra or {})}


@pytest.fixture(scope="module")
def installed_by_bin_test(tmp_path_factory):
    """A fresh environment after ``bin/test`` installed featpipe into it and ran one test
    module: (the environment, bin/test's process)."""
    venv = _fresh_environment(tmp_path_factory.mktemp("newcomer"))
    proc = subprocess.run([str(REPO / "bin" / "test"), "-q", "-p", "no:cacheprovider",
                           "tests/unit/test_maps.py"], env=_in_environment(venv), text=True,
                          capture_output=True, timeout=600)
    return venv, proc


def test_bin_test_installs_the_checkout_with_the_real_pip_then_runs_pytest(
        installed_by_bin_test):
    venv, proc = installed_by_bin_test
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"bin/test: installing what is missing into {venv}: --editable .[all]" in proc.stderr
    # the kernels are compiled at set-up, not in the user's first job
    assert "featpipe: compiling the numba kernels into their cache" in proc.stderr
    assert "rank-pooling kernels: " in proc.stderr
    assert re.search(r"^\d+ passed", proc.stdout, re.MULTILINE), proc.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import featpipe; print(featpipe.__file__)"], text=True,
                           capture_output=True, check=True, cwd=venv).stdout.strip()
    assert Path(where) == REPO / "featpipe" / "__init__.py"  # this checkout, editable


def test_bin_demo_runs_the_installed_command_in_that_environment(installed_by_bin_test):
    venv, _ = installed_by_bin_test
    proc = subprocess.run([str(REPO / "bin" / "demo"), "--help"], env=_in_environment(venv),
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "installing" not in proc.stderr  # everything is there now
    assert "Usage: featpipe demo" in proc.stdout
    assert (venv / "bin" / "featpipe").exists()  # the console script of the install


def test_a_failed_install_step_shows_pips_error_and_names_the_step(tmp_path):
    venv = _fresh_environment(tmp_path, with_packages=False)  # no torch: the first step runs
    nowhere = tmp_path / "no-wheels"
    nowhere.mkdir()
    env = _in_environment(venv, {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
                                 "PIP_FIND_LINKS": str(nowhere)})
    proc = subprocess.run([str(REPO / "bin" / "test"), "-q"], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 1
    pair = " ".join(missing.TORCH_PAIRS.get(platform.machine(), ["torch", "torchvision"]))
    assert "ERROR: " in proc.stderr and pair.split()[0] in proc.stderr  # pip's own words
    assert proc.stderr.rstrip().splitlines()[-1] == (
        f"bin/test: the step that failed: installing torch (python -m pip install {pair}); "
        "pip's error is above")
    assert "passed" not in proc.stdout  # pytest never started


def test_torch_comes_with_torchvision_when_the_extras_ask_for_it(monkeypatch):
    """bin/test (every extra) installs the torch and torchvision pair that imports together
    on the machine; bin/demo (cnn, demo) CPU torch; FEATPIPE_TORCHVISION=0 leaves torchvision
    and its extra out; nothing when they import already."""
    monkeypatch.delenv("FEATPIPE_TORCHVISION", raising=False)
    nothing = lambda module: False  # noqa: E731
    assert missing.torch_install(["all"], "x86_64", nothing) == [
        "torch==2.14.1", "torchvision==0.29.1"]
    assert missing.torch_install(["all"], "aarch64", nothing) == [
        "torch==2.9.1", "torchvision==0.24.1"]
    assert missing.torch_install(["cnn", "demo"], "x86_64", nothing) == ["torch==2.13.0"]
    assert missing.torch_install(["all"], "x86_64", lambda module: True) == []
    assert missing.torch_install(["cnn"], "x86_64", lambda module: module == "torch") == []
    assert missing.missing(["all"], lambda name: name != "featpipe") == \
        ["--editable", ".[all]"]
    monkeypatch.setenv("FEATPIPE_TORCHVISION", "0")
    assert missing.torch_install(["all"], "x86_64", nothing) == ["torch==2.13.0"]
    assert missing.missing(["all"], lambda name: name != "featpipe") == \
        ["--editable", ".[cnn,cluster,demo,test]"]
    assert "torchvision>=0.16" not in missing.missing(["all"], lambda name: name == "featpipe")


# A distribution's Python (Debian 12's python3.11) gives new environments an old pip (23.0.1),
# whose resolver spent over 12 minutes of CPU on `--editable .[all]`: the scripts bring the
# pip of their own .venv to a current release before they install anything.

DISTRIBUTION_PIP = "23.0.1"  # what Debian 12's python3.11 -m venv installs


def _checkout_with_own_venv(folder: Path) -> tuple[Path, Path]:
    """A checkout whose .venv (not activated) has pip 23.0.1 and, through a ``.pth`` file,
    every package of the test environment (featpipe's metadata included, so nothing else is
    missing): (the checkout, the .venv)."""
    checkout = folder / "checkout"
    (checkout / "bin").mkdir(parents=True)
    for name in ("bin/environment.sh", "bin/missing.py", "pyproject.toml"):
        (checkout / name).write_bytes((REPO / name).read_bytes())
    venv = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", f"pip=={DISTRIBUTION_PIP}"], check=True,
                   timeout=300)
    links = folder / "packages"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("pip", "_distutils_hack", "distutils-precedence")):
            (links / entry.name).symlink_to(entry)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print("
                           "sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (Path(site) / "test-packages.pth").write_text(f"{links}\n")
    return checkout, venv


def _pip_version(venv: Path) -> str:
    return subprocess.run([str(venv / "bin" / "python"), "-c", "from importlib import metadata;"
                           " print(metadata.version('pip'))"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_old_pip_in_the_scripts_own_venv_is_brought_up_to_date_first(tmp_path):
    checkout, venv = _checkout_with_own_venv(tmp_path)
    assert _pip_version(venv) == DISTRIBUTION_PIP
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)  # featpipe.compiled: this checkout's kernels, cached
    env["FEATPIPE_TORCHVISION"] = "0"  # the torch that imports is kept: the test is pip's
    proc = subprocess.run(["bash", "-c", ". bin/environment.sh && prepare_environment bin/test "
                           "all"], cwd=checkout, env=env, text=True, capture_output=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    installs = [line for line in proc.stderr.splitlines() if ": installing " in line]
    assert installs == [f"bin/test: installing a current pip (this .venv has pip "
                        f"{DISTRIBUTION_PIP}) into {venv}: --upgrade pip>=24.1"], proc.stderr
    assert "Successfully installed pip-" in proc.stdout + proc.stderr  # pip says what it did
    version = tuple(int(p) for p in _pip_version(venv).split(".")[:2])
    assert version >= (24, 1)
    again = subprocess.run(["bash", "-c", ". bin/environment.sh && prepare_environment bin/test "
                            "all"], cwd=checkout, env=env, text=True, capture_output=True,
                           timeout=600)
    assert again.returncode == 0 and ": installing " not in again.stderr  # prepared: nothing


def test_bin_test_help_says_how_to_skip_the_optional_build():
    had_venv = (REPO / ".venv").exists()
    proc = subprocess.run([str(REPO / "bin" / "test"), "--help"], text=True,
                          capture_output=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: bin/test [--no-cyvlfeat]")
    text = " ".join(proc.stdout.split())
    assert "--no-cyvlfeat" in text and "FEATPIPE_NO_CYVLFEAT=1" in text
    assert "usually 5-6 minutes of CPU" in text
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "bin/test --no-cyvlfeat" in readme and "FEATPIPE_NO_CYVLFEAT=1" in readme
    assert (REPO / ".venv").exists() == had_venv  # --help prepares nothing
    assert "installing" not in proc.stderr

