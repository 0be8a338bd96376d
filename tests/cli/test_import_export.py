"""`featpipe import` from .npy folders, .npz, HDF5 and aeon .ts files; `featpipe export`."""

import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from featpipe.io.export import load_export
from featpipe.manifest import Manifest, from_rows
from tests._stores import named_or_only_stage
from tests.conftest import object_npy_bytes

RNG = np.random.default_rng(0)
TOY_TS = """\
@problemName toy
@timeStamps false
@missing false
@univariate false
@dimensions 2
@equalLength false
@classLabel true up down
@data
1.0,2.0,3.0:4.0,5.0,6.0:up
7.0,8.0:9.0,10.0:down
"""


def write_manifest(folder: Path, ids, labels=None, splits=None) -> Path:
    rows = [(i, f"videos/{i}.avi", [labels[n]] if labels else ["c"],
             [splits[n]] if splits else ["train"]) for n, i in enumerate(ids)]
    path = folder / "m.csv"
    from_rows(rows, folder).write(path)
    return path


def stage_of(store_dir, name="feat"):
    return named_or_only_stage(store_dir, name)


def sequences(ids, dim=3):
    return {i: RNG.normal(size=(2 + n, dim)).astype(np.float32) for n, i in enumerate(ids)}


def test_import_npy_folder_by_id_flat_id_and_manifest_path(tmp_path, store_dir, cli):
    ids = ["run/a", "walk b", "jump/c"]
    data = sequences(ids)
    manifest = write_manifest(tmp_path, ids)
    folder = tmp_path / "npy"
    (folder / "run").mkdir(parents=True)
    (folder / "videos" / "jump").mkdir(parents=True)
    np.save(folder / "run" / "a.npy", data["run/a"])             # <id>.npy
    np.save(folder / "walk_b.npy", data["walk b"])               # flat form of the id
    np.save(folder / "videos" / "jump" / "c.npy", data["jump/c"])  # manifest path, .npy
    result = cli("import", "--manifest", manifest, "--from", folder, "--store", store_dir,
                 "--name", "feat")
    assert result.exit_code == 0, result.output
    assert "summary: 3 done, 0 skipped (already complete), 0 failed" in result.output
    stage = stage_of(store_dir)
    for item_id, array in data.items():
        np.testing.assert_array_equal(stage.read_item(item_id), array)
    assert stage.items.ids == ids and stage.kind == "import"


def test_import_npz_and_h5_then_export_ragged_and_stacked(tmp_path, store_dir, cli):
    ids = ["a/1", "b/2", "é/3"]
    data = sequences(ids, dim=4)
    manifest = write_manifest(tmp_path, ids, labels=["x", "y;z", "x"],
                              splits=["train", "test", ""])
    np.savez(tmp_path / "f.npz", **data)
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        for item_id, array in data.items():
            handle[item_id] = array.astype(np.float64)
    for source, name in ((tmp_path / "f.npz", "fromnpz"), (tmp_path / "f.h5", "fromh5")):
        result = cli("import", "--manifest", manifest, "--from", source, "--store", store_dir,
                     "--name", name)
        assert result.exit_code == 0, result.output
        stage = stage_of(store_dir, name)
        for item_id, array in data.items():
            out = stage.read_item(item_id)
            assert out.dtype == np.float32
            np.testing.assert_array_equal(out, array)
    out = tmp_path / "x.npz"
    result = cli("export", "--store", store_dir, "fromh5", "-o", out)
    assert result.exit_code == 0 and "layout ragged, X (9, 4) float32" in result.output
    with np.load(out, allow_pickle=False) as fields:
        assert all(fields[k].dtype != object for k in fields.files)
        assert str(fields["layout"]) == "ragged"
        np.testing.assert_array_equal(fields["offsets"], [0, 2, 5, 9])
        assert fields["labels"].tolist() == ["x", "y;z", "x"]
        assert fields["classes"].tolist() == ["x", "y", "z"]
        assert fields["splits"].tolist() == [["train"], ["test"], [""]]
    got_ids, items, _ = load_export(out)
    assert got_ids == ids
    for item_id, array in zip(got_ids, items, strict=True):
        np.testing.assert_array_equal(array, data[item_id])


