"""Paths that protect data and that no test reached (issue 39 §6: each test kills mutants of
``checksums``, ``content``, ``store``, ``pack`` or ``packed`` that the other tests let live;
``benchmarks/mutation_sample.py``, ``benchmarks/results/mutation-testing.md``)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import threading
import time
import zlib

import numpy as np
import pytest

import featpipe.checksums as checksums
import featpipe.store.content as content
import featpipe.store.pack as pack
from featpipe.checksums import (
    PARALLEL_BYTES,
    ChecksumError,
    DataCrc,
    file_checksum,
    npy_file_checksum,
    seal_json,
    unseal_json,
)
from featpipe.errors import FeatpipeError, WriteError
from featpipe.fileio import atomic_save_npy, load_npy, safe_stem
from featpipe.manifest import from_rows
from featpipe.parallel import run_items
from featpipe.stages.cache import gc, verify
from featpipe.store import DamagedRecord, Store
from tests._computes import SleepyCompute, sleepy_stage
from tests._stores import write_npy_dataset


def crc_text(data: bytes) -> str:
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def npy_bytes(array: np.ndarray, version=None) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def npy_crc(raw: bytes) -> str:
    """The checksum of an ``.npy`` by its definition: data bytes, then header bytes."""
    handle = io.BytesIO(raw)
    version = np.lib.format.read_magic(handle)
    (np.lib.format.read_array_header_1_0 if version == (1, 0) else
     np.lib.format.read_array_header_2_0)(handle)
    start = handle.tell()
    return f"crc32:{zlib.crc32(raw[:start], zlib.crc32(raw[start:])) & 0xFFFFFFFF:08x}"


# -- checksums ----------------------------------------------------------------------------------
class _SlowZlib:
    """``zlib`` whose crc32 of a large buffer takes a while (a slow second thread)."""

    def __getattr__(self, name):
        return getattr(zlib, name)

    @staticmethod
    def crc32(data, value=0):
        if len(memoryview(data).cast("B")) >= PARALLEL_BYTES:
            time.sleep(0.3)
        return zlib.crc32(data, value)


@pytest.mark.parametrize("nbytes", [PARALLEL_BYTES - 4, PARALLEL_BYTES, 2 * PARALLEL_BYTES])
def test_a_save_waits_for_its_crc_however_slow_the_summing_thread(tmp_path, monkeypatch,
                                                                  nbytes):
    monkeypatch.setattr(checksums, "zlib", _SlowZlib())
    array = np.arange(nbytes // 4, dtype=np.float32)
    threads = threading.active_count()
    recorded = atomic_save_npy(tmp_path / "a.npy", array)
    assert recorded == npy_crc((tmp_path / "a.npy").read_bytes())
    assert threading.active_count() == threads  # the summing thread, if any, was joined
    crc = DataCrc(array.view(np.uint8))
    assert (crc._thread is not None) == (nbytes >= PARALLEL_BYTES)
    assert crc.result() == zlib.crc32(array.tobytes())


@pytest.mark.parametrize("where", [200, 2**20 - 1, 2**20 + 100])  # after the 128-byte header
def test_a_flip_anywhere_in_a_file_of_several_blocks_changes_its_checksum(tmp_path, where):
    """Files of more than one 1 MiB block: the first block counts as the last does."""
    raw = npy_bytes(np.random.default_rng(0).random(300_000))  # 2.3 MiB
    path = tmp_path / "a.npy"
    path.write_bytes(raw)
    assert npy_file_checksum(path) == npy_crc(raw)
    assert file_checksum(path) == crc_text(raw)
    flipped = bytearray(raw)
    flipped[where] ^= 0x01
    path.write_bytes(bytes(flipped))
    assert npy_file_checksum(path) != npy_crc(raw)
    assert file_checksum(path) != crc_text(raw)


def test_a_version_2_npy_is_summed_and_read_as_version_1(tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for version in ((1, 0), (2, 0)):
        raw = npy_bytes(array, version)
        path = tmp_path / f"v{version[0]}.npy"
        path.write_bytes(raw)
        assert npy_file_checksum(path) == npy_crc(raw)
        assert load_npy(path, checksum=npy_crc(raw)).tobytes() == array.tobytes()
        with pytest.raises(ChecksumError):
            load_npy(path, checksum="crc32:00000000")


def test_an_object_array_is_never_saved(tmp_path):
    with pytest.raises(ValueError, match="Object arrays cannot be saved"):
        atomic_save_npy(tmp_path / "a.npy", np.array([None, 1], dtype=object))
    assert not list(tmp_path.iterdir())


def test_a_seal_binds_a_record_to_its_place_and_every_byte(tmp_path):
    text = json.dumps({"a": 1, "b": [1, 2]}, indent=2).encode() + b"\n"
    sealed = seal_json(text, "stages/x/stage.json")
    assert unseal_json(sealed, "stages/x/stage.json") == ({"a": 1, "b": [1, 2]}, True)
    assert unseal_json(text, "stages/x/stage.json") == ({"a": 1, "b": [1, 2]}, False)
    with pytest.raises(ChecksumError, match="stages/y/stage.json"):
        unseal_json(sealed, "stages/y/stage.json")  # copied to another stage
    for at in range(len(sealed)):  # a flip anywhere: never read as the same sealed record
        flipped = bytearray(sealed)
        flipped[at] ^= 0x01
        try:
            _, was_sealed = unseal_json(bytes(flipped), "stages/x/stage.json")
        except ValueError:  # a ChecksumError, or not JSON any more
            continue
        assert not was_sealed, at  # the seal itself hit: unsealed, damage where it is due
    assert unseal_json(seal_json(b"{}", "o"), "o") == ({}, True)
    malformed = b'{"a": 1, "crc32": "not a checksum"}'  # no seal: read as written
    assert unseal_json(malformed, "o") == ({"a": 1, "crc32": "not a checksum"}, False)
    with pytest.raises(ValueError, match="a sealed record is a JSON object"):
        seal_json(b"[1]", "o")


# -- content ------------------------------------------------------------------------------------
def test_a_file_written_while_it_is_hashed_is_hashed_again(tmp_path, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"first")
    real = content.sha256_of
    calls = []

    def grows_once(p):
        digest = real(p)
        if not calls:
            with open(p, "ab") as handle:  # another program appends meanwhile
                handle.write(b" and more")
        calls.append(digest)
        return digest

    monkeypatch.setattr(content, "sha256_of", grows_once)
    hashes = content.ContentHashes(None)
    assert hashes.file_hash(path) == (len(b"first and more"),
                                      hashlib.sha256(b"first and more").hexdigest())
    assert len(calls) == 2


def _imported(tmp_path):
    manifest = write_npy_dataset(tmp_path, n=3)
    store = Store(tmp_path / "s")
    from featpipe import stages

    stages.import_features(store, [str(tmp_path / "npy")], str(manifest), name="feat")
    return store, store.resolve("feat")


def test_read_hashes_are_read_again_when_their_file_is_replaced(tmp_path):
    store, stage = _imported(tmp_path)
    kept = content.read_hashes(stage.path)
    assert set(kept) == {"v00", "v01", "v02"}
    assert content.read_hashes(stage.path) == kept  # unchanged: the same
    path = stage.path / content.READ_HASHES
    raw = path.read_bytes()
    path.unlink()
    path.write_bytes(raw.replace(b"a", b"b", 1) if b"a" in raw else raw[::-1])
    with pytest.raises(DamagedRecord, match="read-hashes.json"):
        content.read_hashes(stage.path)


def test_a_file_that_appears_after_its_key_is_said_to_have_appeared(tmp_path, monkeypatch,
                                                                    cli):
    manifest = write_npy_dataset(tmp_path, n=3)
    target = tmp_path / "npy" / "v01.npy"
    data = target.read_bytes()
    target.unlink()
    real = Store.stage

    def then_appears(self, *args, **kwargs):
        stage = real(self, *args, **kwargs)
        target.write_bytes(data)
        return stage

    monkeypatch.setattr(Store, "stage", then_appears)
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
                 tmp_path / "s", "--name", "feat", "--on-error", "skip")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "v01: its file appeared after the stage key was computed" in result.output


def test_a_damaged_cache_entry_is_blamed_on_the_cache_not_the_file(tmp_path):
    """A cache entry of the right stat record but the wrong SHA-256 (its seal made anew, as
    a cache written by a faulty program would be): the key is computed from it, the read
    differs, and the message says the cache is damaged, not the file."""
    manifest = write_npy_dataset(tmp_path, n=3)
    store = Store(tmp_path / "s")
    from featpipe import stages

    stages.import_features(store, [str(tmp_path / "npy")], str(manifest), name="feat")
    cache = store.root / content.CACHE_NAME
    entries = content.load_cache(cache)
    path = os.path.abspath(tmp_path / "npy" / "v02.npy")
    entries[path][4] = "f" * 64
    cache.write_bytes(content.cache_bytes(entries))
    run = stages.import_features(store, [str(tmp_path / "npy")], str(manifest), name="bad",
                                 options=stages.RunOptions(on_error="skip"))
    error = run.summary.failed["v02"]
    assert "content-hash cache" in error and "damaged, not the file" in error
    from featpipe.stages.cache import rebuild_cache

    rebuild_cache(store)  # what `verify --repair` does to a cache whose seal differs
    assert content.load_cache(cache)[path][4] == content.sha256_of(path)


# -- store: ledger ------------------------------------------------------------------------------
def test_a_failing_fsync_of_the_ledger_cuts_the_line_back(tmp_path, monkeypatch):
    stage = sleepy_stage(Store(tmp_path / "s"), 2)
    stage.record(stage.items.ids[0], "failed", error="first")
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    size = ledger.stat().st_size

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(WriteError, match="Input/output error"):
        stage.record(stage.items.ids[1], "failed", error="second")
    monkeypatch.undo()
    assert ledger.stat().st_size == size and stage.ledger_problems() == []


@pytest.mark.parametrize("cut", ["newline", "middle", "only-line", "long-only-line",
                                 "64KiB-plus-one"])
def test_a_ledger_cut_short_is_continued_by_a_process_of_the_same_pid(tmp_path, cut):
    """A dead process's ledger (``<host>-<pid>``) whose pid this process reuses: a last line
    cut just before its newline is kept whole, one cut in its middle is dropped (also when it
    is the ledger's only line, with no newline before it); none is glued to the next line."""
    stage = sleepy_stage(Store(tmp_path / "s"), 3)
    first, second, third = stage.items.ids
    run_items(stage, [first] if cut.endswith("only-line") else [first, second],
              SleepyCompute())
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    raw = ledger.read_bytes()
    ledger.write_bytes({"newline": raw[:-1], "middle": raw[:-20], "only-line": raw[:-20],
                        # a line longer than the 64 KiB read from the end (a long error)
                        "long-only-line": b'{"id": "x", "error": "' + b"e" * 70_000,
                        # one byte more than that read: the loop reads from 0 once more
                        "64KiB-plus-one": b'{"id": "x", "error": "' + b"e" * (65_537 - 22)
                        }[cut])
    from featpipe.store.ledger import LedgerWriter as _LedgerWriter

    _LedgerWriter._open.clear()  # as a new process would
    run_items(stage, [third], SleepyCompute())
    assert stage.ledger_problems() == []
    assert stage.done_ids() == {"newline": {first, second, third}, "middle": {first, third},
                                "only-line": {third}, "long-only-line": {third},
                                "64KiB-plus-one": {third}}[cut]


def test_a_done_line_without_checksums_is_refused_in_a_checksummed_stage(tmp_path):
    stage = sleepy_stage(Store(tmp_path / "s"), 1)
    with pytest.raises(ValueError, match="holds the checksums"):
        stage.record(stage.items.ids[0], "done")


# -- store: names, records ----------------------------------------------------------------------
def test_gc_with_a_damaged_name_removes_nothing_until_repaired(tmp_path, cli):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 1)
    run_items(stage, stage.items.ids, SleepyCompute())
    store.set_name("x", stage)
    orphan = store.stage("sleepy", {"other": 1}, items=stage.items)
    past = time.time() - 3600
    for path in [orphan.path, *orphan.path.rglob("*")]:
        os.utime(path, (past, past))
    (store.names_dir / "x").write_bytes((store.names_dir / "x").read_bytes()[:-3] + b"00\n")
    result = gc(store, min_age=0)
    assert result.removed == [] and any("name 'x'" in p for p in result.problems)
    assert verify(store, repair=True) == 0
    assert gc(store, min_age=0).removed == [orphan.path, stage.path]


