"""Faults at the store's seams (issue 51): a store copied with new inodes, a content-hash
cache entry that lies under a valid seal, a view whose source item is damaged, a damaged item
list under a complete stage, a ``batches/`` folder that is a link out of the store, and the
reviewer-found mutation survivors of the index, the batch files and the views."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from featpipe.io.export import export_stage
from featpipe.progress import stage_progress
from featpipe.store import Store, states
from featpipe.store import batches as batch_files
from featpipe.store import index as stage_index
from featpipe.store.pack import pack_stage
from tests._stores import write_npy_dataset


class _Counts:
    """How often the index folded a ledger and wrote itself."""

    def __init__(self, monkeypatch):
        self.folds = self.writes = 0
        fold, write = stage_index._fold_ledger, stage_index.write

        def counted_fold(*args, **kwargs):
            self.folds += 1
            return fold(*args, **kwargs)

        def counted_write(*args, **kwargs):
            self.writes += 1
            return write(*args, **kwargs)

        monkeypatch.setattr(stage_index, "_fold_ledger", counted_fold)
        monkeypatch.setattr(stage_index, "write", counted_write)


def _packed_batched_store(tmp_path, cli, monkeypatch, n=40):
    """A store whose stage ``feat`` holds ``n`` small items committed in one batch file, then
    packed (the batch file removed: each item's ledger line still names it)."""
    monkeypatch.setattr(batch_files, "MIN_ITEMS", 3)
    manifest = write_npy_dataset(tmp_path, n=n)
    store = tmp_path / "s"
    cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
        "--name", "feat", check=True)
    stage = Store(store).resolve("feat")
    assert list((stage.path / "batches").glob("*.npz"))
    pack_stage(stage)
    assert not list((stage.path / "batches").glob("*.npz"))
    return store


def _copied(store, to):
    """``store`` copied as ``cp -a`` or ``rsync -a`` copy it: same bytes and times, new
    inodes; this process then reads it as a new one would (no table kept in memory)."""
    shutil.copytree(store, to)
    states._tables.clear()
    return to


# -- 51.4: an index made stale by a copy is rebuilt once -----------------------------------------

def test_a_copied_store_rebuilds_its_stale_index_once_on_the_first_read(tmp_path, cli,
                                                                       monkeypatch):
    """A copy gives every ledger a new inode, so the index no longer vouches for them: the
    first read folds the ledgers once and writes the index again; reading every item of the
    packed stage (whose lines name batch files that are gone) folds no ledger again."""
    copy = _copied(_packed_batched_store(tmp_path, cli, monkeypatch), tmp_path / "copy")
    counts = _Counts(monkeypatch)
    stage = Store(copy).resolve("feat")
    export_stage(stage, tmp_path / "out.npz")
    assert (counts.folds, counts.writes) == (1, 1)  # one ledger, folded once, written once
    with np.load(tmp_path / "out.npz", allow_pickle=False) as data:
        assert len(data["ids"]) == 40
    states._tables.clear()  # another process: the index on disk is current now
    assert stage_progress(Store(copy).resolve("feat")).done == 40
    assert Store(copy).resolve("feat").read_item("v07").shape == (5, 8)
    assert (counts.folds, counts.writes) == (1, 1)


def test_status_of_a_copied_store_rebuilds_the_index_and_reads_it_after(tmp_path, cli,
                                                                        monkeypatch):
    copy = _copied(_packed_batched_store(tmp_path, cli, monkeypatch), tmp_path / "copy")
    counts = _Counts(monkeypatch)
    assert "items: 40 total, 40 done" in cli("status", "--store", copy, "feat").stdout
    assert "items: 40 total, 40 done" in cli("status", "--store", copy, "feat").stdout
    assert (counts.folds, counts.writes) == (1, 1)


def test_verify_repair_rebuilds_the_stale_index_of_a_copied_store(tmp_path, cli, monkeypatch):
    copy = _copied(_packed_batched_store(tmp_path, cli, monkeypatch), tmp_path / "copy")
    repair = cli("cache", "verify", "--store", copy, "--repair", check=True)
    assert "rebuilt the index (its ledgers were copied, moved or rewritten)" in repair.output
    counts = _Counts(monkeypatch)
    states._tables.clear()
    stage = Store(copy).resolve("feat")
    assert stage.index(need_table=True).done == 40 and stage.read_item("v00").shape == (5, 8)
    assert (counts.folds, counts.writes) == (0, 0)
    again = cli("cache", "verify", "--store", copy, "--repair", check=True)
    assert "rebuilt" not in again.output  # current: nothing to do


def test_a_read_only_copy_folds_its_ledgers_once_per_process(tmp_path, cli, monkeypatch):
    """Where the index cannot be written (a read-only copy), the ledgers are folded in memory
    once, and the item reads that follow use that fold while the ledgers are unchanged."""
    copy = _copied(_packed_batched_store(tmp_path, cli, monkeypatch), tmp_path / "copy")
    monkeypatch.setattr(stage_index, "compact", lambda *args: False)  # as on a read-only disk
    counts = _Counts(monkeypatch)
    stage = Store(copy).resolve("feat")
    assert all(stage.read_item(f"v{i:02d}").shape[1] == 8 for i in range(40))
    assert counts.folds == 1 and counts.writes == 0


@pytest.fixture(autouse=True)
def _no_tables_kept():
    """Each test starts as a new process would: no item table kept in memory."""
    states._tables.clear()
    yield
    states._tables.clear()
