"""Faults at the store's seams (issue 51): a store copied with new inodes, a content-hash
cache entry that lies under a valid seal, a view whose source item is damaged, a damaged item
list under a complete stage, a ``batches/`` folder that is a link out of the store, and the
reviewer-found mutation survivors of the index, the batch files and the views."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest

from featpipe.io.export import export_stage
from featpipe.manifest import from_rows
from featpipe.progress import stage_progress
from featpipe.store import Store, content, states
from featpipe.store import batches as batch_files
from featpipe.store import index as stage_index
from featpipe.store.pack import pack_stage
from tests._stores import imported_store, named_view, write_npy_dataset
from tests.conftest import one_line_error


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


# -- 51.5: a content-hash cache entry that lies under a valid seal ------------------------------

def _lying_cache(tmp_path, cli):
    """An imported store whose content-hash cache holds a wrong SHA-256 for one file under
    its true stat record, sealed anew (as a faulty writer would leave it)."""
    manifest = write_npy_dataset(tmp_path)
    store = tmp_path / "s"
    command = ("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
               "--name", "feat")
    cli(*command, check=True)
    cache = store / content.CACHE_NAME
    entries = content.load_cache(cache)
    path = os.path.abspath(tmp_path / "npy" / "v05.npy")
    entries[path][4] = "f" * 64
    cache.write_bytes(content.cache_bytes(entries))
    return store, command, path


def test_verify_finds_a_wrong_cache_entry_and_repair_unsticks_the_import(tmp_path, cli):
    store, command, path = _lying_cache(tmp_path, cli)
    stuck = cli(*command)  # the key is computed from the lie, the read differs
    assert stuck.exit_code == 1 and "the cache is damaged, not the file" in stuck.output
    assert "`featpipe cache verify --repair --rehash`" in stuck.output
    found = cli("cache", "verify", "--store", store)
    assert found.exit_code == 1
    assert f"problem: {content.CACHE_NAME}: the entry of {path} holds SHA-256 ffffffffffff" \
        f"... but its bytes hash to {content.sha256_of(path)[:12]}..." in found.output
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert f"rewrote {content.CACHE_NAME}" in repair.output
    assert content.load_cache(store / content.CACHE_NAME)[path][4] == content.sha256_of(path)
    assert "0 problem(s)" in cli("cache", "verify", "--store", store).output
    rerun = cli(*command, check=True)
    assert "0 done, 12 skipped" in rerun.output


def test_verify_hashes_a_sample_of_the_cache_and_all_of_it_with_rehash(tmp_path, cli,
                                                                       monkeypatch):
    """A plain verify hashes :data:`featpipe.store.content.VERIFY_SAMPLE` cached files
    again, ``--rehash`` every one; a repair after a sample that found a lie keeps only the
    entries it hashed again, and the next run hashes the other files."""
    store, command, path = _lying_cache(tmp_path, cli)
    hashed = []
    real = content.sha256_of
    monkeypatch.setattr(content, "sha256_of", lambda p: hashed.append(p) or real(p))
    monkeypatch.setattr(content, "VERIFY_SAMPLE", 4)
    cli("cache", "verify", "--store", store)
    assert len(hashed) == 4
    hashed.clear()
    assert cli("cache", "verify", "--store", store, "--rehash").exit_code == 1
    assert len(hashed) == 12 and path in hashed
    real_sample = random.sample
    monkeypatch.setattr(random, "sample", lambda found, k: [path, *real_sample(
        [p for p in found if p != path], k - 1)])
    cli("cache", "verify", "--store", store, "--repair", check=True)
    kept = content.load_cache(store / content.CACHE_NAME)
    assert len(kept) == 4 and kept[path][4] == real(path)
    assert "0 done, 12 skipped" in cli(*command, check=True).output
    assert len(content.load_cache(store / content.CACHE_NAME)) == 12


def test_verify_of_a_view_checks_the_items_it_reads_in_its_source(tmp_path, cli):
    """A view holds no arrays: ``cache verify VIEW`` verifies the stage it reads too, so a
    damaged source item is named (and repaired there) instead of 0 items checked and ok."""
    store, source, view = named_view(tmp_path / "s")
    damaged = source.item_path("v1")
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0x01
    damaged.write_bytes(bytes(data))
    found = cli("cache", "verify", "--store", store.root, "part")
    assert found.exit_code == 1
    assert f"problem: stage {source.name}: item 'v1': damaged" in found.output
    assert f"BAD: stage {source.name}: 3 items checked" not in found.output  # 2 of 3 good
    assert f"BAD: stage {source.name}: 2 items checked" in found.output
    repair = cli("cache", "verify", "--store", store.root, "part", "--repair", check=True)
    assert f"repaired: stage {source.name}: removed damaged item 'v1'" in repair.output
    assert view.done_ids() == {"v0", "v2"}


# -- a re-run of a complete stage whose record file is damaged ----------------------------------

@pytest.mark.parametrize("record", ["items.csv", "read-hashes.json"])
def test_a_rerun_writes_a_damaged_record_again_instead_of_saying_complete(tmp_path, cli, record):
    """The checksum ``stage.json`` keeps of the record tells the re-run it is damaged: the
    re-run writes it again (its bytes are those the key determines), so what reads it next
    (an encode) works, without ``verify --repair`` first."""
    store, command = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    path = stage.path / record
    good = path.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    rerun = cli(*command, check=True)
    assert "0 done, 12 skipped" in rerun.output
    assert path.read_bytes() == good
    assert "0 problem(s)" in cli("cache", "verify", "--store", store).output
    cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e", check=True)


def test_a_damaged_item_list_this_run_cannot_write_again_is_one_line(tmp_path, cli):
    """A re-run whose item list differs from the one the stage was made with (its manifest
    moved the item paths) cannot tell the damaged bytes: one line, nothing written."""
    store, command = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    path = stage.path / "items.csv"
    path.write_bytes(path.read_bytes().replace(b"v03", b"v0X"))
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "npy", moved / "npy")
    shutil.copy(tmp_path / "m.csv", moved / "m.csv")
    result = cli("import", "--manifest", moved / "m.csv", "--from", moved / "npy", "--store",
                 store, "--name", "feat")
    assert result.exit_code == 1
    assert one_line_error(result) == (
        f"error: stage {stage.name}: {path} is damaged and this run would write other bytes "
        f"than it held (item paths that moved?); remove the stage (`featpipe cache rm "
        f"{stage.name}`) and run the command again")


# -- 51.3: gc and repair touch only featpipe's own files, inside the store -----------------------

def _linked_batches(tmp_path, cli, monkeypatch):
    """A store whose stage ``feat`` keeps its batch files through ``batches/``, a link to a
    folder outside the store that also holds a user's files: one named like nothing featpipe
    writes, one named like a batch file that no ledger line names."""
    monkeypatch.setattr(batch_files, "MIN_ITEMS", 3)
    elsewhere = tmp_path / "scratch"
    elsewhere.mkdir()
    manifest = write_npy_dataset(tmp_path)
    store = tmp_path / "s"
    command = ("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
               "--name", "feat")
    cli(*command, check=True)
    stage = Store(store).resolve("feat")
    for path in (stage.path / "batches").iterdir():
        shutil.move(path, elsewhere / path.name)
    (stage.path / "batches").rmdir()
    (stage.path / "batches").symlink_to(elsewhere, target_is_directory=True)
    results = elsewhere / "results.npz"
    np.savez(results, x=np.arange(3))
    lookalike = elsewhere / "otherhost-12-0123456789ab.00000000.npz"
    np.savez(lookalike, y=np.arange(2))
    for path in (results, lookalike):
        os.utime(path, (1e9, 1e9))  # old: gc's age rule would not keep them
    return store, stage, results, lookalike


def test_gc_leaves_every_file_in_a_batches_link_out_of_the_store(tmp_path, cli, monkeypatch):
    store, stage, results, lookalike = _linked_batches(tmp_path, cli, monkeypatch)
    gc = cli("cache", "gc", "--store", store, "--min-age", "0", check=True)
    assert results.exists() and lookalike.exists()
    assert f"{results}: not a file featpipe writes; left alone" in gc.output
    assert f"{lookalike}: outside the store (through a link); left alone" in gc.output
    assert Store(store).resolve("feat").read_item("v03").shape[1] == 8
    assert "0 problem(s)" in cli("cache", "verify", "--store", store).output


def test_gc_removes_only_what_featpipe_names_in_the_store(tmp_path, cli, monkeypatch):
    """Inside the store, a leftover batch file or index table is removed by its exact name;
    files of other names in those folders are named and kept."""
    store, _ = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    (stage.path / "batches").mkdir()
    leftover = stage.path / "batches" / "host-12-0123456789ab.00000000.npz"
    table = stage.path / "index-0123456789ab.npz"
    mine = [stage.path / "batches" / "results.npz", stage.path / "index-notes.npz",
            stage.path / "packed" / "shard-notes.h5"]
    (stage.path / "packed").mkdir()
    for path in (leftover, table, *mine):
        path.write_bytes(b"x")
        os.utime(path, (1e9, 1e9))
    gc = cli("cache", "gc", "--store", store, "--min-age", "0", check=True)
    assert not leftover.exists() and not table.exists()
    assert all(path.exists() for path in mine)
    assert f"{mine[0]}: not a file featpipe writes; left alone" in gc.output
    assert f"{mine[2]}: not a file featpipe writes; left alone" in gc.output


def test_pack_removes_only_the_batch_files_its_ledger_names(tmp_path, cli, monkeypatch):
    store, stage, results, lookalike = _linked_batches(tmp_path, cli, monkeypatch)
    named = {b for _, b in stage.item_table().done_items()}
    pack_stage(stage)
    assert results.exists() and lookalike.exists()
    assert not any((tmp_path / "scratch" / name).exists() for name in named)


def test_repair_removes_only_item_files_featpipe_writes(tmp_path, cli):
    """A file of another name under ``items/`` is no stray item: verify names it, repair
    keeps it; a stray item file (featpipe's name, no ledger line) is still removed."""
    store, _ = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    notes = stage.item_path("v01").parent / "notes.txt"
    notes.write_text("mine")
    stray = stage.item_path("extra")
    stray.parent.mkdir(parents=True, exist_ok=True)
    np.save(stray, np.zeros(3, np.float32))
    found = cli("cache", "verify", "--store", store)
    assert f"note: stage {stage.name}: {notes}: not a file featpipe writes; left alone" \
        in found.output
    cli("cache", "verify", "--store", store, "--repair", check=True)
    assert notes.exists() and not stray.exists()


# -- 51.8: reviewer-found mutation survivors -----------------------------------------------------

def test_verify_compares_every_item_of_the_index_with_its_ledgers(tmp_path):
    """An index table whose counts and size agree with the ledgers, and whose checksums hold,
    but that gives one item a state its lines do not (a table written wrong): verify names the
    item (the per-item comparison, not only the counts)."""
    items = from_rows([(f"i{k}", "", [], []) for k in range(5)], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    for k in range(5):
        stage.record(f"i{k}", "done", sums={".npy": f"crc32:0000000{k}"})
    assert stage.compact_index() and stage.index_problems() == []
    index = stage_index.load(stage.path, stage.parse_line, need_table=True)
    row = index.table._row("i3")
    index.table.sums[row] = index.table.sums[(row + 1) % 5]  # another item's checksum
    stage_index.write(stage.path, index)
    assert stage_index.read_record(stage.path) is not None  # its own checksums hold
    assert stage.index_problems() == [
        "index index.json: item 'i3' differs from its ledgers' lines"]


def test_a_batch_file_is_flushed_and_fsynced_before_it_is_renamed_into_place(tmp_path,
                                                                           monkeypatch):
    """The commit of a batch: every byte of the file on disk (flushed, then fsynced) before
    the rename gives it its name; a crash after the rename never finds it short.  (The
    ``flush`` alone left out is an equivalent mutant: ``ZipFile.close`` flushes its file.)"""
    monkeypatch.setattr(batch_files, "MIN_ITEMS", 3)
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(3)], tmp_path)
    stage = Store(tmp_path / "s").stage("extract", {"n": 3}, items=items)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    writer = stage.batch_writer()
    rng = np.random.default_rng(0)
    for item_id in ("v0", "v1"):
        writer.add(item_id, rng.standard_normal((40, 8)), {"frame_index": np.arange(40)}, 0.1)
    writer.commit()
    (batch,) = (stage.path / "batches").glob("*.npz")
    (at, (_, tmp, final)), = [(k, e) for k, e in enumerate(events) if e[0] == "replace"
                              and e[2] == str(batch)]
    synced = [e for e in events[:at] if e[0] == "fsync" and e[1] == tmp]
    assert synced and synced[-1][2] == batch.stat().st_size


def test_a_views_item_has_the_view_stages_dtype_not_its_sources(tmp_path):
    """A view reads its source's columns and stores them as its own stage would: in its own
    dtype (float32 here, its source float16), as the step it stands for would have written."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(2)], tmp_path)
    source = store.stage("extract", {"n": 2}, items=items, dtype="float16")
    rows = np.linspace(-2, 2, 40).reshape(5, 8)
    for item_id in items.ids:
        source.write_item(item_id, rows)
    view = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    view.make_view(source, slice(2, 6), [])
    array = view.read_item("v1")
    assert source.read_item("v1").dtype == np.float16
    assert array.dtype == np.float32 == view.dtype
    np.testing.assert_array_equal(array, rows.astype(np.float16)[:, 2:6].astype(np.float32))