def test_a_name_file_of_one_line_is_read_as_old_unless_its_stage_has_checksums(tmp_path):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 1)
    (store.names_dir).mkdir()
    (store.names_dir / "x").write_text(stage.name + "\n")
    with pytest.raises(FeatpipeError, match="its checksum is missing"):
        store.read_name("x")
    meta = stage.path / "stage.json"  # a stage from before issue 39: no checksums, no seal
    value = json.loads(meta.read_text())
    for key in ("checksums", "files", "crc32"):
        value.pop(key)
    meta.write_text(json.dumps(value))
    assert store.read_name("x") == stage.name


def test_a_missing_item_list_is_written_again_only_with_the_same_bytes(tmp_path):
    items = from_rows([("a", "a.npy", ["x"], ["train"])], root=tmp_path)
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"p": 1}, items=items)
    (stage.path / "items.csv").unlink()
    with pytest.raises(DamagedRecord, match="items.csv is missing"):
        assert Store(store.root).stage_by_folder(stage.name).items
    again = store.stage("import", {"p": 1}, items=items)
    assert again.items.ids == ["a"]
    (stage.path / "items.csv").unlink()
    moved = from_rows([("a", "a.npy", ["x"], ["train"])], root=tmp_path / "elsewhere")
    with pytest.raises(FeatpipeError, match="would write other bytes"):
        store.stage("import", {"p": 1}, items=moved)


