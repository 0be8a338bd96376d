"""A store under attack or damage: names that point outside it, disk full, read-only, and the
corruption `cache ls/verify/gc`, `status` and `export` exist to report (issue 16: 4, 7, 8)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

from featpipe.errors import FeatpipeError, WriteError
from featpipe.fileio import atomic_write_bytes
from featpipe.manifest import from_rows
from featpipe.store import Store
from featpipe.store.pack import pack_stage
from tests.conftest import one_line_error


def make_stage(store: Store, kind: str, n: int = 3, name: str | None = None, shape=(4, 3)):
    items = from_rows([(f"{kind}{i}", "", ["c"], ["train"]) for i in range(n)], store.root)
    stage = store.stage(kind, {"n": n}, items=items)
    for i in range(n):
        stage.write_item(f"{kind}{i}", np.full(shape, i, np.float32))
    if name:
        store.set_name(name, stage)
    return stage


def tmp_files(root) -> list:
    return [p for p in root.rglob("*.tmp.*")]


# -- 4: names stay inside their store --------------------------------------------------------
def test_16_4_a_name_pointing_outside_its_store_is_never_followed(tmp_path, cli):
    victim = Store(tmp_path / "other")
    theirs = make_stage(victim, "import", name="theirs")
    loose = sorted(theirs.path.rglob("*.npy"))
    mine = Store(tmp_path / "mine")
    make_stage(mine, "encode", name="ok")
    (mine.names_dir / "evil").write_text(f"../../other/stages/{theirs.name}\n")

    pack = cli("cache", "pack", "--store", mine.root, "evil")
    assert "not a stage folder of this store" in one_line_error(pack)
    assert sorted(theirs.path.rglob("*.npy")) == loose and not (theirs.path / "packed").exists()
    with pytest.raises(FeatpipeError, match="names never point outside"):
        mine.resolve("evil")
    with pytest.raises(FeatpipeError, match="is not a stage folder name"):
        mine.stage_by_folder(f"../../other/stages/{theirs.name}")
    ls = cli("cache", "ls", "--store", mine.root)
    assert ls.exit_code == 1 and "ok" in ls.stdout and "problem: name 'evil'" in ls.stderr
    gc = cli("cache", "gc", "--store", mine.root, "--min-age", "0")
    assert gc.exit_code == 1 and "gc removes no stage" in gc.stderr
    assert theirs.path.exists() and len(mine.all_stages()) == 1


def test_16_4_stage_metadata_naming_inputs_outside_the_store_is_corrupt(tmp_path, cli):
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode", name="enc")
    meta = json.loads((stage.path / "stage.json").read_text())
    meta["inputs"] = ["../../../etc"]
    (stage.path / "stage.json").write_text(json.dumps(meta))
    proc = cli("cache", "show", "--store", store.root, "enc")
    assert "'inputs' must list stage folders" in one_line_error(proc)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda meta: [meta], "not a JSON object but list"),
    (lambda meta: dict(meta, key="0" * 16), "not the folder"),
    (lambda meta: dict(meta, dtype="int32"), "'dtype' must be a floating dtype"),
    (lambda meta: dict(meta, params=[]), "'params' missing or not a dict"),
    (lambda meta: meta, "its checksum is missing, and it was written with checksums"),
])
def test_stage_metadata_that_describes_no_stage_of_its_folder_is_corrupt(tmp_path, change,
                                                                           reason):
    """``stage.json`` written unsealed (a store before checksums, or a hand's edit): what it
    says is checked against its folder before it is believed."""
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode", name="enc")
    meta = json.loads((stage.path / "stage.json").read_text())
    meta.pop("crc32", None)
    (stage.path / "stage.json").write_text(json.dumps(change(meta)))
    with pytest.raises(FeatpipeError, match=re.escape(reason)):
        store.resolve("enc")


# -- 8: corruption is reported, one stage at a time --------------------------------------------
@pytest.fixture
def damaged(tmp_path):
    """A store with one healthy stage and one of each kind of damage."""
    store = Store(tmp_path / "s")
    healthy = make_stage(store, "healthy", name="healthy")
    huge = make_stage(store, "huge", name="huge")
    with open(huge.item_path("huge1"), "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 3)})
        handle.write(b"\0" * 48)
    packed = make_stage(store, "packed", name="packed")
    pack_stage(packed)
    shard = next((packed.path / "packed").glob("shard-*.h5"))
    shard.write_bytes(shard.read_bytes()[:300])
    keyless = make_stage(store, "keyless", name="keyless")
    meta = json.loads((keyless.path / "stage.json").read_text())
    del meta["params"]
    (keyless.path / "stage.json").write_text(json.dumps(meta))
    listed = make_stage(store, "listed")
    (listed.path / "stage.json").write_text("[1, 2]")
    timeless = make_stage(store, "timeless", name="timeless")
    with open(next((timeless.path / "ledger").glob("*.jsonl")), "a") as handle:
        handle.write('{"id": "timeless9", "status": "done", "seconds": 0.1, "error": null, '
                     '"time": null}\n')
    return store, {s.kind: s for s in (healthy, huge, packed, keyless, listed, timeless)}


def test_16_8_ls_verify_gc_report_each_broken_stage_and_go_on(damaged, cli):
    store, stages = damaged
    ls = cli("cache", "ls", "--store", store.root)
    assert ls.exit_code == 1 and "Traceback" not in ls.stderr
    listed = {line.split()[1] for line in ls.stdout.splitlines()[1:]}
    assert {stages["healthy"].name, stages["huge"].name, stages["timeless"].name} <= listed
    problems = [line for line in ls.stderr.splitlines() if line.startswith("problem: ")]
    assert any(stages["packed"].name in p and "unreadable packed file" in p for p in problems)
    assert any(stages["keyless"].name in p and "'params' missing" in p for p in problems)
    assert any(stages["listed"].name in p and "not a JSON object" in p for p in problems)

    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1 and "Traceback" not in verify.stderr
    out = verify.stdout
    assert f"ok: stage {stages['healthy'].name}: 3 items checked" in out
    assert f"problem: stage {stages['huge'].name}: item 'huge1': unreadable (" in out
    assert "header declares shape (1000000000000, 3) float32" in out
    assert f"problem: stage {stages['packed'].name}: packed files: unreadable packed file" \
        in out
    assert f"problem: stage {stages['timeless'].name}: ledger " in out
    assert "'time' must be a number, got None" in out
    assert f"problem: stage {stages['keyless'].name}: " in out
    assert f"problem: stage {stages['listed'].name}: " in out
    assert "verified " in out and "in 6 stages" in out

    gc = cli("cache", "gc", "--store", store.root, "--min-age", "0")
    assert gc.exit_code == 1 and "Traceback" not in gc.stderr
    assert stages["listed"].path.exists()  # an unreadable stage is never removed blindly


def test_16_8_status_export_and_show_give_one_line_on_damage(damaged, tmp_path, cli):
    store, stages = damaged
    status = cli("status", "--store", store.root, "timeless")
    assert status.exit_code == 0 and "items: 3 total, 3 done" in status.stdout, status.stderr
    export = cli("export", "--store", store.root, "huge", "-o", tmp_path / "x.npz")
    assert one_line_error(export).startswith("error: huge1: unreadable array ")
    assert not (tmp_path / "x.npz").exists() and not tmp_files(tmp_path)
    for args in (["status", "--store", store.root, "packed"],
                 ["cache", "show", "--store", store.root, "keyless"]):
        assert one_line_error(cli(*args))
    with pytest.raises(FeatpipeError, match="huge1: unreadable array"):
        stages["huge"].read_item("huge1")


# -- 7: disk full and read-only stores ----------------------------------------------------------
def test_16_7_a_failed_ledger_append_leaves_no_partial_line(tmp_path, monkeypatch):
    store = Store(tmp_path / "s")
    stage = make_stage(store, "import", n=2)
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    size = ledger.stat().st_size
    real_write = os.write

    def half_then_full(fd, data):
        return real_write(fd, data[:len(data) // 2])  # a short write: the disk filled up

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(WriteError, match=r"cannot write .*\.jsonl: No space left on device "
                                         r"\(disk full\)"):
        stage.record("import0", "failed", error="first")
    monkeypatch.setattr(os, "write", real_write)
    assert ledger.stat().st_size == size
    stage.record("import1", "failed", error="later")
    assert all(json.loads(line) for line in ledger.read_text().splitlines())
    assert stage.ledger_problems() == []


def test_16_7_a_failed_atomic_write_removes_its_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "name"
    atomic_write_bytes(target, b"old")

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(WriteError, match="cannot write .*name: No space left on device"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and not tmp_files(tmp_path)


@contextlib.contextmanager
def mounted(*args):
    """Mount (``mount ARGS... TARGET``) for the test, or skip where mounting is not allowed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a file system needs root")
    target = args[-1]
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_16_7_disk_full_gives_one_line_keeps_what_is_recorded_and_resumes(tmp_path, cli):
    from tests._stores import write_npy_dataset

    manifest = write_npy_dataset(tmp_path / "data", n=12, dim=2000)  # ~40-90 KiB per item
    with mounted("-t", "tmpfs", "-o", "size=320k", "tmpfs", tmp_path / "disk") as disk:
        store = disk / "s"
        full = cli("import", "--manifest", manifest, "--from", tmp_path / "data" / "npy",
                   "--store", store, "--name", "fc")
        line = one_line_error(full)
        assert "No space left on device (disk full)" in line and "re-run the same command" in line
        assert not tmp_files(disk)
        stage = Store(store).all_stages()[0]
        assert stage.ledger_problems() == []
        kept = stage.done_ids()
        assert 0 < len(kept) < 12
        assert all(stage.read_item(i).shape[1] == 2000 for i in kept)
        verify = cli("cache", "verify", "--store", store, check=True)
        assert "0 problem(s)" in verify.stdout
        export = cli("export", "--store", store, stage.name, "--partial", "-o",
                     disk / "x.npz")
        assert "No space left on device" in one_line_error(export)
        assert not tmp_files(disk) and not (disk / "x.npz").exists()
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        again = cli("import", "--manifest", manifest, "--from", tmp_path / "data" / "npy",
                    "--store", store, "--name", "fc", check=True)
        assert f"{12 - len(kept)} done, {len(kept)} skipped" in again.stdout


def test_16_7_a_read_only_store_is_read_and_refuses_writes_in_one_line(tmp_path, cli):
    from tests._stores import write_npy_dataset

    manifest = write_npy_dataset(tmp_path / "data", n=4)
    cli("import", "--manifest", manifest, "--from", tmp_path / "data" / "npy",
        "--store", tmp_path / "s", "--name", "fc", check=True)
    other = make_stage(Store(tmp_path / "s"), "orphan")
    with mounted("--bind", tmp_path / "s", tmp_path / "ro") as ro:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        for args in (["cache", "ls"], ["cache", "verify"], ["status", "fc"],
                     ["cache", "show", "fc"]):
            proc = cli(args[0], *args[1:], "--store", ro)
            assert proc.exit_code == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        exported = cli("export", "--store", ro, "fc", "-o", tmp_path / "fc.npz", check=True)
        assert "wrote" in exported.stdout
        for args in (["encode", "--store", ro, "--input", "fc", "--method", "avg"],
                     ["cache", "pack", "--store", ro, "fc"],
                     ["cache", "gc", "--store", ro, "--min-age", "0"]):
            line = one_line_error(cli(*args))
            assert "Read-only file system" in line, args
        # logs/: the one folder of a store open to other files
        export = cli("export", "--store", ro, "fc", "-o", ro / "logs" / "x.npz")
        assert "read-only file system" in one_line_error(export, code=2)
        build = cli("manifest", "build", tmp_path / "data" / "npy", "--ext", ".npy", "-o",
                    ro / "new" / "m.csv")
        assert one_line_error(build) == f"error: cannot write {ro / 'new'}: Read-only file " \
                                        "system"
    assert other.path.exists()


def test_probe_half_created_and_hostile_stage_folders(tmp_path):
    """Found by the probe: a stage folder being created is not a problem, an old one without
    stage.json is; a stage.json declaring an object dtype is corrupt, not a stage."""
    store = Store(tmp_path / "s")
    make_stage(store, "healthy", name="ok")
    creating = store.stages_dir / "encode-0123456789abcdef"
    creating.mkdir()
    assert store.scan()[1] == []
    old = time.time() - 3600
    os.utime(creating, (old, old))
    assert store.scan()[1] == [(creating.name, "stage.json missing")]
    shutil.rmtree(creating)
    hostile = make_stage(store, "hostile")
    meta = json.loads((hostile.path / "stage.json").read_text())
    (hostile.path / "stage.json").write_text(json.dumps(dict(meta, dtype="object")))
    (folder, reason), = store.scan()[1]
    assert folder == hostile.name and "'dtype' must be a floating dtype" in reason


def test_stage_metadata_that_is_not_json_or_not_a_file_is_named(tmp_path):
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode", name="enc")
    meta = stage.path / "stage.json"
    meta.write_bytes(meta.read_bytes()[:40])
    with pytest.raises(FeatpipeError, match=r"stage.json: corrupt stage metadata \(.* \(char"):
        store.resolve("enc")
    meta.unlink()
    meta.mkdir()  # what a bad copy or a hand can leave: a folder where the file was
    with pytest.raises(FeatpipeError, match="stage.json: unreadable"):
        store.resolve("enc")


def _old_store_stage(tmp_path):
    """A stage whose ``stage.json`` is as stores before checksums wrote it."""
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode", name="enc")
    meta = json.loads((stage.path / "stage.json").read_text())
    old = {k: v for k, v in meta.items() if k not in ("checksums", "files", "crc32")}
    (stage.path / "stage.json").write_text(json.dumps(old))
    return store, stage


def test_an_old_stores_item_list_is_checked_as_a_manifest(tmp_path):
    store, stage = _old_store_stage(tmp_path)
    (stage.path / "items.csv").write_text("id,path,label,split1\na,,c,train\na,,c,test\n")
    with pytest.raises(FeatpipeError, match=r"manifest .*items\.csv, .*a"):
        assert store.resolve("enc").items is None  # never reached: it raises


def test_an_unreadable_ledger_is_named_and_its_lines_do_not_count(tmp_path):
    store, stage = _old_store_stage(tmp_path)
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    ledger.unlink()
    ledger.mkdir()  # a folder where the ledger was: reading it fails
    again = store.resolve("enc")
    assert again.ledger_problems(fresh=True) == [f"ledger {ledger.name} line 0: unreadable "
                                                 "(Is a directory)"]
    assert again.done_ids() == set()


def test_an_item_file_that_cannot_be_opened_counts_as_cut_short(tmp_path):
    """``truncated_ids`` (what a rerun recomputes) takes an item whose file cannot be opened
    as one cut short; a missing file is not (it is packed, or not computed)."""
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode")
    stage.item_path("encode0").unlink()
    stage.item_path("encode0").mkdir()
    stage.item_path("encode1").unlink()
    assert stage.truncated_ids(["encode0", "encode1", "encode2"]) == {"encode0"}


def test_an_item_list_that_cannot_be_read_is_one_error_naming_it(tmp_path):
    store = Store(tmp_path / "s")
    stage = make_stage(store, "encode", name="enc")
    (stage.path / "items.csv").unlink()
    (stage.path / "items.csv").mkdir()
    with pytest.raises(FeatpipeError, match=r"items\.csv is unreadable"):
        assert store.resolve("enc").items is None  # never reached: it raises


def test_a_folder_without_stage_json_is_no_stage(tmp_path):
    from featpipe.store import Stage

    with pytest.raises(FeatpipeError, match=r"no stage at .* \(stage.json missing\)"):
        Stage(tmp_path / "stages" / ("import-" + "0" * 16))


def test_ledgers_are_readable_by_the_group_and_others(tmp_path):
    """A store on a cluster's shared disk is read by other users' jobs (status, export):
    ledger files are created 0644 (under the usual umask 022)."""
    old = os.umask(0o022)
    try:
        stage = make_stage(Store(tmp_path / "s"), "encode")
    finally:
        os.umask(old)
    (ledger,) = (stage.path / "ledger").glob("*.jsonl")
    assert ledger.stat().st_mode & 0o777 == 0o644
