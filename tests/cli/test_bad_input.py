"""Bad input, as a new user and a hostile one would give it: one clear line, the right item.

Each test is a regression test of issue 16 (the item number is in its name) or of the same
class of bug found by probing the command line.
"""

from __future__ import annotations

import os
import sys
import zipfile

import h5py
import numpy as np
import pytest

from featpipe.errors import FeatpipeError
from featpipe.manifest import Manifest, from_rows
from featpipe.store import Store
from tests._stores import make_old
from tests.conftest import object_npy_bytes, one_line_error


def huge_npy(path, shape=(10**12, 3)):
    """An .npy whose header declares ``shape`` but which holds 72 bytes of data."""
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f8", "fortran_order": False, "shape": shape})
        handle.write(b"\0" * 72)


def npy_dataset(folder, n=6, extra_rows=()):
    """``n`` good (5, 3) items in ``folder/npy`` and a manifest listing them first."""
    (folder / "npy").mkdir(parents=True, exist_ok=True)
    rows = ["id,path,label,split1"]
    for i in range(n):
        np.save(folder / "npy" / f"ok{i}.npy", np.full((5, 3), i, np.float32))
        rows.append(f"ok{i},x,c{i % 2},{'train' if i % 2 else 'test'}")
    rows.extend(extra_rows)
    (folder / "m.csv").write_text("\n".join(rows) + "\n")
    return folder / "m.csv"


# -- 2 and 9: ids and labels -----------------------------------------------------------------
@pytest.mark.parametrize("row, problem", [
    ('"v2\x00",a,c,train', r"id 'v2\x00' contains a control character (U+0000)"),
    ('v3,a,"a\x00",train', r"label 'a\x00' of 'v3' contains a control character (U+0000)"),
    ('"a\rb",a,c,train', r"id 'a\rb' contains a control character (U+000D)"),
    ('"a\nb",a,c,train', r"id 'a\nb' contains a control character (U+000A)"),
])
def test_16_2_and_9_control_characters_in_ids_and_labels_are_refused_with_the_line(
        tmp_path, row, problem, cli):
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(("id,path,label,split1\nv2,a,c,train\n" + row + "\n").encode())
    check = cli("manifest", "check", manifest, "--no-files")
    assert check.exit_code == 1 and f"{manifest}:3: {problem}" in check.stdout, check.stdout
    np.save(tmp_path / "v2.npy", np.ones(3))
    imported = cli("import", "--manifest", manifest, "--from", tmp_path,
                   "--store", tmp_path / "s", "--name", "x")
    assert f"line 3: {problem}" in one_line_error(imported)
    assert not (tmp_path / "s").exists()  # refused before any stage exists


def test_16_9_quoted_carriage_return_in_a_path_is_kept_and_crlf_files_still_parse(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(b'id,path,label,split1\r\nx,"dir\rname.avi",c,train\r\ny,b,c,test\r\n')
    parsed = Manifest.read(manifest)
    assert parsed.ids == ["x", "y"]
    assert parsed["x"].path == "dir\rname.avi"  # not dir\nname.avi
    assert parsed["y"].splits == ("test",)


def test_16_2_built_manifests_refuse_control_characters_and_undecodable_names(tmp_path, cli):
    with pytest.raises(FeatpipeError, match=r"id 'a\\nb' \(from 'a\\nb.avi'\) contains a "
                                            r"control character \(U\+000A\)"):
        from_rows([("a\nb", "a\nb.avi", ["c"], [""])], tmp_path)
    with pytest.raises(FeatpipeError, match=r"label 'x\\x00' of 'v' contains"):
        from_rows([("v", "v.avi", ["x\0"], [""])], tmp_path)
    data = tmp_path / "videos" / "run"
    data.mkdir(parents=True)
    (data / "ok.avi").write_bytes(b"x")
    with open(os.path.join(os.fsencode(data), b"caf\xe9.avi"), "wb") as handle:  # latin-1
        handle.write(b"x")
    built = cli("manifest", "build", tmp_path / "videos", "-o", tmp_path / "m.csv")
    assert "is not valid UTF-8" in one_line_error(built)
    assert not (tmp_path / "m.csv").exists()


# -- 6: a huge declared shape fails its own item only ------------------------------------------
def test_16_6_huge_npy_header_fails_only_its_item_and_names_it(tmp_path, cli):
    manifest = npy_dataset(tmp_path, extra_rows=["huge,x,c0,train"])
    huge_npy(tmp_path / "npy" / "huge.npy")
    skip = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
               tmp_path / "s", "--name", "imp", "--on-error", "skip")
    assert skip.exit_code == 1 and "Traceback" not in skip.stderr
    assert "summary: 6 done, 0 skipped (already complete), 1 failed" in skip.stdout
    failed = [line for line in skip.stderr.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 1 and failed[0].startswith("failed: huge: cannot read ")
    assert "header declares shape (1000000000000, 3) float64" in failed[0]
    assert "MemoryError" not in skip.stderr
    fail = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
               tmp_path / "s2", "--name", "imp")
    assert one_line_error(fail).startswith("error: huge: cannot read ")


