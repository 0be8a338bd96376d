"""The store: keys, atomic items, ledgers, resume, names, models, safe file names."""

import json
from pathlib import Path

import numpy as np
import pytest

from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import load_npy, safe_stem
from featpipe.manifest import from_rows
from featpipe.store import Store
from tests.conftest import object_npy_bytes


def small_manifest(tmp_path, ids):
    return from_rows([(i, f"{i}.npy", ["a"], ["train"]) for i in ids], root=tmp_path)


def test_same_params_same_stage_changed_param_new_stage(tmp_path):
    store = Store(tmp_path / "s")
    items = small_manifest(tmp_path, ["x", "y"])
    first = store.stage("import", {"p": 1}, items=items)
    again = store.stage("import", {"p": 1}, items=items)
    other = store.stage("import", {"p": 2}, items=items)
    assert first == again
    assert first.key != other.key
    child = store.stage("encode", {"method": "avg"}, inputs=[first])
    child_of_other = store.stage("encode", {"method": "avg"}, inputs=[other])
    assert child.key != child_of_other.key
    assert child.items.ids == ["x", "y"]
    meta = json.loads((first.path / "stage.json").read_text())
    assert meta["kind"] == "import" and meta["params"] == {"p": 1} and meta["n_items"] == 2
    assert "numpy" in meta["versions"]


def test_write_read_resume_and_sidecars(tmp_path):
    store = Store(tmp_path / "s")
    stage = store.stage("import", {}, items=small_manifest(tmp_path, ["x", "y"]))
    stage.write_item("x", np.arange(6, dtype=np.float64).reshape(3, 2),
                     extras={"timestamps": np.array([0.0, 0.5, 1.0])})
    assert stage.done_ids() == {"x"}
    assert not stage.is_complete()
    out = stage.read_item("x")
    assert out.dtype == np.float32 and out.shape == (3, 2)
    np.testing.assert_array_equal(stage.read_extra("x", "timestamps"), [0.0, 0.5, 1.0])
    assert set(stage.extras_of("x")) == {"timestamps"}
    # a file without a ledger line is not trusted
    stage.item_path("y").parent.mkdir(parents=True, exist_ok=True)
    np.save(stage.item_path("y"), np.zeros(2))
    assert stage.done_ids() == {"x"}
    with pytest.raises(ItemError, match="not computed"):
        stage.read_item("zzz")


def test_non_finite_results_are_refused(tmp_path):
    stage = Store(tmp_path / "s").stage("import", {}, items=small_manifest(tmp_path, ["x"]))
    with pytest.raises(ItemError, match="NaN or Inf"):
        stage.write_item("x", np.array([1.0, np.nan]))
    with pytest.raises(ItemError, match="overflows"):
        stage.write_item("x", np.array([1e300]))
    assert not stage.item_path("x").exists()


def test_failed_then_done(tmp_path):
    stage = Store(tmp_path / "s").stage("import", {}, items=small_manifest(tmp_path, ["x"]))
    stage.record("x", "failed", error="bad header")
    assert stage.failed() == {"x": "bad header"}
    stage.write_item("x", np.ones(3))
    assert stage.failed() == {} and stage.done_ids() == {"x"}


def test_truncated_ledger_line_is_ignored(tmp_path):
    stage = Store(tmp_path / "s").stage("import", {}, items=small_manifest(tmp_path, ["x"]))
    stage.write_item("x", np.ones(3))
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    with open(ledger, "a") as f:
        f.write('{"id": "y", "stat')
    assert stage.done_ids() == {"x"}


@pytest.mark.parametrize("ids", [
    ["a/b", "a_b", "a b", "a:b"],
    ["..", "../..", ".", "./x", "/etc/passwd"],
    ["é", "ne\u0301e", "日本語", "x" * 5000],  # NFC twins are one id (test_manifest)
    ["A", "a"],
])
def test_ids_map_to_distinct_safe_names(tmp_path, ids):
    stage = Store(tmp_path / "s").stage("import", {}, items=small_manifest(tmp_path, ids))
    paths = [stage.item_path(i) for i in ids]
    assert len({p.name.lower() for p in paths}) == len(ids)  # distinct even case-insensitively
    for item_id, path in zip(ids, paths, strict=False):
        assert path.resolve().is_relative_to((stage.path / "items").resolve())
        assert len(path.name) < 200 and "/" not in safe_stem(item_id)
        stage.write_item(item_id, np.full(2, len(item_id), dtype=np.float32))
    for item_id in ids:
        assert stage.read_item(item_id)[0] == len(item_id)