# -- pack ---------------------------------------------------------------------------------------
def _finished(tmp_path, n=5):
    stage = sleepy_stage(Store(tmp_path / "s"), n)
    run_items(stage, stage.items.ids, SleepyCompute())
    return stage


def test_a_failing_fsync_while_packing_writes_nothing_and_keeps_the_items(tmp_path,
                                                                         monkeypatch):
    stage = _finished(tmp_path)
    loose = sorted((stage.path / "items").rglob("*.npy"))

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(WriteError, match="Input/output error"):
        pack.pack_stage(stage, shards=2)
    monkeypatch.undo()
    assert sorted((stage.path / "items").rglob("*.npy")) == loose
    assert not list((stage.path / "packed").glob("*")) and stage.packed() is None


#: HDF5's bytes beyond the arrays the room check counts (measured: featpipe/store/pack.py)
FILE_BYTES, DATASET_BYTES = 65536, 4096


def test_a_pack_needs_room_for_its_items_and_hdf5s_bytes(tmp_path, monkeypatch):
    stage = _finished(tmp_path)
    files = sorted((stage.path / "items").rglob("*.npy"))
    needed = FILE_BYTES * 2 + sum(p.stat().st_size + DATASET_BYTES for p in files)
    monkeypatch.setattr(pack, "free_bytes", lambda path: needed - 1)
    with pytest.raises(FeatpipeError, match="the packed files need about"):
        pack.pack_stage(stage, shards=2)
    assert stage.packed() is None
    monkeypatch.setattr(pack, "free_bytes", lambda path: needed)
    pack.pack_stage(stage, shards=2)
    assert stage.is_complete()


