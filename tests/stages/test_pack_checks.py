"""Packing's own checks (issue 31 §4: each test kills a mutation of ``featpipe/store/pack.py`` that
the older tests let live; ``benchmarks/mutation_sample.py``): what it refuses before it starts,
the read-back comparison that must stop it before anything is removed, its summary line."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.errors import FeatpipeError
from featpipe.manifest import from_rows
from featpipe.parallel import run_items
from featpipe.store import Store
from featpipe.store.pack import pack_stage
from tests._computes import SleepyCompute, expected_array, sleepy_stage


def finished(tmp_path, n=5):
    stage = sleepy_stage(Store(tmp_path / "s"), n)
    run_items(stage, stage.items.ids, SleepyCompute())
    return stage


def loose(stage):
    return sorted((stage.path / "items").rglob("*.npy"))


def test_pack_refuses_a_stage_without_items_and_zero_shards(tmp_path):
    model_stage = Store(tmp_path / "s").stage("fit-pca", {"dim": 2})
    with pytest.raises(FeatpipeError, match=f"stage {model_stage.name} has no items to pack"):
        pack_stage(model_stage)
    stage = finished(tmp_path)
    with pytest.raises(FeatpipeError, match="--shards must be at least 1, got 0"):
        pack_stage(stage, shards=0)
    assert len(loose(stage)) == 10 and stage.packed() is None


def test_an_unfinished_stage_names_an_item_that_is_not_done(tmp_path):
    stage = sleepy_stage(Store(tmp_path / "s"), 3)
    run_items(stage, stage.items.ids[:2], SleepyCompute())
    with pytest.raises(FeatpipeError, match=rf"\(2 of 3 items done, e.g. "
                       rf"'{stage.items.ids[2]}' is not\)"):
        pack_stage(stage)


def test_the_summary_counts_items_files_bytes_and_removed_files(tmp_path):
    stage = finished(tmp_path)
    summary = pack_stage(stage, shards=2)
    files = sorted((stage.path / "packed").glob("shard-*.h5"))
    assert sorted(summary.files) == files and summary.items == 5 and summary.removed == 10
    assert summary.bytes == sum(p.stat().st_size for p in files)
    assert summary.line() == (f"packed 5 items into 2 HDF5 file(s), "
                              f"{summary.bytes / 2**20:.1f} MiB; removed 10 loose file(s)")
    assert loose(stage) == []


@pytest.mark.parametrize("what", ["array", "sidecars", "sidecar names"])
def test_a_pack_that_does_not_read_back_identical_removes_nothing(tmp_path, what, monkeypatch):
    """The read-back compares every packed array and sidecar with its source: a source that
    reads differently the second time (a flipped bit in the write path) stops the pack before
    ``pack.json`` exists or a loose file is removed."""
    stage = finished(tmp_path)
    seen: dict[str, int] = {}
    victim = stage.items.ids[2]
    real_read, real_extras = stage.read_item, stage.extras_of

    def second_time(item_id):
        seen[item_id] = seen.get(item_id, 0) + 1
        return item_id == victim and seen[item_id] > 1

    def read_item(item_id, mmap=False):
        array = real_read(item_id, mmap)
        return array + 1 if what == "array" and second_time(item_id) else array

    def extras_of(item_id):
        extras = real_extras(item_id)
        if what != "array" and second_time(item_id):
            if what == "sidecars":
                return {k: v + 1 for k, v in extras.items()}
            return {**extras, "positions": np.zeros(2)}
        return extras

    monkeypatch.setattr(stage, "read_item", read_item)
    monkeypatch.setattr(stage, "extras_of", extras_of)
    message = "item" if what == "array" else "sidecars of"
    with pytest.raises(FeatpipeError, match=f"{message} '?{victim}'? differ.* after packing; "
                       "nothing removed"):
        pack_stage(stage, shards=1)
    monkeypatch.undo()
    assert stage.packed() is None
    assert list((stage.path / "packed").glob("*.h5")) == []  # the written shard is removed
    assert len(loose(stage)) == 10
    for item_id in stage.items.ids:
        assert stage.read_item(item_id).tobytes() == expected_array(item_id).tobytes()


def test_a_pack_that_fails_while_writing_leaves_nothing_behind(tmp_path, monkeypatch):
    """An item that cannot be read in the middle of a shard stops the pack: no temporary or
    shard file, no ``pack.json``, every loose file kept."""
    from featpipe.errors import ItemError

    stage = finished(tmp_path)
    real_read = stage.read_item
    victim = stage.items.ids[3]

    def read_item(item_id, mmap=False):
        if item_id == victim:
            raise ItemError(item_id, "unreadable (simulated)")
        return real_read(item_id, mmap)

    monkeypatch.setattr(stage, "read_item", read_item)
    with pytest.raises(ItemError, match="unreadable"):
        pack_stage(stage, shards=1)
    monkeypatch.undo()
    left = [p.name for p in (stage.path / "packed").iterdir() if p.name != "pack.lock"]
    assert left == []  # (a lock file may stay where the lock is an OS lock)
    assert len(loose(stage)) == 10


def test_the_summary_line_gives_mebibytes(tmp_path):
    items = from_rows([("big", "big.npy", ["a"], ["train"])], root=tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    stage.write_item("big", np.random.default_rng(0).random((768, 512)))  # 1.5 MiB float32
    summary = pack_stage(stage)
    assert 1.5 * 2**20 < summary.bytes < 1.6 * 2**20
    assert summary.line() == ("packed 1 items into 1 HDF5 file(s), 1.5 MiB; removed 1 loose "
                              "file(s)")


def test_a_shard_is_flushed_before_it_is_synced(tmp_path, monkeypatch):
    """fsync makes durable what the operating system holds: every byte h5py wrote through
    Python's buffered file must be handed over first, or a crash could leave a shard cut
    short under its final name. (h5py's file-object driver flushes when the file closes, so
    pack's own flush before the fsync is a second guard: dropping it alone is equivalent.)"""
    import os

    import featpipe.store.pack as pack

    synced, real_fsync = [], os.fsync

    def fsync(fd):
        info = os.fstat(fd)
        synced.append((info.st_ino, info.st_size))
        real_fsync(fd)

    monkeypatch.setattr(pack.os, "fsync", fsync)
    stage = finished(tmp_path)
    summary = pack_stage(stage, shards=1)
    shard = summary.files[0].stat()  # renamed after the fsync: the same inode
    assert [size for inode, size in synced if inode == shard.st_ino] == [shard.st_size]


def test_a_loose_file_that_cannot_be_removed_is_named_as_such(tmp_path):
    """After the packed files are checked, a loose file the store cannot delete is one
    `cannot remove` error naming it (the packed copy is whole: a rerun finishes)."""
    from featpipe.errors import WriteError
    from tests._stores import deny

    stage = finished(tmp_path)
    with pytest.MonkeyPatch.context() as denied:  # the store cannot delete them
        deny(denied, "unlink", lambda path: path.suffix == ".npy" and "items" in path.parts)
        with pytest.raises(WriteError, match=r"cannot remove .*\.npy: Permission denied"):
            pack_stage(stage, shards=1)
    assert pack_stage(stage, shards=1).removed == 10 and loose(stage) == []