def test_export_stacked_and_incomplete(tmp_path, store_dir, cli):
    ids = [f"i{n}" for n in range(4)]
    vectors = {i: RNG.normal(size=5).astype(np.float32) for i in ids}
    manifest = write_manifest(tmp_path, ids)
    np.savez(tmp_path / "v.npz", **{i: vectors[i] for i in ids[:3]})  # i3 is missing
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "v.npz",
                 "--store", store_dir, "--name", "feat", "--on-error", "skip")
    assert result.exit_code == 1
    assert "failed: i3: not found: no key 'i3' in" in result.output
    # with --on-error skip the name moves all the same, and says so with the stage's folder
    folder = re.search(r"name feat points to stage (import-\w+) with 1 failed item\(s\)",
                       result.output).group(1)
    out = tmp_path / "e.npz"
    result = cli("export", "--store", store_dir, folder, "-o", out)
    assert result.exit_code == 1
    assert "incomplete: 1 of 4 items not computed (first: 'i3')" in result.output
    assert not out.exists()
    result = cli("export", "--store", store_dir, folder, "-o", out, "--partial")
    assert result.exit_code == 0, result.output
    with np.load(out, allow_pickle=False) as fields:
        assert str(fields["layout"]) == "stacked" and fields["X"].shape == (3, 5)
        np.testing.assert_array_equal(fields["X"], np.stack([vectors[i] for i in ids[:3]]))
        assert fields["ids"].tolist() == ids[:3]


def test_ts_files_make_their_own_manifest(tmp_path, store_dir, cli):
    (tmp_path / "toy_TRAIN.ts").write_text(TOY_TS)
    (tmp_path / "toy_TEST.ts").write_text(TOY_TS.replace("7.0,8.0:9.0,10.0:down",
                                                         "1.5,2.5,3.5,4.5:0.5,0.25,0,1:down"))
    written = tmp_path / "out" / "toy.csv"
    result = cli("import", "--from", tmp_path / "toy_TRAIN.ts", "--from",
                 tmp_path / "toy_TEST.ts", "--store", store_dir, "--name", "toy",
                 "--write-manifest", written)
    assert result.exit_code == 0, result.output
    stage = stage_of(store_dir, "toy")
    manifest = Manifest.read(written)
    assert manifest.ids == stage.items.ids == ["toy_TRAIN/0", "toy_TRAIN/1", "toy_TEST/0",
                                               "toy_TEST/1"]
    assert [it.label for it in manifest] == ["up", "down", "up", "down"]
    assert manifest.split_ids(1, "train") == ["toy_TRAIN/0", "toy_TRAIN/1"]
    assert manifest.resolve_path(manifest["toy_TEST/1"]).resolve() == \
        (tmp_path / "toy_TEST.ts").resolve()
    # T x channels, variable length
    np.testing.assert_array_equal(stage.read_item("toy_TRAIN/0"), [[1, 4], [2, 5], [3, 6]])
    np.testing.assert_array_equal(stage.read_item("toy_TRAIN/1"), [[7, 9], [8, 10]])
    np.testing.assert_array_equal(stage.read_item("toy_TEST/1"),
                                  [[1.5, 0.5], [2.5, 0.25], [3.5, 0], [4.5, 1]])
    # the written manifest imports the same items with --manifest (same stage key)
    again = cli("import", "--manifest", written, "--from", tmp_path / "toy_TRAIN.ts",
                "--from", tmp_path / "toy_TEST.ts", "--store", store_dir, "--name", "toy2")
    assert again.exit_code == 0, again.output
    assert "0 done, 4 skipped" in again.output


def test_ts_bundled_basicmotions(tmp_path, store_dir, cli):
    import aeon.datasets
    from aeon.datasets import load_from_ts_file

    folder = Path(aeon.datasets.__file__).parent / "data" / "BasicMotions"
    result = cli("import", "--from", folder / "BasicMotions_TRAIN.ts", "--from",
                 folder / "BasicMotions_TEST.ts", "--store", store_dir, "--name", "bm")
    assert result.exit_code == 0, result.output
    stage = stage_of(store_dir, "bm")
    X, y = load_from_ts_file(str(folder / "BasicMotions_TEST.ts"))
    assert len(stage.items) == 80 and stage.items.classes == sorted(set(y))
    np.testing.assert_allclose(stage.read_item("BasicMotions_TEST/07"), X[7].T, rtol=1e-6)
    assert stage.items["BasicMotions_TEST/07"].label == y[7]


@pytest.mark.parametrize("bad, message", [
    (np.array([[1.0, np.nan], [0.0, 1.0]]), "1 NaN/Inf value(s), first at index (0, 1)"),
    (np.array([[1.0, 2.0], [np.inf, -np.inf]]), "2 NaN/Inf value(s), first at index (1, 0)"),
    (np.ones((3, 5)), "ragged features: shape (3, 5) but the other items are arrays of "
                      "shape (N, 2)"),
    (np.ones(2), "ragged features: shape (2,) but the other items are arrays of shape (N, 2)"),
    (np.zeros((0, 2)), "empty array (shape (0, 2))"),
    (np.array([["a", "b"]]), "non-numeric array (dtype <U1)"),
])
def test_bad_arrays_fail_naming_the_item(tmp_path, store_dir, cli, bad, message):
    ids = ["ok1", "ok2", "bad/item", "ok3"]
    arrays = {i: np.ones((2, 2)) * n for n, i in enumerate(ids)}
    arrays["bad/item"] = bad
    np.savez(tmp_path / "f.npz", **arrays)
    manifest = write_manifest(tmp_path, ids)
    args = ("import", "--manifest", manifest, "--from", tmp_path / "f.npz", "--store",
            store_dir, "--name", "feat")
    result = cli(*args)
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: bad/item: {message}")
    skipped = cli(*args, "--on-error", "skip")
    assert skipped.exit_code == 1
    assert "0 failed" not in skipped.output and "1 failed" in skipped.output
    stage = stage_of(store_dir)
    assert stage.done_ids() == {"ok1", "ok2", "ok3"}
    assert list(stage.failed()) == ["bad/item"] and message in stage.failed()["bad/item"]
    assert not stage.item_path("bad/item").exists()