def test_a_repack_counts_the_old_pack_in_the_room_it_needs(tmp_path, monkeypatch):
    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=2)
    old = sum(p.stat().st_size for p in stage.packed().files)
    needed = FILE_BYTES * 2 + old  # the items are in the old pack only
    monkeypatch.setattr(pack, "free_bytes", lambda path: needed - 1)
    with pytest.raises(FeatpipeError, match="the packed files need about"):
        pack.pack_stage(stage, shards=2)
    monkeypatch.setattr(pack, "free_bytes", lambda path: needed)
    pack.pack_stage(stage, shards=2)
    assert stage.is_complete()


def test_a_damaged_ids_list_of_a_shard_is_one_error_naming_it(tmp_path):
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=1)
    (shard,) = stage.packed().files
    with open_h5(shard, "r+") as handle:
        handle["ids"].attrs["crc32"] = "crc32:00000000"
    with pytest.raises(FeatpipeError, match=f"damaged packed file {shard}"):
        Store(stage.path.parent.parent).stage_by_folder(stage.name).done_ids()


def test_a_shard_whose_ids_list_is_damaged_is_repaired_and_recomputed_equal(tmp_path):
    """`verify` of a shard whose ids list fails its checksum (one item's data damaged too)
    cannot trust any item of it: it names each; `--repair` removes them, and the rerun
    gives every item equal to an undamaged run's."""
    from featpipe.reporting import Reporter
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path)
    expected = {i: stage.read_item(i) for i in stage.items.ids}
    pack.pack_stage(stage, shards=1)
    (shard,) = stage.packed().files
    with open_h5(shard, "r+") as handle:
        handle["ids"].attrs["crc32"] = "crc32:00000000"
        handle["items"][safe_stem(stage.items.ids[2])].attrs["crc32"] = "crc32:00000000"
    store = Store(stage.path.parent.parent)
    quiet = Reporter(progress=False)
    assert verify(store, reporter=quiet) == len(expected) + 1
    assert verify(store, reporter=quiet, repair=True) == 0
    repaired = store.stage_by_folder(stage.name)
    assert repaired.done_ids() == set()
    run_items(repaired, repaired.items.ids, SleepyCompute())
    for item_id, array in expected.items():
        assert repaired.read_item(item_id).tobytes() == array.tobytes()
    assert verify(store, reporter=quiet) == 0


def test_a_pack_whose_every_item_is_damaged_is_repaired_to_none_then_recomputed(tmp_path):
    """Every packed item fails its checksum (the ids list is whole): `--repair` drops them
    all, the pack index then counts 0 items (not a negative or stale count), and the rerun
    recomputes each equal to an undamaged run's."""
    from featpipe.reporting import Reporter
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path, n=3)
    expected = {i: stage.read_item(i) for i in stage.items.ids}
    pack.pack_stage(stage, shards=1)
    (shard,) = stage.packed().files
    with open_h5(shard, "r+") as handle:
        for item_id in expected:
            handle["items"][safe_stem(item_id)].attrs["crc32"] = "crc32:00000000"
    store = Store(stage.path.parent.parent)
    quiet = Reporter(progress=False)
    assert verify(store, reporter=quiet) >= 3  # each item (and its file)
    assert verify(store, reporter=quiet, repair=True) == 0
    repaired = store.stage_by_folder(stage.name)
    assert repaired.done_ids() == set() and repaired.packed().n_items == 0
    run_items(repaired, repaired.items.ids, SleepyCompute())
    assert all(repaired.read_item(i).tobytes() == a.tobytes() for i, a in expected.items())
    assert verify(store, reporter=quiet) == 0


def test_a_name_file_holds_its_stage_and_the_crc_of_the_name_with_it(tmp_path):
    """The second line binds the name: a name file copied onto another name of the same
    stage (same bytes, valid there) is damage here."""
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 1)
    store.set_name("x", stage)
    text = (store.names_dir / "x").read_text()
    bound = crc_text(("x\n" + stage.name).encode())
    assert text == f"{stage.name}\n{bound}\n"
    (store.names_dir / "y").write_text(text)
    with pytest.raises(FeatpipeError, match="name 'y'.* is damaged"):
        store.read_name("y")
    assert store.read_name("x") == stage.name


