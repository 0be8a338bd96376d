"""The installed wheel: built from this repository, installed into a fresh virtual
environment, it carries its sbatch template and runs `submit --dry-run`, shell completion and
a small pipeline, importing featpipe from the wheel and nothing from the source tree.

No network: the wheel is built with the test environment's setuptools
(``--no-build-isolation``) and installed with ``--no-deps --no-index``; the fresh environment
reaches the test environment's packages (numpy, scikit-learn, aeon...) through a ``.pth``
file that lists their folder.  A folder listed that way is added to ``sys.path`` without its
own ``.pth`` files being run, so the test environment's editable featpipe stays out.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

TEMPLATE = "featpipe/templates/featpipe-array.sbatch"
PIPELINE = "featpipe/templates/pipeline.toml"


def _run(args, cwd, env=None, check=True):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **(env or {})}, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's bin folder, a working folder outside the repository)."""
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    assert (major, minor) >= (70, 1), "the test extra pins setuptools>=70.1 (builds wheels " \
        "without the 'wheel' package)"
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "featpipe", source / "featpipe",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", root / "dist", source], cwd=root)
    wheel = next((root / "dist").glob("featpipe-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        assert TEMPLATE in archive.namelist() and PIPELINE in archive.namelist()
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
          "--no-index", wheel], cwd=root)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                    "['purelib'])"], cwd=root).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "test-environment.pth").write_text("\n".join(sorted(ours)) + "\n")
    work = root / "work"
    work.mkdir()
    return venv / "bin", work


def test_featpipe_is_imported_from_the_wheel(installed):
    bin_dir, work = installed
    proc = _run([bin_dir / "python", "-c", "import featpipe; print(featpipe.__file__)"], work)
    location = Path(proc.stdout.strip())
    assert bin_dir.parent in location.parents and REPO not in location.parents


def test_submit_dry_run_renders_the_shipped_template(installed):
    bin_dir, work = installed
    # submit checks the wrapped command first (its input must exist): a tiny imported stage
    rng = np.random.default_rng(0)
    np.savez(work / "frames.npz", **{f"v{i}": rng.random((5, 3)) for i in range(3)})
    (work / "frames.csv").write_text("id,path,label,split1\n" + "".join(
        f"v{i},v{i},{'ab'[i % 2]},train\n" for i in range(3)))
    _run([bin_dir / "featpipe", "import", "--manifest", "frames.csv", "--from", "frames.npz",
          "--store", work / "submit-store", "--name", "frames"], work)
    proc = _run([bin_dir / "featpipe", "submit", "--backend", "slurm", "--tasks", 3,
                 "--dry-run", "--", "featpipe", "encode", "--store", work / "submit-store",
                 "--input", "frames", "--method", "avg", "--name", "avg"], work)
    assert "#SBATCH --array=0-2" in proc.stdout
    assert f"exec {bin_dir / 'python'} -P -m featpipe encode" in proc.stdout
    template = _run([bin_dir / "featpipe", "submit", "--print-template"], work).stdout
    assert "{{COMMAND}} --executor slurm --shard" in template


def test_example_pipeline_ships_with_the_wheel(installed):
    bin_dir, work = installed
    proc = _run([bin_dir / "featpipe", "example", "pipeline"], work)
    assert proc.stdout == (REPO / PIPELINE).read_text(encoding="utf-8")


def test_shell_completion(installed):
    bin_dir, work = installed
    script = _run([bin_dir / "featpipe"], work, env={"_FEATPIPE_COMPLETE": "bash_source"})
    assert "_featpipe_completion" in script.stdout and "complete -o" in script.stdout
    words = _run([bin_dir / "featpipe"], work, env={
        "_FEATPIPE_COMPLETE": "bash_complete", "COMP_WORDS": "featpipe ru", "COMP_CWORD": "1"})
    assert "plain,run" in words.stdout.splitlines()
    options = _run([bin_dir / "featpipe"], work, env={
        "_FEATPIPE_COMPLETE": "bash_complete", "COMP_WORDS": "featpipe manifest build --te",
        "COMP_CWORD": "3"})
    assert "plain,--test-fraction" in options.stdout.splitlines()


def test_a_small_pipeline_runs_from_the_installed_wheel(installed):
    pytest.importorskip("aeon")
    from tests.cli.test_pipeline import (  # BasicMotions: import, standardize, encode, classify
        PIPELINE,
        printed_accuracy,
        reference_accuracy,
    )

    bin_dir, work = installed
    (work / "pipeline.toml").write_text(PIPELINE)
    proc = _run([bin_dir / "featpipe", "run", "pipeline.toml"], work)
    assert proc.stdout.count("summary: 80 done") == 3
    assert "step 5/5: result (classify)" in proc.stdout
    assert printed_accuracy(proc.stdout) == pytest.approx(reference_accuracy(), abs=1e-4)
    assert (work / "reports" / "avg.split1.confusion.png").stat().st_size > 0
