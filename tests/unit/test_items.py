"""featpipe.items: the local-feature record; featpipe.store.item_files: items written row by row
with a patched header."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.errors import InputError, ItemError
from featpipe.items import LocalFeatures
from featpipe.manifest import Manifest, ManifestItem
from featpipe.store import Store
from featpipe.store.item_files import ItemFiles, RowFile


def one_item_stage(tmp_path, dtype="float32"):
    items = Manifest([ManifestItem("v/1", "", ("a",), ("train",))], root=tmp_path)
    return Store(tmp_path / "store").stage("extract", {"test": "items"}, items=items,
                                           dtype=dtype)


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "<i4", "<f8"])
def test_row_file_is_the_npy_numpy_writes(tmp_path, dtype):
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 3, 2)).astype(dtype) for n in (5, 0, 7)]
    rows = RowFile(tmp_path / "x.npy", dtype)
    for part in parts:
        rows.append(part)
    rows.close()
    np.save(tmp_path / "ref.npy", np.concatenate(parts))
    assert (tmp_path / "x.npy").read_bytes()[128:] == (tmp_path / "ref.npy").read_bytes()[128:]
    got = np.load(tmp_path / "x.npy", allow_pickle=False)
    np.testing.assert_array_equal(got, np.concatenate(parts))
    assert got.dtype == np.dtype(dtype) and got.shape == (12, 3, 2)
    mismatch = RowFile(tmp_path / "z.npy", dtype)
    mismatch.append(np.zeros((1, 4)))
    with pytest.raises(InputError, match="rows of shape"):
        mismatch.append(np.zeros((1, 5)))
    mismatch.abort()
    assert not (tmp_path / "z.npy").exists()


def test_item_files_commit_like_write_item(tmp_path):
    stage = one_item_stage(tmp_path, "float16")
    files = ItemFiles(stage, "v/1")
    rng = np.random.default_rng(1)
    blocks = [rng.normal(size=(n, 4)) for n in (3, 2)]
    for k, block in enumerate(blocks):
        files.append(block, frame_index=np.full(len(block), k, np.int32),
                     positions=rng.uniform(size=(len(block), 3)).astype(np.float32))
    files.set(timestamps=np.array([0.0, 0.5]), image_size=np.array([48, 64]))
    assert files.paths() and all(".tmp." in p for p in files.paths())
    pending = files.close()
    assert stage.done_ids() == set()  # nothing is done before the commit
    pending.commit(stage, seconds=1.5)
    assert stage.done_ids() == {"v/1"}
    got = stage.read_item("v/1")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.concatenate(blocks), rtol=1e-3, atol=1e-3)
    extras = stage.extras_of("v/1")
    assert sorted(extras) == ["frame_index", "image_size", "positions", "timestamps"]
    np.testing.assert_array_equal(extras["frame_index"], [0, 0, 0, 1, 1])
    assert not list(stage.path.rglob("*.tmp.*"))


def test_item_files_refuse_non_finite_rows_and_clean_up(tmp_path):
    stage = one_item_stage(tmp_path)
    files = ItemFiles(stage, "v/1")
    files.append(np.ones((2, 3)))
    with pytest.raises(ItemError, match="NaN or Inf"):
        files.append(np.array([[1.0, np.nan, 0.0]]))
    files.abort()
    assert not list(stage.path.rglob("*.npy*"))
    with pytest.raises(ItemError, match="no frames"):
        ItemFiles(stage, "v/1").close()


def test_record_layouts_and_frames():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    record = LocalFeatures.from_item(x, {"frame_index": np.array([0, 0, 2, 2, 2, 3]),
                                         "timestamps": np.arange(5) / 10.0,
                                         "positions": np.arange(18.0).reshape(6, 3),
                                         "image_size": np.array([48, 64])})
    frames = list(record.frames())
    assert record.n_frames == 5 and [f.index for f in frames] == [0, 1, 2, 3, 4]
    assert [len(f.descriptors) for f in frames] == [2, 0, 3, 1, 0]
    np.testing.assert_array_equal(frames[2].descriptors, x[2:5])
    np.testing.assert_array_equal(frames[2].positions, np.arange(18.0).reshape(6, 3)[2:5])
    assert frames[3].seconds == pytest.approx(0.3) and frames[3].image_size == (48, 64)
    # one image, a conv map, per-frame maps, (F, n, D) stacks
    assert LocalFeatures.from_item(x).frame_index is None
    conv = LocalFeatures.from_item(np.ones((2, 3, 4)))
    assert conv.descriptors.shape == (6, 4) and conv.frame_index is None
    maps = LocalFeatures.from_item(np.ones((5, 2, 3, 4)))
    assert maps.n_frames == 5 and maps.descriptors.shape == (30, 4)
    stack = LocalFeatures.from_item(np.ones((3, 7, 4)), stacked="frames")
    assert [len(f.descriptors) for f in stack.frames()] == [7, 7, 7]
    # per-row timestamps (an older layout) become one per frame
    legacy = LocalFeatures.from_item(x, {"frame_index": np.array([0, 0, 1, 1, 1, 1]),
                                         "timestamps": np.array([0, 0, 1, 1, 1, 1.0])})
    np.testing.assert_array_equal(legacy.timestamps, [0.0, 1.0])
    with pytest.raises(InputError, match="'frame' sidecar has 3 entries for 6"):
        LocalFeatures.from_item(x, {"frame_index": np.arange(3)})
    with pytest.raises(InputError, match="beyond the 2 timestamps"):
        LocalFeatures.from_item(x, {"frame_index": np.arange(6), "timestamps": np.ones(2)})
    with pytest.raises(InputError, match="numeric"):
        LocalFeatures.from_item(np.array([["a"]]))