def test_a_damaged_sealed_record_is_named_by_its_full_path(tmp_path):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 1)
    run_items(stage, stage.items.ids, SleepyCompute())
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    ledger.write_bytes(ledger.read_bytes().replace(b'"done"', b'"dome"').replace(
        b'"dome"', b'"done"').replace(b'"seconds": ', b'"seconds":  ', 1))
    (problem,) = stage.ledger_problems()
    assert f"damaged ({ledger}: checksum crc32:" in problem
    meta = stage.path / "stage.json"
    meta.write_bytes(meta.read_bytes().replace(b'"dtype": "float32"', b'"dtype": "float64"'))
    with pytest.raises(FeatpipeError, match=f"damaged stage metadata \\({meta}: checksum"):
        store.stage_by_folder(stage.name)


def test_a_stage_records_the_checksum_rules_it_was_written_with(tmp_path):
    """``"checksums": 2`` in stage.json (docs/store.md): what makes a missing checksum damage."""
    stage = sleepy_stage(Store(tmp_path / "s"), 1)
    assert json.loads((stage.path / "stage.json").read_text())["checksums"] == 2
    assert stage.checksummed


def test_a_ledger_keeps_an_ids_own_characters(tmp_path):
    items = from_rows([("café/été", "", ["x"], ["train"])], root=tmp_path)
    stage = Store(tmp_path / "s").stage("import", {"p": 1}, items=items)
    stage.write_item("café/été", np.ones(3))
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    assert '"id": "café/été"' in ledger.read_bytes().decode()
    assert stage.done_ids() == {"café/été"}


def test_an_item_list_that_is_not_utf8_is_one_error(tmp_path):
    items = from_rows([("a", "", ["x"], ["train"])], root=tmp_path)
    stage = Store(tmp_path / "s").stage("import", {"p": 1}, items=items)
    meta = stage.path / "stage.json"  # written before issue 39: no checksum of items.csv
    value = json.loads(meta.read_text())
    for key in ("checksums", "files", "crc32"):
        value.pop(key)
    meta.write_text(json.dumps(value))
    (stage.path / "items.csv").write_bytes(b"id,path,label,split1\n\xff,,x,train\n")
    with pytest.raises(FeatpipeError, match="items.csv is not UTF-8"):
        assert Store(tmp_path / "s").stage_by_folder(stage.name).items


def test_a_folder_with_names_that_are_not_a_stores_is_not_a_store(tmp_path):
    from featpipe.store import is_store

    (tmp_path / "names").mkdir()
    (tmp_path / "names" / "alice").write_bytes(b"\xff\xfe not a stage\n")
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "notes.txt").write_text("x")
    assert not is_store(tmp_path)
    Store(tmp_path / "inner").check_not_nested()  # allowed
    (tmp_path / "names" / "bob").write_text("encode-0123456789abcdef\n")
    assert is_store(tmp_path)
    with pytest.raises(FeatpipeError, match="is inside the store"):
        Store(tmp_path / "inner").check_not_nested()


def test_a_cache_that_is_not_even_text_is_rebuilt_by_repair(tmp_path):
    store, _ = _imported(tmp_path)
    cache = store.root / content.CACHE_NAME
    cache.write_bytes(b"\xff\xfe" + cache.read_bytes()[2:])
    assert verify(store) == 1
    assert verify(store, repair=True) == 0
    assert verify(store) == 0 and content.load_cache(cache) == {}


def test_read_hashes_are_read_once_while_their_file_is_unchanged(tmp_path, monkeypatch):
    from featpipe.store import Stage

    _, stage = _imported(tmp_path)
    reads = []
    real = Stage.read_record
    monkeypatch.setattr(Stage, "read_record",
                        lambda self, name: reads.append(name) or real(self, name))
    first = content.read_hashes(stage.path)
    assert content.read_hashes(stage.path) == first and len(reads) <= 1


def test_a_stage_without_read_hashes_keeps_none_and_an_old_damaged_one_none(tmp_path):
    items = from_rows([("a", "", ["x"], ["train"])], root=tmp_path)
    stage = Store(tmp_path / "s").stage("encode", {"p": 1}, items=items)
    assert content.read_hashes(stage.path) == {}
    assert content.changed_since_key(stage.path, "a", "0" * 64) is None
    meta = stage.path / "stage.json"  # a stage from before issue 39, its record damaged
    value = json.loads(meta.read_text())
    for key in ("checksums", "files", "crc32"):
        value.pop(key)
    meta.write_text(json.dumps(value))
    (stage.path / content.READ_HASHES).write_text('{"a": "12')
    assert content.read_hashes(stage.path) == {}
    (stage.path / content.READ_HASHES).write_text('["a"]')
    assert content.read_hashes(stage.path) == {}
    record = {"a": "0" * 64, "b": None}  # another layout (indented): read as JSON
    (stage.path / content.READ_HASHES).write_text(json.dumps(record, indent=1))
    assert content.read_hashes(stage.path) == record


