"""Faults that stopped or broke work (issue 31 sections 2 and 3): locks that die with their
process, a full disk as the store's one error, leftovers of killed commands, one view of an
unfinished named run.  Kills are real SIGKILLs of real processes; full disks are real small
tmpfs file systems (skipped, with the reason, where mounting is not allowed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.errors import WriteError
from featpipe.fileio import HOST
from featpipe.manifest import from_rows
from featpipe.stages.cache import gc
from featpipe.store import Store
from tests.conftest import REPO, one_line_error
from tests.stages.test_store_faults import mounted, tmp_files


def cli_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def start_cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "featpipe", *map(str, args)],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def filled_stage(store: Store, n: int, shape=(4, 3), name: str | None = "feats",
                 kind: str = "import"):
    items = from_rows([(f"v{i:04d}", "", ["c"], ["train"]) for i in range(n)], store.root)
    stage = store.stage(kind, {"n": n, "shape": list(shape)}, items=items)
    rng = np.random.default_rng(0)
    for i in range(n):
        stage.write_item(f"v{i:04d}", rng.standard_normal(shape).astype(np.float32),
                         {"timestamps": np.arange(shape[0], dtype=np.float64)})
    if name:
        store.set_name(name, stage)
    return stage


def wait_for(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.005)
    raise AssertionError(f"{what}: not seen within {timeout:g} s")


# -- 2b: a killed pack leaves no lock -------------------------------------------------------
def test_a_pack_killed_by_sigkill_blocks_no_later_pack_and_gc_leaves_nothing(tmp_path, cli):
    """Before: ``packed/pack.lock`` kept the dead pid and every later pack was refused."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 600, shape=(64, 64))
    proc = start_cli("cache", "pack", "--store", store.root, "feats")
    wait_for(lambda: list((stage.path / "packed").glob("*.tmp.*"))
             if (stage.path / "packed").is_dir() else None, "the pack's temporary file")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert stage.is_complete() and len(list((stage.path / "items").rglob("*.npy"))) == 1200
    again = cli("cache", "pack", "--store", store.root, "feats")
    assert again.exit_code == 0, again.output
    assert "packed 600 items" in again.output
    result = gc(store, min_age=0)
    assert result.removed == [] and not tmp_files(store.root)
    assert not list(store.root.rglob("*.lock"))
    assert all(np.array_equal(stage.read_item(i), Store(store.root).resolve("feats")
                              .read_item(i)) for i in stage.items.ids[:5])


# -- 2c: a full disk during pack -------------------------------------------------------------
def loose_files(stage) -> dict:
    return {p: p.read_bytes() for p in sorted((stage.path / "items").rglob("*.npy"))}


def test_pack_on_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path):
    """Before: exit 139 (a segmentation fault in HDF5), h5py tracebacks, a stale lock and a
    ``.tmp`` file.  The loose files stay as they were."""
    with mounted("-t", "tmpfs", "-o", "size=1200k", "tmpfs", tmp_path / "disk") as disk:
        stage = filled_stage(Store(disk / "s"), 12, shape=(2000, 8))  # ~64 KiB per item
        before = loose_files(stage)
        proc = subprocess.run([sys.executable, "-m", "featpipe", "cache", "pack", "--store",
                               disk / "s", "feats"], env=cli_env(), capture_output=True,
                              text=True, timeout=300)
        line = one_line_error(proc)
        assert "the packed files need about" in line and "free" in line, line
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert loose_files(stage) == before and stage.packed() is None
        assert not tmp_files(disk) and not list(disk.rglob("*.h5")) and \
            not list(disk.rglob("*.lock"))


