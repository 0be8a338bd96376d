"""The formats labs hold features in: MATLAB .mat import (v5, v7.3, folders of per-video files,
orientation), and export to .npz, HDF5 and .mat with sidecars, checked against scipy.io and
h5py directly."""

from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io

from featpipe.io import matlab
from featpipe.io.export import load_export
from featpipe.manifest import Manifest, ManifestItem
from featpipe.store import Store

RNG = np.random.default_rng(0)
IDS = ["run/a", "run/b", "walk/c", "walk/d"]


def write_manifest(folder: Path, ids=IDS) -> Path:
    path = folder / "m.csv"
    rows = [f"{i},,{i.split('/')[0]},{'train' if n % 2 == 0 else 'test'}"
            for n, i in enumerate(ids)]
    path.write_text("id,path,label,split1\n" + "\n".join(rows) + "\n")
    return path


def frames(ids=IDS, dim=3):
    """T x D sequences of different lengths (one frame per row, as VideoDarwin's data)."""
    return {item_id: RNG.normal(size=(4 + n, dim)) for n, item_id in enumerate(ids)}


def write_v73(path: Path, variables: dict[str, np.ndarray]) -> None:
    """A MATLAB v7.3 file as MATLAB writes one: HDF5 behind a 512-byte text header, each
    variable a dataset holding the column-major data (so h5py sees the transpose) with its
    MATLAB_class attribute."""
    with h5py.File(path, "w", userblock_size=512) as handle:
        for name, value in variables.items():
            node = handle.create_dataset(name, data=np.asarray(value).T)
            node.attrs["MATLAB_class"] = np.bytes_("double")
        cell = handle.create_dataset("names", shape=(1, 2), dtype=h5py.ref_dtype)
        cell.attrs["MATLAB_class"] = np.bytes_("cell")  # a cell array: not read as an item
    with open(path, "r+b") as handle:
        handle.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Nov 23 2026 "
                     b"HDF5 schema 1.00 .".ljust(116, b" "))


def imported(store_dir, name):
    return Store(store_dir).resolve(name)


@pytest.mark.parametrize("version", ["v5", "v7.3"])
def test_import_one_mat_file_with_a_variable_per_item(tmp_path, version, cli):
    data = frames()
    manifest = write_manifest(tmp_path)
    source = tmp_path / "feats.mat"
    variables = {matlab.matlab_name(i): a for i, a in data.items()}  # run_a, run_b, ...
    if version == "v5":
        scipy.io.savemat(source, {**variables, "note": "made in MATLAB"})
    else:
        write_v73(source, variables)
        assert h5py.File(source, "r")["run_a"].shape == (3, 4)  # D x T as h5py sees it
    result = cli("import", "--manifest", manifest, "--from", source,
                 "--store", tmp_path / "s", "--name", "f", check=True)
    assert "summary: 4 done" in result.stdout
    assert "one frame per row (T x D)" in result.stdout and "warning" not in result.stderr
    stage = imported(tmp_path / "s", "f")
    for item_id, array in data.items():
        np.testing.assert_allclose(stage.read_item(item_id), array, rtol=1e-6)


def test_import_a_folder_of_per_video_mat_files_and_transpose(tmp_path, cli):
    data = frames()
    manifest = write_manifest(tmp_path)
    folder = tmp_path / "mats"
    for item_id, array in data.items():
        (folder / item_id).parent.mkdir(parents=True, exist_ok=True)
        # VLFeat-style: one frame per column (D x T), next to a bookkeeping variable
        scipy.io.savemat(folder / f"{item_id}.mat", {"feat": array.T, "n": np.array(2.0)})
    store = tmp_path / "s"
    several = cli("import", "--manifest", manifest, "--from", folder, "--store", store,
                  "--name", "f")
    assert several.exit_code == 1
    assert "holds 2 numeric variables (feat, n); choose one with --mat-variable" in \
        several.stderr
    plain = cli("import", "--manifest", manifest, "--from", folder, "--store", store,
                "--name", "f", "--mat-variable", "feat")
    assert plain.exit_code == 1  # D x T read as T x D: 3 rows each, columns differ
    assert "warning: every .mat matrix has 3 rows but their column counts differ (4..7): " \
        "frames look like columns; re-run with --transpose" in plain.stderr
    good = cli("import", "--manifest", manifest, "--from", folder, "--store", store,
               "--name", "f", "--mat-variable", "feat", "--transpose", check=True)
    assert "summary: 4 done" in good.stdout and "warning" not in good.stderr
    assert "read transposed: one frame per column (D x T)" in good.stdout
    stage = imported(store, "f")
    assert stage.params["transpose"] is True and stage.params["mat_variable"] == "feat"
    for item_id, array in data.items():
        np.testing.assert_allclose(stage.read_item(item_id), array, rtol=1e-6)