def test_the_read_hashes_record_is_the_same_bytes_whatever_the_order():
    assert content.read_hashes_record({"b": "2", "a": None}) == \
        content.read_hashes_record({"a": None, "b": "2"}) == b'{"a": null, "b": "2"}'


def test_a_file_gone_at_its_read_is_said_to_have_changed(tmp_path):
    _, stage = _imported(tmp_path)
    missing = tmp_path / "npy" / "v01.npy"
    missing.unlink()
    reason = content.changed_since_key(stage.path, "v01", None, missing)
    assert reason.startswith("its file changed after the stage key was computed (SHA-256 "
                             "missing... read")
    assert content.file_changed_since_key(stage.path, "v01", missing) == reason


def test_a_changed_file_is_said_to_have_changed_when_the_hash_cache_is_gone(tmp_path):
    """The "file changed" message asks the store's content-hash cache first; a store whose
    cache file was deleted (gc of a user, a fresh copy) gives the same message, not a
    crash."""
    store, stage = _imported(tmp_path)
    path = tmp_path / "npy" / "v02.npy"
    np.save(path, np.zeros((3, 8), np.float32))
    (store.root / content.CACHE_NAME).unlink()
    reason = content.changed_since_key(stage.path, "v02", content.sha256_of(path), path)
    assert reason.startswith("its file changed after the stage key was computed")


def test_a_file_gone_after_it_was_read_is_said_to_have_changed(tmp_path):
    """Read (its bytes hashed), then deleted before the cache is asked: the cache's entry
    for it cannot be checked against a stat record, so the file is blamed, as changed."""
    _, stage = _imported(tmp_path)
    path = tmp_path / "npy" / "v02.npy"
    assert isinstance(content.read_hashes(stage.path), content.ReadHashes)  # scanned
    path.unlink()
    reason = content.changed_since_key(stage.path, "v02", "0" * 64, path)
    assert reason.startswith("its file changed after the stage key was computed (SHA-256 "
                             "000000000000... read")


def test_an_old_stage_reads_nothing_to_check_a_file_it_kept_no_hash_of(tmp_path,
                                                                      monkeypatch):
    _, stage = _imported(tmp_path)
    monkeypatch.setattr(content, "sha256_of", lambda path: pytest.fail("hashed"))
    assert content.file_changed_since_key(stage.path, "not-an-item", tmp_path / "x") is None


def _cache_lies_about(store, path, sha: str, record=None) -> None:
    """The store's cache says ``path`` has SHA-256 ``sha`` under ``record`` (its stat now)."""
    cache = store.root / content.CACHE_NAME
    entries = content.load_cache(cache)
    entries[os.path.abspath(path)] = [*(record or content.stat_record(os.stat(path))), sha]
    cache.write_bytes(content.cache_bytes(entries))


def test_a_changed_read_asks_the_cache_before_blaming_the_file(tmp_path):
    store, stage = _imported(tmp_path)
    path = tmp_path / "npy" / "v02.npy"
    kept = content.read_hashes(stage.path)["v02"]
    np.save(path, np.zeros((3, 8), np.float32))  # other bytes...
    _cache_lies_about(store, path, kept)  # ...that the cache holds under the key's hash
    digest = content.sha256_of(path)
    for reason in (content.changed_since_key(stage.path, "v02", digest, path),
                   content.file_changed_since_key(stage.path, "v02", path)):
        assert "content-hash cache" in reason and "damaged, not the file" in reason
        assert str(path) in reason
    _cache_lies_about(store, path, kept, record=[0, 0, 0, 0])  # another stat record
    assert "its file changed" in content.changed_since_key(stage.path, "v02", digest, path)
    cache = store.root / content.CACHE_NAME
    entries = content.load_cache(cache)
    entries[os.path.abspath(path)] = "not a record"
    cache.write_bytes(content.cache_bytes(entries))
    assert "its file changed" in content.changed_since_key(stage.path, "v02", digest, path)


def test_a_damaged_cache_is_named_by_its_path_and_warned_of(tmp_path, caplog):
    store, _ = _imported(tmp_path)
    cache = store.root / content.CACHE_NAME
    cache.write_bytes(cache.read_bytes().replace(b"npy", b"npx", 1))
    with pytest.raises(ChecksumError, match=f"{cache}: checksum"):
        content.load_cache(cache, strict=True)
    with caplog.at_level("WARNING", logger="featpipe"):
        assert content.load_cache(cache) == {}
    assert f"{cache} is damaged" in caplog.text and "every file is hashed again" in caplog.text