def test_16_6_huge_shapes_in_npz_hdf5_and_mat_sources_fail_their_own_item(tmp_path, cli):
    manifest = npy_dataset(tmp_path, n=3, extra_rows=["huge,x,c0,train"])
    huge_npy(tmp_path / "huge.npy")
    arrays = {f"ok{i}": np.full((5, 3), i, np.float32) for i in range(3)}
    np.savez(tmp_path / "src.npz", **arrays)
    import zipfile

    with zipfile.ZipFile(tmp_path / "src.npz", "a") as archive:
        archive.write(tmp_path / "huge.npy", "huge.npy")
    with h5py.File(tmp_path / "src.h5", "w") as handle:
        for key, value in arrays.items():
            handle[key] = value
        handle.create_dataset("huge", shape=(10**12, 3), dtype="f8")  # declared, not stored
    with h5py.File(tmp_path / "src.mat", "w", userblock_size=512) as handle:  # MATLAB v7.3
        for key, value in arrays.items():
            handle.create_dataset(key, data=value.T).attrs["MATLAB_class"] = np.bytes_("single")
        handle.create_dataset("huge", shape=(3, 10**12), dtype="f8").attrs["MATLAB_class"] = \
            np.bytes_("double")
    with open(tmp_path / "src.mat", "r+b") as handle:
        handle.write(b"MATLAB 7.3 MAT-file, HDF5 schema 1.00 .".ljust(116, b" "))
    for source in ("src.npz", "src.h5", "src.mat"):
        proc = cli("import", "--manifest", manifest, "--from", tmp_path / source,
                   "--store", tmp_path / source.replace(".", "_"), "--name", "imp",
                   "--on-error", "skip")
        assert "summary: 3 done, 0 skipped (already complete), 1 failed" in proc.stdout, \
            proc.stderr
        failed = [line for line in proc.stderr.splitlines() if line.startswith("failed: ")]
        assert len(failed) == 1 and failed[0].startswith("failed: huge: "), failed
        assert "1000000000000" in failed[0] and "MemoryError" not in failed[0]
        assert "Traceback" not in proc.stderr


def test_16_6_any_exception_of_one_item_stays_with_that_item(tmp_path):
    """The same class of bug in the executor: a compute that raises for a whole batch."""
    from featpipe.parallel import ItemOutput, run_items

    class RaisesOnBad:
        def __call__(self, ids):
            if "bad" in ids:
                raise MemoryError("Unable to allocate 21.8 TiB")
            return [ItemOutput(np.ones(2)) for _ in ids]

    items = from_rows([(i, "", ["c"], ["train"]) for i in ("a", "bad", "c")], tmp_path)
    stage = Store(tmp_path / "s").stage("probe", {}, items=items)
    summary = run_items(stage, items.ids, RaisesOnBad(), on_error="skip", batch_size=3)
    assert summary.done == 2 and list(summary.failed) == ["bad"]
    assert summary.failed["bad"].startswith("MemoryError")
    with pytest.raises(FeatpipeError, match=r"^bad: MemoryError"):
        run_items(stage, items.ids, RaisesOnBad(), force=True, batch_size=3)


# -- 12: tracebacks instead of one line ----------------------------------------------------------
def test_16_12_a_5000_character_id_in_an_npy_folder_is_one_line(tmp_path, cli):
    manifest = npy_dataset(tmp_path, n=2, extra_rows=["x" * 5000 + ",x,c0,train"])
    proc = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
               tmp_path / "s", "--name", "imp", "--on-error", "skip")
    assert "summary: 2 done, 0 skipped (already complete), 1 failed" in proc.stdout, proc.stderr
    assert "file name too long" in proc.stderr and "Traceback" not in proc.stderr


def test_16_12_an_empty_hdf5_dataset_is_one_line_naming_the_item(tmp_path, cli):
    manifest = npy_dataset(tmp_path, n=2, extra_rows=["empty,x,c0,train"])
    with h5py.File(tmp_path / "src.h5", "w") as handle:
        handle["ok0"] = np.ones((5, 3))
        handle["ok1"] = np.ones((5, 3))
        handle.create_dataset("empty", data=h5py.Empty("f8"))
    proc = cli("import", "--manifest", manifest, "--from", tmp_path / "src.h5", "--store",
               tmp_path / "s", "--name", "imp")
    assert one_line_error(proc).startswith("error: empty: ")
    assert "h5py.Empty" in proc.stderr


def test_16_12_an_object_array_in_a_stored_model_is_one_line(tmp_path, cli):
    store = Store(tmp_path / "s")
    stage = store.stage("standardize", {"split": 1})
    stage.save_model("scaler", {"mean": np.zeros(3)}, {"n": 3})
    with zipfile.ZipFile(stage.path / "models" / "scaler.npz", "w") as archive:
        archive.writestr("mean.npy", object_npy_bytes())
    with pytest.raises(FeatpipeError, match=r"model 'scaler' .* is damaged: .* checksum"):
        stage.load_model("scaler")  # the checksum taken at save time finds it first
    make_old(store.root, item_sums=False)  # a model saved before checksums
    stage = store.stage_by_folder(stage.name)
    with pytest.raises(FeatpipeError, match=r"array 'mean' .* is an object array \(featpipe "
                                            r"never unpickles\)"):
        stage.load_model("scaler")
    store.set_name("std", stage)
    shown = cli("cache", "show", "--store", store.root, "std")
    assert "object array" in one_line_error(shown)