@pytest.mark.parametrize("suffix", [".npz", ".mat"])
def test_d_by_n_items_of_one_size_are_warned_about_and_transpose_flips_them(tmp_path, suffix, cli):
    """Issue 23: D x N matrices (one frame per column) with the same N everywhere pass every
    shape check without --transpose: the import warns and says how to flip; T x D items of
    different lengths (more columns than rows too) are not warned about."""
    ids = ["run_a", "run_b", "walk_c", "walk_d"]
    manifest = write_manifest(tmp_path, ids)
    data = {i: RNG.normal(size=(9, 3)) for i in ids}  # 9 frames of 3 values each
    source = tmp_path / f"dn{suffix}"
    columns = {i: a.T for i, a in data.items()}
    if suffix == ".npz":
        np.savez(source, **columns)
    else:
        scipy.io.savemat(source, columns)
    store = tmp_path / "s"
    plain = cli("import", "--manifest", manifest, "--from", source, "--store", store,
                "--name", "dn", check=True)
    assert "summary: 4 done" in plain.stdout  # 4 items of 3 frames x 9 values: all agree
    assert "warning: every item has more columns than rows (e.g. 'run_a': 3 x 9, read as 3 " \
           "frames of 9 values): if each column is a frame (D x N), re-run the same command " \
           "with --transpose (one frame per column); if each row is one, ignore this" \
           in plain.stderr
    flipped = cli("import", "--manifest", manifest, "--from", source, "--store", store,
                  "--name", "dn", "--transpose", check=True)
    assert "warning" not in flipped.stderr
    for item_id, array in data.items():
        np.testing.assert_allclose(imported(store, "dn").read_item(item_id), array, rtol=1e-6)
    wide = {i: RNG.normal(size=(2 + n, 6)) for n, i in enumerate(ids)}  # T < D, T varies
    np.savez(tmp_path / "td.npz", **wide)
    quiet = cli("import", "--manifest", manifest, "--from", tmp_path / "td.npz", "--store",
                store, "--name", "td", check=True)
    assert quiet.stderr == ""


def test_a_missing_item_says_which_files_and_formats_were_tried(tmp_path, cli):
    manifest = write_manifest(tmp_path)
    folder = tmp_path / "feats"
    for item_id, array in list(frames().items())[:3]:
        (folder / item_id).parent.mkdir(parents=True, exist_ok=True)
        np.save(folder / f"{item_id}.npy", array)
    result = cli("import", "--manifest", manifest, "--from", folder, "--store",
                 tmp_path / "s", "--name", "f")
    assert result.exit_code == 1
    assert f"error: walk/d: not found: none of {folder}/walk/d.npy, {folder}/walk/d.mat, " \
        f"{folder}/walk_d.npy, {folder}/walk_d.mat (formats tried: .npy, .mat)" in result.stderr
    scipy.io.savemat(tmp_path / "f.mat", {"run_a": np.ones((2, 2))})
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "f.mat", "--store",
                 tmp_path / "s", "--name", "g")
    assert "run/b: not found: no numeric variable 'run/b' or 'run_b' in" in result.stderr


