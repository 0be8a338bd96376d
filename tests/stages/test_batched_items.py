"""Small items committed in batch files (featpipe/store/batches.py) read back through the stage
as loose items are: arrays, sidecars, done items; the mechanism at three items (the batch
threshold lowered), where tests/stages/test_item_counts.py runs it at 10^3 and 10^4."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.errors import ItemError
from featpipe.manifest import from_rows
from featpipe.store import DamagedItem, Stage, Store, batches
from featpipe.store.batches import BATCH_DIR


@pytest.fixture
def batched(tmp_path, monkeypatch):
    """A stage of three items, v0 and v1 committed in one batch file with two sidecars each,
    v2 failed in it."""
    monkeypatch.setattr(batches, "MIN_ITEMS", 3)
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(3)], tmp_path)
    stage = Store(tmp_path / "s").stage("extract", {"n": 3}, items=items)
    rng = np.random.default_rng(0)
    arrays = {f"v{i}": rng.standard_normal((4, 6)).astype(np.float32) for i in range(2)}
    extras = {i: {"frame_index": np.arange(4) + k, "timestamps": np.linspace(0, 1, 4) * k}
              for k, i in enumerate(arrays)}
    writer = stage.batch_writer()
    for item_id, array in arrays.items():
        writer.add(item_id, array, extras[item_id], seconds=0.5)
    writer.fail("v2", 0.25, "decoder gave up")
    writer.commit()
    return stage, arrays, extras


def test_batched_items_read_back_with_their_sidecars_and_count_done(batched):
    stage, arrays, extras = batched
    (batch,) = (stage.path / BATCH_DIR).glob("*.npz")
    assert not (stage.path / "items").exists()
    assert {e.batch for e in stage.ledger() if e.status == "done"} == {batch.name}
    assert stage.done_ids() == {"v0", "v1"} and stage.failed() == {"v2": "decoder gave up"}
    for item_id, array in arrays.items():
        np.testing.assert_array_equal(stage.read_item(item_id), array)
        found = stage.extras_of(item_id)
        assert set(found) == {"frame_index", "timestamps"}
        for name, values in extras[item_id].items():
            np.testing.assert_array_equal(found[name], values)
            np.testing.assert_array_equal(stage.read_extra(item_id, name), values)


def test_items_of_a_batch_file_that_is_gone_are_not_done(batched):
    stage, arrays, _ = batched
    for path in (stage.path / BATCH_DIR).glob("*.npz"):
        path.unlink()
    assert stage.done_ids() == set() and not stage.is_complete()
    with pytest.raises(ItemError, match="v0: not computed in stage"):
        stage.read_item("v0")


def test_a_damaged_member_of_a_batch_is_a_damaged_item(batched):
    stage, arrays, _ = batched
    (batch,) = (stage.path / BATCH_DIR).glob("*.npz")
    data = bytearray(batch.read_bytes())
    data[data.index(arrays["v1"].tobytes()) + 5] ^= 0x20
    batch.write_bytes(bytes(data))
    np.testing.assert_array_equal(stage.read_item("v0"), arrays["v0"])
    with pytest.raises(DamagedItem, match="v1"):
        stage.read_item("v1")
    with pytest.raises(ItemError, match="v2: not computed in stage"):
        stage.read_item("v2")


def test_a_sidecar_a_batched_item_lacks_is_none_and_an_unreadable_batch_names_it(batched):
    stage, arrays, _ = batched
    assert stage.read_extra("v0", "positions") is None
    (batch,) = (stage.path / BATCH_DIR).glob("*.npz")
    batch.write_bytes(b"not a zip file: a batch overwritten")
    with pytest.raises(ItemError, match=f"v0.*unreadable batch file .*{batch.name}"):
        stage.read_item("v0")


def test_a_batch_file_that_lacks_an_item_names_it_and_its_sidecars_unreadable(batched):
    """A batch file replaced by a valid one without the item (a hand's copy): the item's
    read names the batch file and what it lacks; an unreadable batch file is named when the
    item's sidecars are listed too."""
    import zipfile

    stage, arrays, _ = batched
    (batch,) = (stage.path / BATCH_DIR).glob("*.npz")
    with zipfile.ZipFile(batch) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if not n.startswith("v0")}
    with zipfile.ZipFile(batch, "w") as archive:
        for member, data in kept.items():
            archive.writestr(member, data)
    with pytest.raises(ItemError, match=f"v0: batch file .*{batch.name} lacks v0"):
        stage.read_item("v0")


def test_the_sidecars_of_an_item_in_an_unreadable_batch_file_are_one_error(batched):
    stage, arrays, _ = batched
    (batch,) = (stage.path / BATCH_DIR).glob("*.npz")
    batch.write_bytes(b"not a zip file: a batch overwritten")
    with pytest.raises(ItemError, match=f"v1: unreadable batch file .*{batch.name}"):
        stage.extras_of("v1")


def test_an_item_recomputed_into_another_batch_meanwhile_is_read_from_there(batched):
    """Another process recomputed v0 into a new batch file and the old one is gone: a stage
    object that read the ledgers before finds the new batch by reading them again."""
    stage, arrays, extras = batched
    stage.done_ids()  # this object's view of the ledgers, before the other process's run
    (old,) = (stage.path / BATCH_DIR).glob("*.npz")
    writer = Stage(stage.path).batch_writer()
    writer.add("v0", arrays["v0"], extras["v0"], seconds=0.5)
    writer.commit()
    old.unlink()
    np.testing.assert_array_equal(stage.read_item("v0"), arrays["v0"])


def test_a_batch_file_pack_cannot_remove_is_named_as_such(batched):
    """`cache pack` removes the batch files once their items are packed; one the store
    cannot delete is one `cannot remove` error naming it (the packed copy is whole: a rerun
    of the pack finishes)."""
    from featpipe.errors import WriteError
    from featpipe.store.pack import pack_stage
    from tests._stores import deny

    stage, arrays, _ = batched
    arrays = dict(arrays, v2=np.full((4, 6), 2.0, np.float32))
    writer = stage.batch_writer()  # v2 computed again, into a second batch file
    writer.add("v2", arrays["v2"], {}, seconds=0.5)
    writer.commit()
    with pytest.MonkeyPatch.context() as denied:  # the store cannot delete them
        deny(denied, "unlink", lambda path: path.suffix == ".npz" and BATCH_DIR in path.parts)
        with pytest.raises(WriteError, match=r"cannot remove .*\.npz: Permission denied"):
            pack_stage(stage, shards=1)
    assert pack_stage(stage, shards=1).removed == 2
    assert not list((stage.path / BATCH_DIR).glob("*.npz"))
    for item_id, array in arrays.items():
        np.testing.assert_array_equal(Stage(stage.path).read_item(item_id), array)
