"""Views (issue 38 §2): a stage whose items are columns of its input stage's items, read
from there; what a view answers (done, failed, truncated items, its arrays) is its source's,
and its record is checked like every record of a stage (issue 39)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from featpipe.errors import FeatpipeError, ItemError
from featpipe.manifest import from_rows
from featpipe.reporting import Reporter
from featpipe.stages.cache import gc, verify
from featpipe.store import VIEW_FILE, DamagedStage, Stage, Store
from featpipe.store.pack import pack_stage


def _source_and_view(tmp_path, n=3, written=None):
    store = Store(tmp_path / "store")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(n)], tmp_path)
    source = store.stage("extract", {"n": n}, items=items)
    rows = np.random.default_rng(0).standard_normal((n, 5, 8))
    for i in range(n if written is None else written):
        source.write_item(f"v{i}", rows[i], {"frame_index": np.arange(5)})
    view = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    view.make_view(source, slice(2, 6), ["frame_index"])
    return store, source, view, rows


def test_a_view_is_not_packed_and_its_source_is_kept_by_gc(tmp_path):
    """A view holds no arrays: `cache pack` refuses it (packing would copy it), and gc keeps
    the stage it reads while the view is named."""

    store = Store(tmp_path / "store")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(3)], tmp_path)
    source = store.stage("extract", {"n": 3}, items=items)
    rows = np.random.default_rng(0).standard_normal((3, 5, 8))
    for i in range(3):
        source.write_item(f"v{i}", rows[i], {"frame_index": np.arange(5)})
    view = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    view.make_view(source, slice(2, 6), ["frame_index"])
    store.set_name("part", view)
    np.testing.assert_array_equal(view.read_item("v1"), rows[1][:, 2:6].astype(np.float32))
    assert set(view.extras_of("v1")) == {"frame_index"}
    np.testing.assert_array_equal(view.read_extra("v1", "frame_index"), np.arange(5))
    assert view.read_extra("v1", "timestamps") is None
    with pytest.raises(FeatpipeError, match="is a view of"):
        pack_stage(view)
    gc(store, min_age=0.0)
    assert store.resolve("part").read_item("v2").shape == (5, 4)


def test_a_view_made_after_its_stage_is_checksummed_like_one_made_with_it(tmp_path):
    """Issue 39: a stage created before its source was stored becomes a view later; its
    view record's checksum then goes into stage.json too, so deleting the record is damage
    (`verify` names it, `--repair` removes the stage) instead of silently turning the view
    into an empty stage; the rerun's view equals the first to the bit."""

    store = Store(tmp_path / "store")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(2)], tmp_path)
    source = store.stage("extract", {"n": 2}, items=items)
    for i in range(2):
        source.write_item(f"v{i}", np.full((3, 8), i, np.float32), {})
    view = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    assert VIEW_FILE not in (view.meta.get("files") or {})
    view.make_view(source, slice(2, 6), [])
    record = (view.path / VIEW_FILE).read_bytes()
    assert VIEW_FILE in Stage(view.path).meta["files"]
    assert verify(store, reporter=Reporter(progress=False)) == 0
    written = [(view.path / name).stat().st_ino for name in (VIEW_FILE, "stage.json")]
    view.make_view(source, slice(2, 6), [])  # a second writer: nothing is written again
    assert (view.path / VIEW_FILE).read_bytes() == record
    assert [(view.path / name).stat().st_ino for name in (VIEW_FILE, "stage.json")] == written
    (view.path / VIEW_FILE).unlink()
    with pytest.raises(DamagedStage, match="view record"):
        Stage(view.path)
    assert verify(store, reporter=Reporter(progress=False)) == 1
    assert verify(store, reporter=Reporter(progress=False), repair=True) == 0
    assert not view.path.exists()
    again = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    again.make_view(source, slice(2, 6), [])
    assert (again.path / VIEW_FILE).read_bytes() == record
    np.testing.assert_array_equal(again.read_item("v1"), np.ones((3, 4), np.float32))


def test_a_view_answers_with_its_sources_items(tmp_path):
    """Done, failed and cut-short items of a view are its source's (the view has no ledger
    or files of its own)."""
    store, source, view, rows = _source_and_view(tmp_path, n=4, written=3)
    assert not (view.path / "items").exists()
    assert view.done_ids() == {"v0", "v1", "v2"} and not view.is_complete()
    source.write_item("v3", rows[3], {"frame_index": np.arange(5)})
    assert view.is_complete()
    source.record("v2", "failed", error="decoder gave up")
    source.record_removed(["v1", "v2"], "damaged")
    source.record("v2", "failed", error="decoder gave up")
    assert view.done_ids() == {"v0", "v3"} and not view.is_complete()
    assert view.failed() == {"v2": "decoder gave up"}
    with open(source.item_path("v0"), "r+b") as handle:  # cut short by a failing disk
        handle.truncate(handle.seek(0, 2) - 8)
    assert view.truncated_ids(["v0", "v1"]) == {"v0"}


def test_a_view_of_a_stage_that_is_not_its_input_is_refused(tmp_path):
    store, source, view, rows = _source_and_view(tmp_path)
    other = store.stage("encode", {"part": 2}, inputs=[view], items=view.items)
    with pytest.raises(FeatpipeError, match="cannot be a view of .*which is not its input"):
        other.make_view(source, slice(0, 2), [])
    assert not (other.path / VIEW_FILE).exists()


