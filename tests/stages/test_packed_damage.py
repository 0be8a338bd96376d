"""A packed stage that is damaged or locked (issue 31 §4: each test kills a mutation of
``featpipe/store/packed.py`` or ``featpipe/store/pack.py`` that the older tests let live;
``benchmarks/mutation_sample.py``): one error naming the file or the item, never a traceback,
never fill values read as data; files opened without HDF5's file locks."""

from __future__ import annotations

import fcntl
import json

import h5py
import numpy as np
import pytest

from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import safe_stem
from featpipe.parallel import run_items
from featpipe.store import Store
from featpipe.store.pack import pack_stage
from tests._computes import SleepyCompute, expected_array, sleepy_stage


def packed_stage(tmp_path, n=6, shards=2):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, n)
    run_items(stage, stage.items.ids, SleepyCompute())
    store.set_name("s", stage)
    pack_stage(stage, shards=shards)
    return store, stage


def reopened(store):
    return Store(store.root).resolve("s")


@pytest.mark.parametrize("index", [
    "{not json",
    {"shards": 2, "files": ["shard-0000-of-0002.0a0b0c0d.h5"]},  # fewer files than shards
    {"shards": 1, "files": ["../../../elsewhere.h5"]},  # a path out of the folder
    {"shards": 1, "files": [7]},
    {"files": []},
], ids=["not-json", "count", "outside", "not-a-name", "no-shards"])
def test_a_corrupt_pack_index_is_one_error_naming_it(tmp_path, index):
    store, stage = packed_stage(tmp_path)
    path = stage.path / "packed" / "pack.json"
    path.write_text(index if isinstance(index, str) else json.dumps(index))
    with pytest.raises(FeatpipeError, match="pack.json: corrupt pack index"):
        reopened(store).done_ids()


def test_a_packed_file_of_garbage_names_the_file_and_the_item(tmp_path, cli):
    store, stage = packed_stage(tmp_path, shards=1)
    (shard,) = (stage.path / "packed").glob("shard-*.h5")
    shard.write_bytes(b"\0garbage" * (shard.stat().st_size // 8))
    item_id = stage.items.ids[0]
    with pytest.raises(FeatpipeError, match=f"unreadable packed file {shard}"):
        reopened(store).done_ids()
    for read in (lambda s: s.read_item(item_id), lambda s: s.extras_of(item_id),
                 lambda s: s.read_extra(item_id, "timestamps")):
        with pytest.raises(ItemError, match=f"unreadable packed file {shard}") as raised:
            read(reopened(store))
        assert raised.value.item == item_id
    result = cli("cache", "verify", "--store", store.root, "s")
    assert result.exit_code == 1 and "unreadable packed file" in result.output


def test_a_packed_item_never_written_is_refused_not_read_as_zeros(tmp_path):
    store, stage = packed_stage(tmp_path, shards=1)
    (shard,) = (stage.path / "packed").glob("shard-*.h5")
    item_id = stage.items.ids[1]
    with h5py.File(shard, "r+") as handle:
        shape = handle["items"][safe_stem(item_id)].shape
        del handle["items"][safe_stem(item_id)]
        handle["items"].create_dataset(safe_stem(item_id), shape=shape, dtype=np.float32)
    with pytest.raises(ItemError, match="never written") as raised:
        reopened(store).read_item(item_id)
    assert raised.value.item == item_id
    other = stage.items.ids[0]
    assert reopened(store).read_item(other).tobytes() == expected_array(other).tobytes()


def test_packed_files_are_read_while_another_process_holds_a_lock_on_them(tmp_path):
    """HDF5 files are opened without file locking (NFS and Lustre often refuse locks; a
    writer elsewhere may hold one): a lock held on every shard stops no reader."""
    store, stage = packed_stage(tmp_path, shards=2)
    held = [open(path, "rb") for path in sorted((stage.path / "packed").glob("shard-*.h5"))]
    try:
        for handle in held:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fresh = reopened(store)
        assert fresh.done_ids() == set(stage.items.ids)
        for item_id in stage.items.ids:
            assert fresh.read_item(item_id).tobytes() == expected_array(item_id).tobytes()
    finally:
        for handle in held:
            handle.close()


def test_a_process_opens_each_packed_file_once(tmp_path, monkeypatch):
    """Handles are kept per process: reading every item of a two-file pack opens two files
    (a forked child opens its own)."""
    import featpipe.store.packed

    store, stage = packed_stage(tmp_path, n=8, shards=2)
    opened = []
    real_open = featpipe.store.packed.open_h5

    def counting_open(path, mode="r"):
        opened.append(path.name)
        return real_open(path, mode)

    monkeypatch.setattr(featpipe.store.packed, "open_h5", counting_open)
    fresh = reopened(store)
    for item_id in stage.items.ids:
        fresh.read_item(item_id)
        fresh.extras_of(item_id)
    assert sorted(opened) == sorted(p.name for p in (stage.path / "packed").glob("*.h5"))