def test_unreadable_and_missing_sources(tmp_path, store_dir, cli):
    ids = ["a", "b", "c", "d"]
    manifest = write_manifest(tmp_path, ids)
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.ones((2, 3)))
    good = (folder / "a.npy").read_bytes()
    (folder / "b.npy").write_bytes(good[:-5])                  # truncated
    (folder / "c.npy").write_bytes(object_npy_bytes())        # an object array
    result = cli("import", "--manifest", manifest, "--from", folder, "--store", store_dir,
                 "--name", "feat", "--on-error", "skip")
    assert result.exit_code == 1
    failed = stage_of(store_dir).failed()
    assert set(failed) == {"b", "c", "d"}
    assert failed["b"].startswith(f"cannot read {folder / 'b.npy'}")
    assert "Object arrays cannot be loaded" in failed["c"]
    assert failed["d"].startswith(f"not found: none of {folder / 'd.npy'}")
    if os.getuid() != 0:  # root reads anything
        (folder / "a.npy").chmod(0)
        result = cli("import", "--manifest", manifest, "--from", folder, "--store",
                     store_dir / "2", "--name", "feat")
        assert result.exit_code == 1 and "Permission denied" in result.output
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    result = cli("import", "--manifest", manifest, "--from", broken, "--store", store_dir,
                 "--name", "x")
    assert result.exit_code == 1 and f"--from {broken}: not a readable .npz" in result.output
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "nope.h5", "--store",
                 store_dir, "--name", "x")
    assert result.exit_code == 1 and "no such file or folder" in result.output


def test_import_usage_errors(tmp_path, store_dir, cli):
    np.savez(tmp_path / "f.npz", a=np.ones(2))
    result = cli("import", "--from", tmp_path / "f.npz", "--store", store_dir, "--name", "x")
    assert result.exit_code == 2 and "--manifest is required" in result.output
    bad = tmp_path / "bad.csv"
    bad.write_text("id,path,label,split1\na,a,l,train\na,b,l,test\n")
    result = cli("import", "--manifest", bad, "--from", tmp_path / "f.npz", "--store",
                 store_dir, "--name", "x")
    assert result.exit_code == 1 and "line 3: duplicate id 'a'" in result.output


def test_dry_run_lists_the_work_and_leaves_names_alone(tmp_path, store_dir, cli):
    ids = ["a", "b"]
    manifest = write_manifest(tmp_path, ids)
    np.savez(tmp_path / "f.npz", a=np.ones((2, 2)), b=np.ones((3, 2)))
    args = ("import", "--manifest", manifest, "--from", tmp_path / "f.npz", "--store",
            store_dir, "--name", "feat")
    assert cli(*args).exit_code == 0
    before = stage_of(store_dir)
    result = cli(*args, "--dtype", "float16", "--dry-run")
    assert result.exit_code == 0
    assert "would compute a\nwould compute b\ndry run: 2 to compute" in result.output
    assert stage_of(store_dir) == before
    again = cli(*args, "--dry-run")
    assert "dry run: 0 to compute, 2 already complete" in again.output


def test_two_items_reading_one_npy_file_is_refused_and_ints_become_floats(tmp_path, store_dir,
                                                                         cli):
    folder = tmp_path / "npy"
    (folder / "videos").mkdir(parents=True)
    np.save(folder / "videos" / "y.npy", np.arange(6).reshape(3, 2))  # int64 on disk
    rows = [("x", "videos/y.avi", ["a"], ["train"]), ("videos/y", "other.avi", ["a"], ["test"])]
    from_rows(rows, tmp_path).write(tmp_path / "m.csv")
    result = cli("import", "--manifest", tmp_path / "m.csv", "--from", folder, "--store",
                 store_dir, "--name", "feat")
    assert result.exit_code == 1
    assert f"items 'x' and 'videos/y' would both read {folder / 'videos' / 'y.npy'}" in \
        result.output
    from_rows(rows[1:], tmp_path).write(tmp_path / "m.csv")
    result = cli("import", "--manifest", tmp_path / "m.csv", "--from", folder, "--store",
                 store_dir, "--name", "feat")
    assert result.exit_code == 0, result.output
    out = stage_of(store_dir).read_item("videos/y")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[0, 1], [2, 3], [4, 5]])
