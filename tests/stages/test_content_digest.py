"""Content keys at their edges (issue 31 §4: each test kills a mutation of
``featpipe/store/content.py`` that the older tests let live; ``benchmarks/mutation_sample.py``):
what an item id adds to the digest, a missing file, a damaged or foreign cache file."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from featpipe import stages
from featpipe.store import Store
from featpipe.store.content import CACHE_NAME, ContentHashes, load_cache, sha256_of
from tests._stores import write_npy_dataset


def _files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"first file")
    (tmp_path / "b.bin").write_bytes(b"the second file")
    return tmp_path / "a.bin", tmp_path / "b.bin"


def test_two_items_that_swap_their_files_get_a_new_digest(tmp_path):
    a, b = _files(tmp_path)
    hashes = ContentHashes(None)
    assert hashes.digest([("x", a), ("y", b)]) != hashes.digest([("y", a), ("x", b)])
    assert hashes.digest([("x", a), ("y", b)]) == ContentHashes(None).digest(
        [("x", a), ("y", b)])


def test_the_digest_is_sha256_over_one_line_per_file(tmp_path):
    """The documented record: ``<label as JSON> <size> <sha256>`` per file, a missing file as
    ``None None``, recomputed here from hashlib."""
    a, _ = _files(tmp_path)
    expected = hashlib.sha256(
        f'"x" 10 {hashlib.sha256(b"first file").hexdigest()}\n"gone" None None\n'.encode())
    assert ContentHashes(None).digest([("x", a), ("gone", None)]) == expected.hexdigest()


@pytest.mark.parametrize("damage", [b"\xff\xfe not text", b'{"cut": [1, 2', b"[1, 2, 3]",
                                    b'"a string"'])
def test_a_damaged_cache_file_is_rebuilt_not_raised(tmp_path, damage):
    manifest = write_npy_dataset(tmp_path, n=3)
    store = Store(tmp_path / "store")
    store.root.mkdir()
    (store.root / CACHE_NAME).write_bytes(damage)
    run = stages.import_features(store, [str(tmp_path / "npy")], str(manifest), name="feat")
    assert run.summary.done == 3
    cache = json.loads((store.root / CACHE_NAME).read_text())
    path = os.path.abspath(tmp_path / "npy" / "v01.npy")
    assert cache[path][4] == sha256_of(path)
    again = stages.import_features(store, [str(tmp_path / "npy")], str(manifest), name="feat")
    assert again.stage == run.stage and again.summary.skipped == 3


def test_a_cache_entry_of_another_shape_or_another_file_is_hashed_again(tmp_path):
    a, b = _files(tmp_path)
    info = os.stat(a)
    record = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    lies = {os.path.abspath(a): [*record, "0" * 64, "extra"],  # not a 5-entry record
            os.path.abspath(b): [*record, "1" * 64]}  # the stat record of another file
    (tmp_path / "cache.json").write_text(json.dumps(lies))
    hashes = ContentHashes(tmp_path / "cache.json")
    assert hashes.file_hash(a) == (10, sha256_of(a))
    assert hashes.file_hash(b) == (15, sha256_of(b))
    assert hashes.read_bytes == 25
    hashes.save()
    assert json.loads((tmp_path / "cache.json").read_text())[os.path.abspath(a)][4] == \
        sha256_of(a)


def test_an_unchanged_cache_is_not_written_and_no_cache_file_means_none(tmp_path):
    a, b = _files(tmp_path)
    ContentHashes(tmp_path / "cache.json").save()
    assert not (tmp_path / "cache.json").exists()
    none = ContentHashes(None)
    assert none.file_hash(a)[1] == sha256_of(a)
    none.save()  # nothing to write to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]
    path = tmp_path / "new" / "store" / "cache.json"  # folders made as needed
    cached = ContentHashes(path)
    cached.file_hash(a)
    cached.save()
    written = os.stat(path)
    cached.save()  # saved already: nothing written again
    again = ContentHashes(path)
    again.file_hash(a)
    again.save()  # served from the cache: nothing changed, nothing written
    assert (os.stat(path).st_ino, os.stat(path).st_mtime_ns) == (written.st_ino,
                                                                 written.st_mtime_ns)
    again.file_hash(b)
    again.save()  # a new entry: written into the existing folder
    assert ContentHashes(path).file_hash(b)[1] == sha256_of(b)
    assert set(load_cache(path)) == {os.path.abspath(a), os.path.abspath(b)}


def test_sha256_of_reads_a_file_of_several_blocks(tmp_path):
    data = np.random.default_rng(0).bytes((1 << 20) * 2 + 17)
    (tmp_path / "big").write_bytes(data)
    assert sha256_of(tmp_path / "big") == hashlib.sha256(data).hexdigest()
