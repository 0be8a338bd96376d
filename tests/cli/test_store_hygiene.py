"""The "low" faults of issue 39, each decided (docs/store.md) and tested; each test failed on
main at b04aebc.  Real processes where the process is what is tested (signals)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import featpipe.stages.cache as upkeep
from featpipe import stages
from featpipe.errors import InputError
from featpipe.fileio import HOST
from featpipe.stages.base import RUNNING
from featpipe.store import Store
from tests._stores import first_encoded, imported_store, write_npy_dataset
from tests.conftest import REPO, one_line_error


@pytest.fixture
def feat(tmp_path, cli):
    return imported_store(tmp_path, cli)


def test_a_symlinked_manifest_is_read_from_its_targets_folder_by_check_and_import(tmp_path,
                                                                                  cli):
    """Decided (issue 51.7; before, issue 16, the link's own folder): relative paths are of
    the folder of the file a link points to, where they were written, by `manifest check`,
    `import` (the files its items record, and --write-manifest) and `extract` alike; the
    arrays come from --from, wherever the manifest is."""
    from featpipe.manifest import Manifest

    write_npy_dataset(tmp_path / "a")
    write_npy_dataset(tmp_path / "b", dim=3)  # other arrays under the same names
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "m.csv").symlink_to(tmp_path / "a" / "m.csv")  # c holds no data
    check = cli("manifest", "check", tmp_path / "c" / "m.csv")
    assert check.exit_code == 0, check.output  # before: 12 files 'npy/v..npy' missing
    cli("import", "--manifest", tmp_path / "c" / "m.csv", "--from", tmp_path / "b" / "npy",
        "--store", tmp_path / "s", "--name", "feat", "--write-manifest", tmp_path / "w.csv",
        check=True)
    stage = Store(tmp_path / "s").resolve("feat")
    assert stage.read_item("v00").tobytes() == np.load(tmp_path / "b" / "npy" / "v00.npy") \
        .tobytes()
    target = (tmp_path / "a" / "npy" / "v00.npy").resolve()
    for manifest in (Manifest.read(tmp_path / "c" / "m.csv"), stage.items,
                     Manifest.read(tmp_path / "w.csv")):
        assert manifest.resolve_path(manifest["v00"]).resolve() == target


def test_export_into_a_missing_folder_makes_it_and_says_so(feat, tmp_path, cli):
    store, _ = feat
    out = tmp_path / "new" / "deeper" / "x.npz"
    result = cli("export", "--store", store, "feat", "-o", out)
    assert result.exit_code == 0 and out.is_file()
    assert f"note: created folder {out.parent} for {out}" in result.stderr
    again = cli("export", "--store", store, "feat", "-o", out)
    assert "note:" not in again.stderr


def test_a_failed_fit_leaves_no_run_marker_and_gc_collects_its_empty_stage(feat, cli,
                                                                           monkeypatch):
    from featpipe.encode.standardize import Standardizer

    store, _ = feat

    def fails(self, sequences):
        raise InputError("no variance to standardize")

    monkeypatch.setattr(Standardizer, "fit", fails)
    failed = cli("fit", "standardize", "--store", store, "--input", "feat", "--name", "z")
    assert "no variance" in one_line_error(failed)
    assert not (Store(store).names_dir / RUNNING / "z").exists()
    empty = next(s for s in Store(store).all_stages() if s.kind == "standardize")
    assert not list((empty.path / "running").iterdir())
    assert empty.path in upkeep.gc(Store(store), min_age=0).removed


def test_fit_pca_wider_than_its_input_is_a_usage_error_before_any_stage(feat, cli):
    store, _ = feat
    result = cli("fit", "pca", "--store", store, "--input", "feat", "--dim", "64", "-n", "p")
    assert one_line_error(result, code=2) == \
        "error: --n-components (--dim) 64 is more than the input's 8 values"
    assert [s.kind for s in Store(store).all_stages()] == ["import"]
    assert not (Store(store).names_dir / RUNNING / "p").exists()


def test_a_symlink_loop_in_a_manifest_path_is_called_a_loop(tmp_path, cli):
    (tmp_path / "loop.npy").symlink_to(tmp_path / "loop.npy")
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,loop.npy,x,train\n")
    result = cli("manifest", "check", tmp_path / "m.csv")
    assert result.exit_code == 1
    assert "symbolic link that loops" in result.output
    assert "normalisation" not in result.output


def test_a_stage_folder_that_is_a_link_loses_the_link_not_its_target(feat, tmp_path, cli):
    store, _ = feat
    stage = Store(store).resolve("feat")
    elsewhere = tmp_path / "disk2" / stage.name
    elsewhere.parent.mkdir()
    shutil.move(stage.path, elsewhere)
    stage.path.symlink_to(elsewhere)
    assert Store(store).resolve("feat").is_complete()  # read through the link
    removed = cli("cache", "rm", "--store", store, "feat")
    assert removed.exit_code == 0, removed.output
    assert not os.path.lexists(stage.path) and elsewhere.is_dir()
    assert not list(Store(store).stages_dir.iterdir())  # no renamed link left
    stage.path.symlink_to(elsewhere)  # unnamed: gc's to collect
    past = time.time() - 3600
    for path in [elsewhere, *elsewhere.rglob("*")]:
        os.utime(path, (past, past))
    gc = cli("cache", "gc", "--store", store, "--min-age", "1")
    assert gc.exit_code == 0, gc.output
    assert not os.path.lexists(stage.path) and elsewhere.is_dir()
    assert not list(Store(store).stages_dir.iterdir())


def test_cache_rm_renames_first_so_a_killed_rm_leaves_no_half_stage(feat, cli, monkeypatch):
    store, command = feat
    stage = Store(store).resolve("feat")
    real_rmtree = shutil.rmtree

    class Killed(BaseException):
        """The process dies here."""

    def killed(path, *args, **kwargs):  # stage.json gone, then the process dies
        (path / "stage.json").unlink()
        raise Killed

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(Killed):
        cli("cache", "rm", "--store", store, "feat")
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert not stage.path.exists()  # renamed away: nothing half there to be reused
    rerun = cli(*command, check=True)
    assert "12 done, 0 skipped" in rerun.output
    leftover = next(Store(store).stages_dir.glob("*.tmp.*"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    leftover.rename(leftover.with_name(f"{stage.name}.tmp.{HOST}.{dead}"))  # its rm died
    gc = cli("cache", "gc", "--store", store)
    assert "folder of a killed gc" in gc.output and gc.exit_code == 0
    assert not list(Store(store).stages_dir.glob("*.tmp.*"))


def _environment() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), FEATPIPE_ENCODERS="tests._slow_mean")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_import_in_one_line_before_any_stage(tmp_path, signum):
    """Import waiting for its manifest (a FIFO no one writes yet): the signal ends it like
    Ctrl-C, with one line and 128 + the signal number, and no stage is left."""
    write_npy_dataset(tmp_path)
    os.mkfifo(tmp_path / "fifo.csv")
    proc = subprocess.Popen([sys.executable, "-m", "featpipe", "import", "--manifest",
                             tmp_path / "fifo.csv", "--from", tmp_path / "npy", "--store",
                             tmp_path / "s", "--name", "feat"], env=_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # started, blocked opening the manifest
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"interrupted ({signal.Signals(signum).name}): nothing half-written is "
                     "kept; re-run the same command"]
    assert not (tmp_path / "s" / "stages").exists()


def _every_command():
    from tests.cli.test_cli import leaf_commands

    return [words for words, _ in leaf_commands()]


@pytest.mark.parametrize("words", _every_command(), ids=" ".join)
def test_sigterm_stops_every_command_like_sigint(words, monkeypatch, cli):
    """Issue 39 §4: SIGTERM (a batch system's preemption) and SIGINT arriving while any
    command runs (each command of the tree, its body replaced by a wait the signal breaks)
    end it the same way: one `interrupted (SIGNAL)` line, 128 + the signal number, no
    traceback. Import and encode are also stopped for real, in a process, above and below."""
    import click

    from featpipe.cli import cli as root

    ctx = click.Context(root)
    command = root
    for word in words:
        command = command.get_command(ctx, word)

    def body(ctx):
        os.kill(os.getpid(), signum)
        time.sleep(30)
        raise AssertionError("the signal did not stop the command")

    monkeypatch.setattr(command, "make_context",
                        lambda name, args, parent=None, **kw: click.Context(
                            command, parent=parent, info_name=name))
    monkeypatch.setattr(command, "invoke", body)

    def unhandled(signum, frame):  # featpipe did not take the signal: fail, not die
        raise AssertionError(f"{signal.Signals(signum).name} not handled by the command")

    for signum in (signal.SIGTERM, signal.SIGINT):
        before = signal.signal(signum, unhandled)
        try:
            result = cli(*words)
        finally:
            signal.signal(signum, before)
        assert result.exit_code == 128 + signum, result.output
        assert result.stderr.strip() == (
            f"interrupted ({signal.Signals(signum).name}): nothing half-written is kept; "
            "re-run the same command")


def test_sigterm_stops_encode_like_sigint_keeping_its_items(tmp_path):
    store = Store(tmp_path / "store")
    stages.import_features(store, [str(tmp_path / "npy")], str(write_npy_dataset(tmp_path)),
                           name="frames")
    command = [sys.executable, "-m", "featpipe", "encode", "-s", str(store.root), "-i",
               "frames", "-m", "slow-mean", "-n", "mean"]
    proc = subprocess.Popen(command, env=_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stage = first_encoded(store, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    done = len(stage.done_ids())
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"interrupted: {done} items done, {12 - done} left; re-run the same "
                     "command to finish"]
    again = subprocess.run(command, env=_environment(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and f"{12 - done} done, {done} skipped" in again.stdout


def test_a_read_only_store_is_named_as_such_and_a_finished_rerun_needs_no_write(feat,
                                                                                 tmp_path,
                                                                                 cli):
    from tests.stages.test_store_faults import mounted

    store, command = feat
    with mounted("--bind", store, tmp_path / "ro") as ro:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        rerun = cli(*[ro if arg == store else arg for arg in command])
        assert rerun.exit_code == 0 and "0 done, 12 skipped" in rerun.output, rerun.output
        encode = cli("encode", "-s", ro, "-i", "feat", "-m", "avg", "-n", "e")
        assert f"store {ro} is read-only" in one_line_error(encode)