def test_a_disk_that_fills_while_packing_is_one_write_error(tmp_path, monkeypatch):
    """The room check passes (another writer fills the disk meanwhile): HDF5 writes through
    Python, so the full disk is an OSError, not a crash; nothing is left behind."""
    import featpipe.store.pack as pack

    with mounted("-t", "tmpfs", "-o", "size=1200k", "tmpfs", tmp_path / "disk") as disk:
        stage = filled_stage(Store(disk / "s"), 12, shape=(2000, 8))
        before = loose_files(stage)
        monkeypatch.setattr(pack, "free_bytes", lambda path: 2**40)
        with pytest.raises(WriteError, match=r"No space left on device \(disk full\)"):
            pack.pack_stage(stage)
        assert loose_files(stage) == before and stage.packed() is None
        assert not tmp_files(disk) and not list(disk.rglob("*.h5"))
        proc = subprocess.run([sys.executable, "-c", "import sys; from featpipe.store import "
                               "Store; from featpipe.store.pack import pack_stage; import "
                               "featpipe.store.pack as p; p.free_bytes = lambda path: 2**40; "
                               "pack_stage(Store(sys.argv[1]).resolve('feats'))", disk / "s"],
                              env=cli_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "WriteError" in proc.stderr  # a Python error, no crash
        assert "h5py" not in proc.stderr and not tmp_files(disk)


# -- 2a: a running stage keeps its inputs ----------------------------------------------------
def test_gc_keeps_the_inputs_of_an_unnamed_running_encode_after_their_name_moved(tmp_path):
    """Before: gc removed the input (its name had moved, the encode had no --name) and the
    encode failed with ``no stage at ...``."""
    from featpipe import stages
    from tests._stores import write_npy_dataset

    store = Store(tmp_path / "store")
    manifest = str(write_npy_dataset(tmp_path))
    frames = stages.import_features(store, [str(tmp_path / "npy")], manifest,
                                    name="frames").stage
    gate = tmp_path / "go"  # the encode computes no item before it exists
    proc = subprocess.Popen(
        [sys.executable, "-m", "featpipe", "encode", "-s", str(store.root), "-i", "frames",
         "-m", "slow-mean", "--seconds", "0"],
        env=dict(cli_env(), FEATPIPE_ENCODERS="tests._slow_mean", SLOW_MEAN_GATE=str(gate)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        encode = wait_for(lambda: [s for s in store.all_stages() if s.kind == "encode"
                                   and s.running_processes()], "the running encode")[0]
        other = filled_stage(store, 2, name=None, kind="other")
        store.set_name("frames", other)  # the name moves on; no name points at the input
        result = gc(store, min_age=0)
        assert result.removed == [] and frames.path.is_dir() and encode.path.is_dir()
    finally:
        gate.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "summary: 12 done" in out
    assert {p.name for p in gc(store, min_age=0).removed} == {frames.name, encode.name}


def test_a_marker_whose_pid_lives_but_holds_no_lock_is_stale(tmp_path):
    """The pid of a killed run may be reused by another process: the marker's flock, which
    the kernel dropped at the death, tells them apart (before: kept as running)."""
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (stage.path / "running").mkdir()
        (stage.path / "running" / f"{HOST}-{other.pid}").touch()
        assert stage.running_processes() == []
        stage.mark_running()
        stage.mark_running()  # twice (nested runs): the lock stays held
        assert stage.running_processes() == [f"{HOST}-{os.getpid()}"]
        seen = subprocess.run(  # another process of this host sees this one computing it
            [sys.executable, "-c", "import sys; from featpipe.store import Stage; "
             "print(Stage(sys.argv[1]).running_processes())", str(stage.path)],
            env=cli_env(), capture_output=True, text=True, timeout=120)
        assert seen.stdout.strip() == str([f"{HOST}-{os.getpid()}"]), seen.stderr
        stage.unmark_running()
        assert gc(Store(tmp_path / "s"), min_age=0).removed == [stage.path]
    finally:
        other.kill()
        other.wait()


# -- 2d, 3.4: a full disk during extract and import is the store's one error -----------------
def test_a_full_disk_during_extract_fails_no_item_and_the_rerun_resumes(tmp_path):
    """Before: with --no-disk-check every item was recorded failed (``OSError: [Errno 28]``)
    and with --on-error skip the name moved to a stage whose items all failed."""
    from tests.cli.test_extract_cli import write_manifest
    from tests.unit.test_video import write_video

    for k in range(6):
        write_video(tmp_path / f"v{k}.mp4", n_frames=20, size=(96, 80))
    manifest = write_manifest(tmp_path, [(f"v{k}", f"v{k}.mp4", "a", "train")
                                         for k in range(6)])
    with mounted("-t", "tmpfs", "-o", "size=4m", "tmpfs", tmp_path / "disk") as disk:
        command = [sys.executable, "-m", "featpipe", "extract", "-m", manifest, "-s",
                   disk / "s", "-f", "dsift", "--sizes", "4,8", "--step", "4", "--every", "4",
                   "-n", "r", "--no-disk-check", "--on-error", "skip"]  # ~1.8 MB an item
        full = subprocess.run(list(map(str, command)), env=cli_env(), capture_output=True,
                              text=True, timeout=600)
        line = one_line_error(full)
        store = Store(disk / "s")
        stage, = store.all_stages()
        kept = stage.done_ids()
        assert 0 < len(kept) < 6
        assert "No space left on device (disk full)" in line, line
        assert f"{len(kept)} of 6 item(s) are done and kept" in line, line
        assert stage.failed() == {} and all(e.status == "done" for e in stage.ledger())
        assert "r" not in store.names() and not tmp_files(disk)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = subprocess.run(list(map(str, command)), env=cli_env(), capture_output=True,
                               text=True, timeout=600)
        assert again.returncode == 0, again.stderr
        assert f"{6 - len(kept)} done, {len(kept)} skipped" in again.stdout
        assert store.resolve("r") == stage and stage.is_complete() and stage.failed() == {}


def test_a_full_disk_during_import_counts_every_item_kept(tmp_path):
    """Before: the items written in the batch that met the full disk were kept but not
    counted (``48 item(s) done by this run`` where 62 were done)."""
    from tests._stores import write_npy_dataset

    manifest = write_npy_dataset(tmp_path / "data", n=40, dim=500)  # ~10-22 KiB per item
    with mounted("-t", "tmpfs", "-o", "size=400k", "tmpfs", tmp_path / "disk") as disk:
        full = subprocess.run(
            [sys.executable, "-m", "featpipe", "import", "--manifest", str(manifest), "--from",
             str(tmp_path / "data" / "npy"), "--store", str(disk / "s"), "--name", "fc"],
            env=cli_env(), capture_output=True, text=True, timeout=300)
        line = one_line_error(full)
        stage, = Store(disk / "s").all_stages()
        kept = len(stage.done_ids())
        assert 0 < kept < 40 and f": {kept} of 40 item(s) are done and kept" in line, line
        assert stage.failed() == {} and not tmp_files(disk)


# -- 3.1: what killed commands leave is found and removed ------------------------------------
def test_the_temporary_file_of_a_killed_export_is_removed_by_the_next_export(tmp_path):
    """Before: ``out.npz.tmp.<host>.<pid>`` (up to 111 MB) stayed; no rerun removed it."""
    store = Store(tmp_path / "s")
    filled_stage(store, 400, shape=(128, 64))
    out = tmp_path / "out" / "x.npz"
    proc = start_cli("export", "--store", store.root, "feats", "-o", out)
    leftover = wait_for(lambda: list(out.parent.glob("x.npz.tmp.*"))
                        if out.parent.is_dir() else None, "the export's temporary file")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert leftover[0].exists() and not out.exists()
    again = subprocess.run([sys.executable, "-m", "featpipe", "export", "--store",
                            str(store.root), "feats", "-o", str(out)], env=cli_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.npz"]


def test_a_gc_killed_while_deleting_leaves_what_the_next_gc_removes(tmp_path, cli):
    """Before: a folder without stage.json stayed, which ls, verify and gc never saw."""
    store = Store(tmp_path / "s")
    doomed = filled_stage(store, 1500, name=None)  # 3000 files: deleting takes a while
    os.utime(doomed.path / "stage.json", (1, 1))
    proc = start_cli("cache", "gc", "--store", store.root, "--min-age", "0")
    wait_for(lambda: not (doomed.path / "stage.json").exists(), "gc deleting the stage")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    left = list(store.stages_dir.iterdir())
    if not left:
        pytest.skip("gc finished before it was killed")
    listed = cli("cache", "ls", "--store", store.root)
    assert listed.exit_code == 0 and doomed.name not in listed.stdout
    again = cli("cache", "gc", "--store", store.root, "--min-age", "0")
    assert again.exit_code == 0, again.output
    assert "folder of a killed gc" in again.output
    assert list(store.stages_dir.iterdir()) == []


def test_gc_removes_every_leftover_of_a_killed_command(tmp_path):
    from featpipe.store.pack import pack_stage

    store = Store(tmp_path / "s")
    kept = filled_stage(store, 4)
    pack_stage(kept)
    dead = subprocess.Popen(["true"])
    dead.wait()
    trash = store.stages_dir / f"import-0123456789abcdef.tmp.{HOST}.{dead.pid}"
    (trash / "items").mkdir(parents=True)
    (trash / "items" / "x.npy").write_bytes(b"x")
    headless = store.stages_dir / "encode-0123456789abcdef"  # a killed creation
    headless.mkdir()
    (headless / "items.csv").write_text("id,path,label,split1\n")
    os.utime(headless / "items.csv", (1, 1))
    os.utime(headless, (1, 1))
    orphan_shard = kept.path / "packed" / "shard-0000-of-0002.0badcafe.h5"
    orphan_shard.write_bytes(b"half a pack")
    dry = gc(store, min_age=0, dry_run=True)
    assert trash.exists() and headless.exists() and orphan_shard.exists() and not dry.removed
    gc(store, min_age=0)
    assert not trash.exists() and not headless.exists() and not orphan_shard.exists()
    assert kept.is_complete() and store.resolve("feats") == kept
    assert sorted(p.name for p in store.stages_dir.iterdir()) == [kept.name]
    fresh = store.stages_dir / "encode-fedcba9876543210"  # being created now: kept
    fresh.mkdir()
    gc(store, min_age=0)
    assert fresh.exists()


# -- 3.2: one view of an unfinished named run -------------------------------------------------
def test_a_killed_named_extract_is_one_stage_for_status_ls_show_and_refs(tmp_path, cli):
    """Before: ``status r`` followed the unfinished run, but ``cache ls`` showed no name and
    ``cache refs r`` said there was no stage ``r``."""
    import json

    from tests.cli.test_extract_interrupt import start_slow_extract

    proc = start_slow_extract(tmp_path)
    store = Store(tmp_path / "store")
    stage = wait_for(lambda: next((s for s in store.all_stages() if s.done_ids()), None),
                     "a finished item", timeout=180)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert "raw" not in store.names()
    status = cli("status", "-s", store.root, "raw")
    assert status.exit_code == 0 and f"stage {stage.name}" in status.output
    listed = cli("cache", "ls", "-s", store.root)
    assert listed.exit_code == 0
    row, = [line for line in listed.stdout.splitlines() if stage.name in line]
    assert row.split()[0] == "raw(unfinished)", row
    rows = json.loads(cli("cache", "ls", "-s", store.root, "--json").stdout)["stages"]
    assert [r["unfinished_runs"] for r in rows] == [["raw"]]
    refs = cli("cache", "refs", "-s", store.root, "raw")
    assert refs.exit_code == 0, refs.output
    assert f"stage {stage.name} (extract)" in refs.output
    assert "unfinished runs for: raw" in refs.output
    shown = cli("cache", "show", "-s", store.root, "raw")
    assert shown.exit_code == 0 and f"stage {stage.name} (extract); unfinished run for raw" \
        in shown.output


# -- 3.3: a plain rerun recomputes a truncated item -------------------------------------------
@pytest.mark.parametrize("cut", ["in-its-data", "in-its-header"])
def test_a_plain_rerun_recomputes_the_truncated_item_verify_finds(tmp_path, cli, cut):
    """Before: verify said ``re-run to resume`` but the rerun skipped the item as complete;
    only --force repaired it.  A file cut inside its ``.npy`` header (no shape left to
    compare the size with) counts as cut short too."""
    from tests._stores import write_npy_dataset

    manifest = write_npy_dataset(tmp_path / "data", n=6, dim=16)
    command = ["import", "--manifest", manifest, "--from", tmp_path / "data" / "npy",
               "--store", tmp_path / "s", "--name", "fc"]
    cli(*command, check=True)
    stage = Store(tmp_path / "s").resolve("fc")
    victim = stage.item_path("v03")
    victim.write_bytes(victim.read_bytes()[:-20] if cut == "in-its-data" else
                       victim.read_bytes()[:40])
    assert stage.truncated_ids(stage.items.ids) == {"v03"}
    verify = cli("cache", "verify", "--store", tmp_path / "s")
    assert verify.exit_code == 1 and "'v03'" in verify.output
    assert cut == "in-its-header" or "truncated" in verify.output
    again = cli(*command, check=True)
    assert "1 done, 5 skipped" in again.output
    assert "0 problem(s)" in cli("cache", "verify", "--store", tmp_path / "s",
                                 check=True).output
    np.testing.assert_array_equal(stage.read_item("v03"),
                                  np.load(tmp_path / "data" / "npy" / "v03.npy"))


def test_a_stage_folder_without_its_record_is_left_alone_for_its_first_minute(tmp_path):
    """A stage folder without ``stage.json`` may be one being made: ``scan`` and gc leave it
    for ``CREATION_GRACE_S`` (60 s) after its last change, then name and collect it, even
    with ``min_age`` 0 (the boundary pinned either side)."""
    store = Store(tmp_path / "s")
    filled_stage(store, 1)
    now = time.time()
    ages = {"import-" + "a" * 16: 59.5, "import-" + "b" * 16: 60.5}
    for folder, age in ages.items():
        (store.stages_dir / folder).mkdir()
        os.utime(store.stages_dir / folder, (now - age, now - age))
    assert [f for f, _ in store.scan()[1]] == ["import-" + "b" * 16]
    gc(store, min_age=0)
    assert not (store.stages_dir / ("import-" + "b" * 16)).exists()
    assert (store.stages_dir / ("import-" + "a" * 16)).is_dir()