@pytest.mark.parametrize("record", [
    {"source": "extract-0000000000000000", "columns": [2, 6], "extras": []},
    {"columns": [2, 6], "extras": []},
    {"source": "SOURCE", "columns": [2], "extras": []},
    {"source": "SOURCE", "columns": [2, -1], "extras": []},
    {"source": "SOURCE", "columns": [2, 6]},
    ["columns"],
], ids=["not-an-input", "no-source", "one-bound", "negative-bound", "no-extras", "a-list"])
def test_a_view_record_of_an_old_store_is_checked_before_it_is_believed(tmp_path, record):
    """In a stage written before checksums (no seal, no ``files`` sums) the view record's
    content is still checked: an input stage, two column bounds >= 0, the sidecars kept."""
    store, source, view, rows = _source_and_view(tmp_path)
    meta = json.loads((view.path / "stage.json").read_text())
    old = {k: v for k, v in meta.items() if k not in ("checksums", "files", "crc32")}
    (view.path / "stage.json").write_text(json.dumps(old))
    good = {"source": source.name, "columns": [2, 6], "extras": ["frame_index"]}
    (view.path / VIEW_FILE).write_text(json.dumps(good))
    np.testing.assert_array_equal(Stage(view.path).read_item("v1"),
                                  rows[1][:, 2:6].astype(np.float32))
    if isinstance(record, dict) and record.get("source") == "SOURCE":
        record = dict(record, source=source.name)
    (view.path / VIEW_FILE).write_text(json.dumps(record))
    with pytest.raises(DamagedStage, match="corrupt view record"):
        Stage(view.path)


def test_a_view_wider_than_its_sources_item_names_the_item(tmp_path):
    """A view taking columns its source's item lacks (a source recomputed narrower) is an
    error naming the item and the columns, never a silently narrower array."""
    store, source, view, rows = _source_and_view(tmp_path)
    wide = store.stage("encode", {"part": 9}, inputs=[source], items=view.items)
    wide.make_view(source, slice(4, 12), [])
    with pytest.raises(ItemError, match=r"8 columns in extract-.*takes 4\.\.\.11"):
        wide.read_item("v1")
    last = store.stage("encode", {"part": 10}, inputs=[source], items=view.items)
    last.make_view(source, slice(4, 8), [])  # up to the last column: fine
    np.testing.assert_array_equal(last.read_item("v1"), rows[1][:, 4:8].astype(np.float32))


def test_a_view_record_that_is_not_json_is_corrupt(tmp_path):
    store, source, view, rows = _source_and_view(tmp_path)
    meta = json.loads((view.path / "stage.json").read_text())
    old = {k: v for k, v in meta.items() if k not in ("checksums", "files", "crc32")}
    (view.path / "stage.json").write_text(json.dumps(old))
    (view.path / VIEW_FILE).write_bytes(b'{"source": ')
    with pytest.raises(DamagedStage, match="corrupt view record"):
        Stage(view.path)


def test_a_sealed_view_record_of_an_old_store_whose_seal_differs_is_damaged(tmp_path):
    """A stage.json without checksums (a store before them) still has a sealed view record
    (written since): one byte of it changed is damage, named as such."""
    store, source, view, rows = _source_and_view(tmp_path)
    meta = json.loads((view.path / "stage.json").read_text())
    old = {k: v for k, v in meta.items() if k not in ("checksums", "files", "crc32")}
    (view.path / "stage.json").write_text(json.dumps(old))
    record = (view.path / VIEW_FILE).read_bytes()
    (view.path / VIEW_FILE).write_bytes(record.replace(b"frame_index", b"frame_indey"))
    with pytest.raises(DamagedStage, match="damaged view record"):
        Stage(view.path)


def test_a_view_from_the_first_column_and_its_record_bytes(tmp_path):
    """Columns from 0 are a view like any other; the record's bytes are sorted JSON sealed
    to its place (stores keep their checksum: a rerun recognises the same view)."""
    from featpipe.store import view_bytes

    store, source, view, rows = _source_and_view(tmp_path)
    first = store.stage("encode", {"part": 0}, inputs=[source], items=view.items)
    first.make_view(source, slice(0, 4), [])
    np.testing.assert_array_equal(Stage(first.path).read_item("v2"),
                                  rows[2][:, :4].astype(np.float32))
    data = view_bytes(first.name, source.name, slice(0, 4), ["b", "a"])
    assert data.startswith(b'{"columns": [0, 4], "extras": ["a", "b"], "source": "'
                           + source.name.encode() + b'", "crc32": "crc32:')


def test_a_view_whose_source_is_gone_is_damage_repair_removes_and_a_rerun_makes_again(
        tmp_path):
    """Its items were its source's: with the source's folder gone (`rm -rf`, a copy that
    missed it) the view is a damaged stage, never an empty one that verifies; repair
    removes it with its name, and making both again gives the same arrays."""
    import shutil

    store, source, view, rows = _source_and_view(tmp_path)
    store.set_name("part", view)
    expected = view.read_item("v1")
    shutil.rmtree(source.path)
    with pytest.raises(DamagedStage, match=f"a view of stage {source.name}, which is gone"):
        store.resolve("part")
    assert verify(store, reporter=Reporter(progress=False)) == 1
    assert verify(store, reporter=Reporter(progress=False), repair=True) == 0
    assert not view.path.exists() and "part" not in store.names()
    store2, source2, view2, _ = _source_and_view(tmp_path)
    assert view2.path == view.path
    np.testing.assert_array_equal(view2.read_item("v1"), expected)


def test_a_file_named_like_the_pack_folder_is_no_pack(tmp_path):
    store, source, view, rows = _source_and_view(tmp_path)
    (source.path / "packed").write_text("not a folder")
    assert Stage(source.path).packed() is None
    assert verify(store, reporter=Reporter(progress=False)) == 0