def test_names_and_models(tmp_path):
    store = Store(tmp_path / "s")
    stage = store.stage("fit-pca", {"dim": 2})
    store.set_name("pca2", stage)
    assert store.resolve("pca2") == stage
    assert store.resolve(stage.name) == stage
    with pytest.raises(FeatpipeError, match="no stage named 'nope'"):
        store.resolve("nope")
    with pytest.raises(FeatpipeError, match="invalid name"):
        store.set_name("../evil", stage)
    stage.save_model("pca", {"components": np.eye(2)}, {"dim": 2, "mean": np.zeros(2)})
    arrays, meta = stage.load_model("pca")
    np.testing.assert_array_equal(arrays["components"], np.eye(2))
    assert meta == {"dim": 2, "mean": [0.0, 0.0]}


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.arange(6, dtype=">f4").reshape(2, 3),
    np.array(3.5),
    np.zeros((0, 5), np.float16),
    np.array([True, False]),
    np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2],
])
def test_load_npy_equals_np_load_and_refuses_object_arrays(tmp_path, array):
    path = tmp_path / "a.npy"
    np.save(path, array)
    loaded, reference = load_npy(path), np.load(path, allow_pickle=False)
    assert loaded.dtype == reference.dtype and loaded.shape == reference.shape
    assert loaded.flags.f_contiguous == reference.flags.f_contiguous and loaded.flags.writeable
    np.testing.assert_array_equal(loaded, reference)
    np.testing.assert_array_equal(load_npy(path, mmap=True), reference)
    path.write_bytes(object_npy_bytes())
    with pytest.raises(ValueError, match="Object arrays"):
        load_npy(path)


def test_numpy_values_and_paths_in_params_are_recorded_as_plain_json(tmp_path):
    """A stage's params (and so its key) take numpy scalars and arrays as the numbers they
    hold and a ``Path`` as its text; anything else is refused, never written half."""
    store = Store(tmp_path / "s")
    items = small_manifest(tmp_path, ["a"])
    plain = store.stage("import", {"n": 3, "w": [0.5, 1.0], "f": "x/y"}, items=items)
    numpy = store.stage("import", {"n": np.int64(3), "w": np.array([0.5, 1.0]),
                                   "f": Path("x/y")}, items=items)
    assert numpy.path == plain.path
    assert json.loads((numpy.path / "stage.json").read_text())["params"] == \
        {"n": 3, "w": [0.5, 1.0], "f": "x/y"}
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        store.stage("import", {"n": object()}, items=items)


@pytest.mark.parametrize("name", ["../escape", "a+b", "Upper", "x.npy", ""])
def test_a_sidecar_name_that_is_not_one_is_refused_before_anything_is_written(tmp_path,
                                                                                name):
    """A sidecar's name becomes part of a file name (``<stem>+<name>.npy``): one that could
    leave the item's folder or be read as another item's file is refused, nothing written."""
    store = Store(tmp_path / "s")
    stage = store.stage("import", {}, items=small_manifest(tmp_path, ["a"]))
    with pytest.raises(ValueError, match="sidecar name .* must match"):
        stage.write_item("a", np.ones(3), {name: np.ones(2)})
    assert not [p for p in (stage.path / "items").rglob("*") if p.is_file()]
    assert stage.done_ids() == set()


def test_items_are_stored_where_docs_store_md_says(tmp_path):
    """``items/<2 hex>/<safe id>.npy`` and ``...+<sidecar>.npy`` (docs/store.md): the layout
    is part of the store format, so stores written before are read by later versions."""
    from featpipe.fileio import id_digest

    store = Store(tmp_path / "s")
    stage = store.stage("import", {}, items=small_manifest(tmp_path, ["clip/a b"]))
    stage.write_item("clip/a b", np.ones(3), {"timestamps": np.arange(3.0)})
    folder = stage.path / "items" / id_digest("clip/a b")[:2]
    stem = safe_stem("clip/a b")
    assert sorted(p.name for p in folder.iterdir()) == [f"{stem}+timestamps.npy",
                                                       f"{stem}.npy"]


def test_a_stage_key_is_the_hash_of_its_canonical_ascii_json():
    """The key (docs/store.md): SHA-256 of the sorted, compact JSON of kind, params, input
    keys and format, non-ASCII text escaped, first 16 hex digits; written out by hand here,
    so a key that changes (and orphans every store made before) fails."""
    import hashlib

    from featpipe import FORMAT_VERSION
    from featpipe.store import stage_key

    text = ('{"format":' + str(FORMAT_VERSION) + ',"inputs":["00ff00ff00ff00ff"],'
            '"kind":"import","params":{"label":"caf\\u00e9","n":3}}')
    assert stage_key("import", {"n": 3, "label": "café"}, ["00ff00ff00ff00ff"]) == \
        hashlib.sha256(text.encode()).hexdigest()[:16]