def test_non_numeric_mat_variables_and_files_are_refused(tmp_path, cli):
    manifest = write_manifest(tmp_path, ["a"])
    scipy.io.savemat(tmp_path / "cell.mat", {"a": np.array([np.ones(2), "x"], dtype=object)})
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "cell.mat",
                 "--store", tmp_path / "s", "--name", "f")
    assert result.exit_code == 1 and "no numeric variable 'a'" in result.stderr
    (tmp_path / "junk.mat").write_bytes(b"not a mat file at all" * 10)
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "junk.mat",
                 "--store", tmp_path / "s", "--name", "f")
    assert result.exit_code == 1 and "not a readable MATLAB file" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(Exception, match="is a MATLAB cell array"):
        matlab.read_variable(tmp_path / "cell.mat", "a")


# -- export ---------------------------------------------------------------------------------
@pytest.fixture
def frame_stage(tmp_path):
    """A stage of per-frame features with timestamps on every item and positions on some."""
    ids = ["v/1", "v/2", "w 3"]
    items = [ManifestItem(i, "", (lab,), (split,)) for i, lab, split in
             zip(ids, ["run", "walk", "run"], ["train", "test", ""], strict=True)]
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"formats": 1}, items=Manifest(items, root=tmp_path))
    data = {}
    for n, item_id in enumerate(ids):
        array = RNG.normal(size=(3 + n, 2)).astype(np.float32)
        extras = {"timestamps": np.arange(3 + n) / 25.0}
        if n != 1:
            extras["positions"] = RNG.normal(size=(3 + n, 3))
        stage.write_item(item_id, array, extras)
        data[item_id] = (array, extras)
    store.set_name("frames", stage)
    return tmp_path / "s", data


@pytest.mark.parametrize("suffix", [".npz", ".h5", ".mat"])
def test_export_round_trips_with_sidecars(tmp_path, frame_stage, suffix, cli):
    store, data = frame_stage
    out = tmp_path / f"export{suffix}"
    result = cli("export", "--store", store, "frames", "-o", out, check=True)
    assert "layout ragged, X (12, 2) float32, sidecars positions, timestamps" in result.stdout
    ids, items, fields = load_export(out)
    assert ids == list(data)
    for item_id, array in zip(ids, items, strict=True):
        np.testing.assert_array_equal(array, data[item_id][0])
        np.testing.assert_array_equal(fields["sidecars"]["timestamps"][ids.index(item_id)],
                                      data[item_id][1]["timestamps"])
    positions = fields["sidecars"]["positions"]
    assert positions[1] is None
    np.testing.assert_array_equal(positions[2], data["w 3"][1]["positions"])
    assert [str(x) for x in np.asarray(fields["labels"]).reshape(-1)] == ["run", "walk", "run"]


def test_export_files_read_with_the_format_libraries(tmp_path, frame_stage, cli):
    store, data = frame_stage
    cli("export", "--store", store, "frames", "-o", tmp_path / "e.h5", check=True)
    with h5py.File(tmp_path / "e.h5", "r") as handle:
        assert handle["ids"].asstr()[()].tolist() == ["v/1", "v/2", "w 3"]
        np.testing.assert_array_equal(handle["offsets"][()], [0, 3, 7, 12])
        np.testing.assert_array_equal(handle["X"][3:7], data["v/2"][0])
        np.testing.assert_array_equal(handle["sidecar_timestamps"][7:12],
                                      data["w 3"][1]["timestamps"])
        assert handle["sidecar_positions_present"][()].tolist() == [True, False, True]
        assert handle["splits"].asstr()[()].tolist() == [["train"], ["test"], [""]]
    cli("export", "--store", store, "frames", "-o", tmp_path / "e.mat", check=True)
    mat = scipy.io.loadmat(tmp_path / "e.mat")
    assert mat["ids"].shape == (3, 1) and str(mat["ids"][2, 0][0]) == "w 3"  # a cell array
    # ragged items: a cell array of one T x D matrix per video (VideoDarwin's layout)
    assert mat["X"].shape == (3, 1) and mat["X"].dtype == object and "offsets" not in mat
    for n, item_id in enumerate(data):
        assert mat["X"][n, 0].shape == (3 + n, 2) and mat["X"][n, 0].dtype == np.float32
        np.testing.assert_array_equal(mat["X"][n, 0], data[item_id][0])
        np.testing.assert_array_equal(mat["sidecar_timestamps"][n, 0].ravel(),
                                      data[item_id][1]["timestamps"])
    assert mat["sidecar_positions"][1, 0].shape == (0, 3)  # item 2 has no positions
    assert mat["sidecar_positions_present"].ravel().tolist() == [1, 0, 1]
    assert str(mat["layout"][0]) == "ragged"