def test_16_12_an_unwritable_report_path_is_a_usage_error_before_any_work(tmp_path, cli):
    (tmp_path / "a_file").write_text("x")
    proc = cli("classify", "--store", tmp_path / "s", "--input", "enc", "--report",
               tmp_path / "a_file" / "r.json")
    line = one_line_error(proc, code=2)
    assert line.startswith("error: --report cannot write ") and "is a file" in line
    assert proc.stdout == ""  # nothing was computed and then lost


# -- 13: exit 0 where something is wrong --------------------------------------------------------
def test_16_13_empty_ts_file_and_empty_manifest_fail(tmp_path, cli):
    (tmp_path / "E_TRAIN.ts").write_text("")
    proc = cli("import", "--from", tmp_path / "E_TRAIN.ts", "--store", tmp_path / "s",
               "--name", "e")
    assert "holds no cases" in one_line_error(proc)
    (tmp_path / "m.csv").write_text("id,path,label,split1\n")
    (tmp_path / "npy").mkdir()
    proc = cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "npy",
               "--store", tmp_path / "s", "--name", "e")
    assert "has no items" in one_line_error(proc)


def test_16_13_cache_commands_on_a_store_that_does_not_exist_fail(tmp_path, cli):
    for args in (["verify"], ["ls"], ["gc"]):
        proc = cli("cache", *args, "--store", tmp_path / "nope")
        assert one_line_error(proc) == f"error: no store at {tmp_path / 'nope'}: the folder " \
                                       "does not exist"
    (tmp_path / "not_a_store").mkdir()
    (tmp_path / "not_a_store" / "thesis.tex").write_text("x")
    proc = cli("cache", "verify", "--store", tmp_path / "not_a_store")
    assert "is not a featpipe store" in one_line_error(proc)


# -- 16: --jobs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("jobs", ["0", "-5"])
def test_16_16_jobs_zero_or_below_minus_one_is_a_usage_error_before_any_stage(tmp_path, jobs, cli):
    manifest = npy_dataset(tmp_path, n=2)
    proc = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
               tmp_path / "s", "--name", "imp", "--jobs", jobs)
    assert one_line_error(proc, code=2) == (f"error: --jobs must be a positive number of "
                                            f"processes or -1 (one per core), got {jobs}")
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_16_16_jobs_above_the_available_cores_is_capped_with_a_warning(tmp_path):
    import subprocess

    from tests.conftest import REPO

    cpu = min(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "tests._computes", "sleepy", "--store", str(tmp_path / "s"),
         "--items", "8", "--sleep", "0.1", "--jobs", "3"], capture_output=True, text=True,
        env=env, cwd=REPO, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--jobs 3 is more than the 1 core(s) available to this process; using 1" in \
        proc.stderr
    ledgers = list((tmp_path / "s" / "stages").glob("sleepy-*/ledger/*.jsonl"))
    assert len(ledgers) == 1  # one process computed every item: no 3 workers on 1 core


# -- 17: dry runs create nothing ----------------------------------------------------------------
def test_16_17_dry_run_creates_no_stage_folder(tmp_path, cli):
    manifest = npy_dataset(tmp_path, n=3)
    store = tmp_path / "s"
    dry = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
              "--name", "imp", "--dry-run")
    assert dry.exit_code == 0 and "dry run: 3 to compute, 0 already complete" in dry.output
    assert not store.exists()
    assert cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
               "--name", "imp").exit_code == 0
    before = sorted(p.name for p in (store / "stages").iterdir())
    dry = cli("encode", "--store", store, "--input", "imp", "--method", "avg", "--name", "avg",
              "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 3 to compute, 0 already complete" in dry.output
    assert sorted(p.name for p in (store / "stages").iterdir()) == before
    assert not (store / "names" / "avg").exists()
    done = cli("encode", "--store", store, "--input", "imp", "--method", "avg", "--name", "avg")
    assert done.exit_code == 0
    again = cli("encode", "--store", store, "--input", "imp", "--method", "avg", "--dry-run")
    assert "dry run: 0 to compute, 3 already complete" in again.output
    before = sorted(p.name for p in (store / "stages").iterdir())
    from featpipe.stages import fit_standardize

    planned = fit_standardize(Store(store), "imp", name="std", dry_run=True)  # `run --dry-run`
    assert not planned.exists and not planned.path.exists()
    assert sorted(p.name for p in (store / "stages").iterdir()) == before


def test_probe_the_same_source_twice_is_a_usage_error(tmp_path, cli):
    manifest = npy_dataset(tmp_path, n=2)
    proc = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--from",
               tmp_path / "npy", "--store", tmp_path / "s", "--name", "x")
    assert one_line_error(proc, code=2) == f"error: --from {tmp_path / 'npy'} is given more " \
                                           "than once"
    assert not (tmp_path / "s").exists()