def test_a_file_is_hashed_three_times_at_most_while_it_keeps_changing(tmp_path,
                                                                     monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x")
    calls = []

    def grows_three_times(p):
        calls.append(p)
        if len(calls) <= 3:
            with open(p, "ab") as handle:
                handle.write(b"x")
        return "0" * 64

    monkeypatch.setattr(content, "sha256_of", grows_three_times)
    with pytest.raises(FeatpipeError, match="keeps changing while it is hashed"):
        content.ContentHashes(None).file_hash(path)
    assert len(calls) == 3


def test_the_changed_file_messages_word_for_word(tmp_path):
    store, stage = _imported(tmp_path)
    path = tmp_path / "npy" / "v02.npy"
    kept = content.read_hashes(stage.path)["v02"]
    np.save(path, np.zeros((3, 8), np.float32))
    digest = content.sha256_of(path)
    assert content.changed_since_key(stage.path, "v02", digest) == (
        f"its file changed after the stage key was computed (SHA-256 {digest[:12]}... read, "
        f"{kept[:12]}... keyed): nothing was written; run the command again once the file "
        "is complete")
    _cache_lies_about(store, path, kept)
    assert content.changed_since_key(stage.path, "v02", digest, path) == (
        f"the store's content-hash cache {store.root / content.CACHE_NAME} holds SHA-256 "
        f"{kept[:12]}... for {path}, whose bytes read {digest[:12]}... under the same stat "
        "record: the cache is damaged, not the file; `featpipe cache verify --repair --rehash` "
        "hashes the cached files again, then run the command again")


def _sealed_index(stage, index: dict) -> None:
    from featpipe.store.packed import index_owner

    (stage.path / "packed" / "pack.json").write_bytes(
        seal_json(json.dumps(index).encode(), index_owner(stage.name)))


@pytest.mark.parametrize(("change", "message"), [
    ({"shards": 3}, "file count differs from shards"),
    ({"files": ["shard-0000-of-0002.0a.h5", "../elsewhere.h5"]}, "'../elsewhere.h5'"),
    ({"files": ["shard-0000-of-0002.0a.h5", 7]}, "(7)"),
    ({"sums": "crc32:00000000"}, "'sums' must give the checksum of every shard file"),
    ({"sums": {}}, "'sums' must give the checksum of every shard file"),
    ({"sums": {"shard-0000-of-0002.0a.h5": "crc32:00000000",
               "shard-0001-of-0002.0a.h5": "md5:0"}}, "'sums' must give the checksum"),
    ({"sums": {"shard-0000-of-0002.0a.h5": "crc32:00000000",
               "shard-0001-of-0002.0a.h5": 7}}, "'sums' must give the checksum"),
])
def test_a_sealed_pack_index_that_lists_the_wrong_files_is_corrupt(tmp_path, change, message):
    """Sealed as featpipe seals it (a program that wrote it wrong): the seal passes, the list
    does not."""
    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=2)
    index = {"shards": 2, "files": ["shard-0000-of-0002.0a.h5", "shard-0001-of-0002.0a.h5"],
             "n_items": 5, "generation": "0a",
             "sums": {"shard-0000-of-0002.0a.h5": "crc32:00000000",
                      "shard-0001-of-0002.0a.h5": "crc32:00000000"}}
    _sealed_index(stage, {**index, **change})
    with pytest.raises(FeatpipeError, match=re.escape(message)):
        Store(stage.path.parent.parent).stage_by_folder(stage.name).packed()
    _sealed_index(stage, index)  # the same list, right: it opens
    assert Store(stage.path.parent.parent).stage_by_folder(stage.name).packed().n_shards == 2


def test_a_forked_process_opens_its_own_packed_files(tmp_path):
    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=1)
    packed = stage.packed()
    (path,) = packed.files
    parent = packed._handle(path)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another handle than the parent's, and it reads
        try:
            ok = (packed._handle(path) is not parent
                  and packed.read(stage.items.ids[0]) is not None)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert packed._handle(path) is parent  # the parent keeps its own


def test_packed_reads_of_an_item_not_packed_a_damaged_sidecar_and_a_damaged_index(tmp_path):
    from featpipe.checksums import DamagedItem
    from featpipe.fileio import safe_stem
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=1)
    (shard,) = (stage.path / "packed").glob("shard-*.h5")
    item_id = stage.items.ids[0]
    with open_h5(shard, "r+") as handle:  # before any read keeps the file open
        handle[f"extras/{safe_stem(item_id)}/timestamps"].attrs["crc32"] = "crc32:00000000"
    packed = stage.packed()
    assert packed.read("video/999") is None and packed.extras("video/999") == {}
    reopened = Store(stage.path.parent.parent).stage_by_folder(stage.name)
    with pytest.raises(DamagedItem, match="timestamps.*checksum crc32:"):
        reopened.extras_of(item_id)
    index = stage.path / "packed" / "pack.json"
    index.write_bytes(index.read_bytes().replace(b'"shards": 1', b'"shards": 2'))
    with pytest.raises(FeatpipeError, match=f"damaged pack index \\({index}: checksum"):
        Store(stage.path.parent.parent).stage_by_folder(stage.name).packed()


def test_a_pack_makes_one_file_per_ten_thousand_items_by_default():
    """docs/cluster.md and `cache pack --help`: one file per 10,000 items."""
    assert pack.ITEMS_PER_FILE == 10_000