def test_mat_export_keeps_the_numpy_shapes_matlab_would_lose(tmp_path, cli):
    items = [ManifestItem(f"i{n}", "", ("a",), ("train",)) for n in range(3)]
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"x": 1}, items=Manifest(items, root=tmp_path))
    arrays = [RNG.normal(size=(5, 1)) for _ in items]
    for item, array in zip(items, arrays, strict=True):
        stage.write_item(item.id, array)
    store.set_name("one", stage)
    cli("export", "--store", tmp_path / "s", "one", "-o", tmp_path / "o.mat", check=True)
    # MATLAB drops trailing singleton dimensions (size(X) is 3x5): the shape is kept beside
    np.testing.assert_array_equal(scipy.io.loadmat(tmp_path / "o.mat")["X_shape"].ravel(),
                                  [3, 5, 1])
    _, items_back, _ = load_export(tmp_path / "o.mat")
    assert [a.shape for a in items_back] == [(5, 1)] * 3
    np.testing.assert_allclose(items_back[1], arrays[1], rtol=1e-6)


def test_mat_export_ragged_cells_and_stacked_read_back(tmp_path, cli):
    """Issue 23: ragged items as a cell of T x D matrices plus ids, equal shapes stacked;
    read back by scipy.io.loadmat (and by the featpipe reader), 3-D items too."""
    store = Store(tmp_path / "s")
    for name, shapes in (("ragged", [(4, 3, 2), (1, 3, 2), (6, 3, 2)]),
                         ("same", [(5, 4)] * 3)):
        items = [ManifestItem(f"{name}{n}", "", ("a",), ("train",)) for n in range(3)]
        stage = store.stage("import", {"name": name}, items=Manifest(items, root=tmp_path))
        arrays = [RNG.normal(size=shape).astype(np.float32) for shape in shapes]
        for item, array in zip(items, arrays, strict=True):
            stage.write_item(item.id, array)
        store.set_name(name, stage)
        out = tmp_path / f"{name}.mat"
        cli("export", "--store", store.root, name, "-o", out, check=True)
        mat = scipy.io.loadmat(out)
        assert [str(c[0]) for c in mat["ids"].ravel()] == [i.id for i in items]
        if name == "same":
            assert str(mat["layout"][0]) == "stacked" and mat["X"].shape == (3, 5, 4)
            np.testing.assert_array_equal(mat["X"][1], arrays[1])
        else:
            assert mat["X"].shape == (3, 1) and mat["X_trailing"].ravel().tolist() == [3, 2]
            for n, array in enumerate(arrays):
                # MATLAB keeps T x 3 x 2 (a 1 x 3 x 2 item too)
                np.testing.assert_array_equal(mat["X"][n, 0].reshape(-1, 3, 2), array)
        ids, back, _ = load_export(out)
        assert ids == [i.id for i in items]
        for got, array in zip(back, arrays, strict=True):
            assert got.shape == array.shape
            np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("name", ["x.csv", "x", "x.npy", "x.MAT.txt"])
def test_an_unknown_export_suffix_is_a_usage_error(tmp_path, frame_stage, name, cli):
    store, _ = frame_stage
    result = cli("export", "--store", store, "frames", "-o", tmp_path / name)
    assert result.exit_code == 2
    assert "the suffix picks the format; use .npz, .h5/.hdf5 or .mat" in result.stderr
    assert list(tmp_path.glob("x*")) == []