def test_a_shard_whose_ids_differ_after_packing_removes_nothing(tmp_path, monkeypatch):
    from featpipe.checksums import ids_checksum
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path)
    loose = sorted((stage.path / "items").rglob("*.npy"))
    real = pack._write_shard

    def one_id_wrong(stage_, ids, target, read=None):
        checksum = real(stage_, ids, target, read)
        with open_h5(target, "r+") as handle:
            wrong = [*ids[:-1], "video/999"]
            del handle["ids"]
            handle.create_dataset("ids", data=wrong).attrs["crc32"] = ids_checksum(wrong)
        return checksum

    monkeypatch.setattr(pack, "_write_shard", one_id_wrong)
    with pytest.raises(FeatpipeError, match="packed ids differ from the stage's; nothing "
                                            "removed"):
        pack.pack_stage(stage, shards=1)
    assert sorted((stage.path / "items").rglob("*.npy")) == loose and stage.packed() is None


def test_the_pack_index_says_its_items_and_generation_and_a_repair_keeps_them_true(
        tmp_path):
    from featpipe.fileio import safe_stem
    from featpipe.store.packed import open_h5

    stage = _finished(tmp_path, n=6)
    pack.pack_stage(stage, shards=2)
    index, _ = unseal_json((stage.path / "packed" / "pack.json").read_bytes(),
                           f"stages/{stage.name}/packed/pack.json")
    assert index["n_items"] == 6
    assert all(name.endswith(f".{index['generation']}.h5") for name in index["files"])
    first, second = stage.packed().files
    untouched = (second.name, second.stat().st_ino)
    victim = next(i for i in stage.items.ids if stage.packed().file_of(i) == first)
    with open_h5(first, "r+") as handle:  # one item damaged in the first file
        handle[f"items/{safe_stem(victim)}"].attrs["crc32"] = "crc32:00000000"
    assert verify(Store(stage.path.parent.parent), repair=True) == 0
    index, _ = unseal_json((stage.path / "packed" / "pack.json").read_bytes(),
                           f"stages/{stage.name}/packed/pack.json")
    assert index["n_items"] == 5
    assert (second.name, second.stat().st_ino) == untouched  # the other file stays as it was
    assert sorted(p.name for p in (stage.path / "packed").glob("*.h5")) == \
        sorted(index["files"])  # the damaged file is gone


def test_a_repair_of_a_pack_from_before_checksums_sums_every_file(tmp_path):
    from tests._stores import make_old

    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=2)
    make_old(stage.path.parent.parent, item_sums=False)
    old = Store(stage.path.parent.parent).stage_by_folder(stage.name)
    assert old.packed().sums is None
    victim = stage.items.ids[0]
    pack.repair_pack(old, {victim}, set())
    index = json.loads((stage.path / "packed" / "pack.json").read_text())
    assert set(index["sums"]) == set(index["files"])
    for name, checksum in index["sums"].items():
        assert file_checksum(stage.path / "packed" / name) == checksum


def test_a_shard_is_flushed_before_it_is_fsynced(tmp_path, monkeypatch):
    """What fsync makes durable is the whole file: Python's buffer flushed first."""
    stage = _finished(tmp_path, n=40)
    sizes = []
    real = os.fsync

    def recording(fd):
        sizes.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    pack.pack_stage(stage, shards=1)
    (shard,) = stage.packed().files
    assert shard.stat().st_size in sizes


def test_the_default_number_of_files_rounds_up(tmp_path, monkeypatch):
    stage = _finished(tmp_path, n=5)
    monkeypatch.setattr(pack, "ITEMS_PER_FILE", 2)
    assert len(pack.pack_stage(stage).files) == 3  # 5 items, 2 a file


def test_a_file_that_cannot_be_removed_is_named_as_such(tmp_path, monkeypatch):
    from pathlib import Path

    stage = _finished(tmp_path)
    pack.pack_stage(stage, shards=1)
    real = Path.unlink

    def refuse(self, *args, **kwargs):
        if self.suffix == ".h5" or self.name == "pack.json":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse)
    for attempt in (lambda: pack.pack_stage(stage, shards=2),  # the old file
                    lambda: pack.repair_pack(stage, {stage.items.ids[0]}, set()),
                    lambda: pack.remove_pack(stage)):
        with pytest.raises(WriteError, match="cannot remove .*: Permission denied"):
            attempt()


def test_a_damaged_pack_index_is_removed_with_its_files_and_says_how_many_items(tmp_path):
    stage = _finished(tmp_path, n=6)
    pack.pack_stage(stage, shards=2)
    index = stage.path / "packed" / "pack.json"
    index.write_bytes(index.read_bytes().replace(b'"n_items": 6', b'"n_items": 7'))
    lines = []
    reporter = type("R", (), {"info": lambda self, text: lines.append(text),
                              "warn": lambda self, text: lines.append(text)})()
    assert verify(Store(stage.path.parent.parent), reporter=reporter, repair=True) == 0
    assert any("removed the damaged pack (6 packed item(s) to recompute)" in line
               for line in lines)
    assert not list((stage.path / "packed").iterdir())
