"""Files keyed by content: what identifies the files a stage reads in its key.

A file is identified by its size and the SHA-256 of its bytes, never by its path or its
modification time: a rewritten file gives a new key, a moved, copied or merely touched one
keeps it.  Reading every byte on every run would be slow, so :class:`ContentHashes` keeps each
file's hash in a cache file of the store (``STORE/content-hashes.json``) under its size,
modification and change times (ns) and inode, as git's index does: a file whose stat record
is unchanged is not read again.  Measured on 13,320 small files: ``benchmarks/
bench_content_keys.py`` (``benchmarks/results/store.md``).

A key must be of the bytes the stage then reads: a file rewritten between the hash and the
read would leave a stage keyed by one content and holding another.  So the SHA-256 each item's
file had when the key was computed is kept in the stage (``read-hashes.json``,
:func:`read_hashes_record`) and the reader checks the bytes it read against it
(:func:`changed_since_key`): a file that changed fails its item with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import struct
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from featpipe.checksums import ChecksumError, as_text, check_seal, owner_crc, seal_json, unseal_json
from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_write, first_line
from featpipe.store.facade import Stage
from featpipe.store.layout import CACHE_NAME

log = logging.getLogger(__name__)

_BLOCK = 1 << 20


#: The file of a stage that holds, by item id, the SHA-256 of the file the item reads as it
#: was when the stage key was computed (None: the item had no file then).
READ_HASHES = "read-hashes.json"


def stat_record(info: os.stat_result) -> list[int]:
    """What says a file is unchanged (git's rule): size, mtime and ctime (ns), inode."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def sha256_of(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


#: A cache entry in memory: size, mtime_ns, ctime_ns, inode, SHA-256 (32 bytes)
_ENTRY_LAYOUT = struct.Struct("<QqqQ32s")


def _packed(entry) -> bytes | None:
    """A cache file's entry ``[size, mtime_ns, ctime_ns, inode, sha256 hex]`` as 64 bytes
    (97 in memory where the list and its hex string took 254: 10^6 files); None when it is
    not of that form (the file is then hashed again)."""
    try:
        *record, digest = entry
        return _ENTRY_LAYOUT.pack(*record, bytes.fromhex(digest))
    except (TypeError, ValueError, struct.error):
        return None


def _unpacked(packed: bytes) -> list:
    *record, digest = _ENTRY_LAYOUT.unpack(packed)
    return [*record, digest.hex()]


class ContentHashes:
    """SHA-256 of files, cached by stat record in ``cache_file`` (``None``: no cache).

    :meth:`save` writes the cache (atomically; two processes saving at once lose entries,
    never correctness: a missing entry is hashed again).  In memory each entry is packed
    (:func:`_packed`): at 10^6 files the cache was the largest thing an import held.
    """

    def __init__(self, cache_file: str | os.PathLike | None):
        self.cache_file = Path(cache_file) if cache_file is not None else None
        self._cache: dict[str, bytes | None] = {}
        self._changed = False
        self.read_bytes = 0  # bytes hashed (not served from the cache) by this object
        #: ``[size, mtime_ns, ctime_ns, inode, sha256]`` of every file hashed or looked up by
        #: this object: what a stage key was computed from (a reader may pop what it took)
        self.seen: dict[str, list] = {}
        if self.cache_file is not None:
            self._cache = load_packed_cache(self.cache_file)

    def file_hash(self, path: str | os.PathLike) -> tuple[int, str]:
        """``(size, sha256)`` of the file at ``path`` (symbolic links followed)."""
        path = os.path.abspath(path)
        info = os.stat(path)
        record = stat_record(info)
        cached = self._cache.get(path)
        if cached is not None and (cached := _unpacked(cached))[:4] == record:
            self.seen[path] = cached
            return info.st_size, cached[4]
        for _ in range(3):  # a file written to while it is hashed is hashed again
            digest = sha256_of(path)
            self.read_bytes += info.st_size
            after = os.stat(path)
            if stat_record(after) == record:
                break
            info, record = after, stat_record(after)
        else:
            raise FeatpipeError(f"{path} keeps changing while it is hashed; run again once it "
                                "is complete")
        self.seen[path] = [*record, digest]
        self._cache[path] = _packed(self.seen[path])
        self._changed = True
        return info.st_size, digest

    def digest(self, files: Iterable[tuple[str, str | os.PathLike | None]]) -> str:
        """One hash over ``(label, path)`` pairs (a label is what the path stands for: an
        item id, a file name); a ``None`` path (a missing file) counts as such."""
        total = hashlib.sha256()
        for label, path in files:
            size, digest = (None, None) if path is None else self.file_hash(path)
            total.update(f"{json.dumps(label)} {size} {digest}\n".encode())
        return total.hexdigest()

    def save(self) -> None:
        """Write the cache when it changed (and there is one)."""
        if self.cache_file is None or not self._changed:
            return
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.cache_file, lambda handle: write_cache(handle, (
            (path, _unpacked(entry)) for path, entry in self._cache.items()
            if entry is not None)))
        self._changed = False


def cache_bytes(entries: dict) -> bytes:
    """The content-hash cache file of ``entries``, sealed (:func:`featpipe.checksums.
    seal_json`): damage at rest is found when it is read and by ``cache verify``."""
    return seal_json(json.dumps(entries).encode(), CACHE_NAME)


def write_cache(handle, entries: Iterable[tuple[str, list]]) -> None:
    """Write :func:`cache_bytes` of the ``(path, entry)`` pairs ``entries`` to ``handle``
    entry by entry, summed as it goes: no copy of the whole text or dict (10^6 files)."""
    crc, separator = owner_crc(CACHE_NAME), "{"
    for path, entry in entries:
        data = f"{separator}{json.dumps(path)}: {json.dumps(entry)}".encode()
        crc = zlib.crc32(data, crc)
        handle.write(data)
        separator = ", "
    data = ("{" if separator == "{" else ", ").encode()
    crc = zlib.crc32(data, crc)
    handle.write(data + b'"crc32": "' + as_text(crc).encode() + b'"}')


#: Files of the content-hash cache that ``featpipe cache verify`` hashes again, chosen at
#: random (``--rehash``: every one).
VERIFY_SAMPLE = 64


def recheck_cache(entries: Mapping, sample: int | None = None) -> tuple[dict[str, list], list]:
    """Hash again the files the cache ``entries`` vouches for (their stat record is still the
    cached one), a random ``sample`` of them or all (None): the entries hashed again, each with
    the SHA-256 of its file now, and the paths whose cached SHA-256 differs (a cache that lies:
    a faulty writer, or a file rewritten under the same size, times and inode).  A file that
    changes meanwhile is left out (it is hashed again when next used)."""
    def vouched(path, entry) -> bool:
        try:
            return isinstance(entry, list) and len(entry) == 5 and \
                entry[:4] == stat_record(os.stat(path))
        except (OSError, TypeError, ValueError):
            return False

    paths = [path for path, entry in entries.items() if vouched(path, entry)]
    if sample is not None and len(paths) > sample:
        paths = random.sample(paths, sample)
    checked, wrong = {}, []
    for path in paths:
        try:
            digest = sha256_of(path)
            record = stat_record(os.stat(path))
        except OSError:
            continue
        if record == entries[path][:4]:
            checked[path] = [*record, digest]
            if digest != entries[path][4]:
                wrong.append(path)
    return checked, wrong


def load_cache(path: Path, strict: bool = False) -> dict:
    """The entries of the content-hash cache ``path``: ``{path: [size, mtime_ns, ctime_ns,
    inode, sha256]}``.  A missing file is empty; a damaged one (its seal differs, not JSON)
    is empty too, with a warning, so that every file is hashed again (a wrong hash would give
    a wrong key), or with ``strict`` a :class:`~featpipe.checksums.ChecksumError` or
    ``ValueError`` (``cache verify``)."""
    try:
        loaded, _ = unseal_json(path.read_bytes(), CACHE_NAME, path)
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: not a JSON object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # ChecksumError and JSONDecodeError are ValueErrors
        if strict:
            raise
        log.warning("%s is damaged (%s): every file is hashed again", path, first_line(err))
        return {}
    return loaded


_CACHE_ENTRY = re.compile(rb'"((?:[^"\\]|\\.)*)": \[(\d+), (-?\d+), (-?\d+), (\d+), '
                          rb'"([0-9a-f]{64})"\](, |})')
_CACHE_SEAL = re.compile(rb'"crc32": "crc32:[0-9a-f]{8}"}\n?\Z')


def load_packed_cache(path: Path) -> dict[str, bytes | None]:
    """:func:`load_cache` with each entry packed (:func:`_packed`), scanned entry by entry
    from the layout :func:`write_cache` writes: the dict of lists :func:`load_cache` builds
    would weigh 450 bytes a file (10^6 files: more than the rest of an import); a file of
    another layout is loaded whole, then packed."""
    try:
        raw = path.read_bytes()
        check_seal(raw, CACHE_NAME, path)
    except FileNotFoundError:
        return {}
    except (OSError, ChecksumError):
        return load_cache(path)  # says it is damaged, once
    entries: dict[str, bytes | None] = {}
    position, end = 1, b", " if raw[:1] == b"{" else b""
    while end == b", ":
        match = _CACHE_ENTRY.match(raw, position)
        if match is None:
            break
        name, *numbers, digest, end = match.groups()
        try:
            key = name.decode("ascii")
            key = json.loads(f'"{key}"') if "\\" in key else key
            entries[key] = _ENTRY_LAYOUT.pack(*map(int, numbers), bytes.fromhex(digest.decode()))
        except (ValueError, struct.error):
            break
        position = match.end()
    else:
        if end == b"}" and raw[position:].strip() == b"":
            return entries
    if end == b", " and _CACHE_SEAL.match(raw, position):
        return entries
    del raw, entries
    return {path: _packed(entry) for path, entry in load_cache(path).items()}


def read_hashes_record(hashes: dict[str, str | None]) -> bytes:
    """The ``read-hashes.json`` of ``hashes`` (item id -> SHA-256 of its file when the key
    was computed), a record of the stage written when it is created
    (:meth:`featpipe.store.Store.stage`, ``records``): the key covers the hashes, so every
    run of the stage gives the same bytes, whose checksum ``stage.json`` keeps."""
    return json.dumps(hashes, sort_keys=True).encode()


_kept: dict[str, tuple[tuple, dict]] = {}


def read_hashes(stage_path: str | os.PathLike) -> dict[str, str | None]:
    """The hashes of :func:`read_hashes_record`, checked against the checksum
    ``stage.json`` keeps (read once per process while the file keeps its stat record; empty
    for a stage made before featpipe kept them, whose reads are then not checked).  A
    damaged record is a :class:`~featpipe.store.records.DamagedRecord` naming it."""
    path = Path(stage_path) / READ_HASHES
    try:
        info = path.stat()
    except OSError:  # no file: none kept, or a damaged stage (it says so)
        return _read_hashes(stage_path)
    stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
    cached = _kept.get(str(path))
    if cached is None or cached[0] != stamp:
        cached = _kept[str(path)] = (stamp, _read_hashes(stage_path))
    return cached[1]


def _read_hashes(stage_path: str | os.PathLike) -> Mapping[str, str | None]:
    """The record as a :class:`ReadHashes` (or a dict, for a record of another layout)."""
    stage = Stage(stage_path)
    raw = stage.read_record(READ_HASHES)
    if raw is None:
        return {}
    unread = [raw]  # the first scan takes these bytes; a later one (iteration) reads again

    def pairs():
        return _record_pairs(unread.pop() if unread else
                             stage.read_record(READ_HASHES) or b"{}")

    try:  # scanned, not loaded: a dict of 10^6 ids would outweigh the manifest
        del raw
        return ReadHashes(pairs)
    except ValueError:
        pass  # not the layout read_hashes_record writes: parsed as JSON
    try:
        loaded = json.loads(stage.read_record(READ_HASHES) or b"{}")
    except ValueError:
        return {}  # written before featpipe kept checksums of records, and damaged
    return loaded if isinstance(loaded, dict) else {}


_ENTRY = re.compile(rb'"((?:[^"\\]|\\.)*)": (?:"([0-9a-f]{64})"|null)')


def _record_pairs(raw: bytes) -> Iterator[tuple[str, str | None]]:
    """The ``(item id, SHA-256 or None)`` pairs of a record :func:`read_hashes_record` wrote
    (``{"id": "hex", "id2": null}``), scanned in order without building the dict; ValueError
    at the first byte that is not of that layout."""
    if raw[:1] != b"{" or raw[-1:] != b"}":
        raise ValueError("not a JSON object")
    position, end = 1, len(raw) - 1
    while position < end:
        match = _ENTRY.match(raw, position)
        if match is None:
            raise ValueError(f"unexpected bytes at {position}")
        name = match.group(1).decode("ascii")
        yield (json.loads(f'"{name}"') if "\\" in name else name,
               None if match.group(2) is None else match.group(2).decode("ascii"))
        position = match.end()
        if position < end:
            if raw[position:position + 2] != b", ":
                raise ValueError(f"unexpected bytes at {position}")
            position += 2


class ReadHashes(Mapping):
    """Item id -> SHA-256 (hex; None: no file) of a stage's read-hash record, held as sorted
    128-bit keys of the ids (BLAKE2b) and 32-byte digests: 48 bytes an item, where a dict of
    strings held 211 (tracemalloc, 10^6 ids like ``class042/v_0000042``).  Two ids are taken
    as one when their 128-bit keys are equal (as git takes equal hashes).  ``pairs()`` gives
    the ``(id, SHA-256 or None)`` pairs; iterating calls it again (tools and tests iterate,
    the reader looks items up)."""

    _NONE = bytes(32)  # an item that had no file

    def __init__(self, pairs: Callable[[], Iterable[tuple[str, str | None]]]):
        import numpy as np

        self._pairs = pairs
        keys, digests = array("Q"), bytearray()
        for item_id, digest in pairs():
            keys.extend(_id_key(item_id))
            digests += self._NONE if digest is None else bytes.fromhex(digest)
        key_rows = np.frombuffer(keys, np.uint64).reshape(-1, 2)
        order = np.lexsort((key_rows[:, 1], key_rows[:, 0]))
        # contiguous columns: a search in a strided view would copy the column every time
        self._high = np.ascontiguousarray(key_rows[order, 0])
        self._low = np.ascontiguousarray(key_rows[order, 1])
        self._digests = np.frombuffer(bytes(digests), np.uint8).reshape(-1, 32)[order]

    def _row(self, item_id) -> int | None:
        import numpy as np

        if not isinstance(item_id, str):
            return None
        high, low = _id_key(item_id)
        high = np.uint64(high)
        for row in range(int(np.searchsorted(self._high, high, "left")),
                         int(np.searchsorted(self._high, high, "right"))):
            if int(self._low[row]) == low:
                return row
        return None

    def __getitem__(self, item_id: str) -> str | None:
        row = self._row(item_id)
        if row is None:
            raise KeyError(item_id)
        digest = self._digests[row].tobytes()
        return None if digest == self._NONE else digest.hex()

    def __contains__(self, item_id) -> bool:
        return self._row(item_id) is not None

    def __len__(self) -> int:
        return len(self._high)

    def __eq__(self, other) -> bool:
        if other is self:
            return True
        if isinstance(other, ReadHashes):
            return len(self) == len(other) and bool(
                (self._high == other._high).all() and (self._low == other._low).all()
                and (self._digests == other._digests).all())
        return super().__eq__(other)

    __hash__ = None

    def __iter__(self) -> Iterator[str]:
        return (item_id for item_id, _ in self._pairs())


def _id_key(item_id: str) -> tuple[int, int]:
    """A 128-bit key of an item id, as two 64-bit integers."""
    digest = hashlib.blake2b(item_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def changed_since_key(stage_path: str | os.PathLike, item_id: str,
                      digest: str | None, path: str | os.PathLike | None = None) -> str | None:
    """Why the bytes of ``item_id``'s file, whose SHA-256 is ``digest`` as read, are not the
    ones the stage key was computed from, or None when they are (or nothing was kept).  With
    the file's ``path``, the store's content-hash cache is asked first: when it holds the
    keyed SHA-256 for the file under the stat record the file still has, the file did not
    change and the cache is wrong (damaged), which is said instead."""
    kept = read_hashes(stage_path)
    if item_id not in kept or kept[item_id] == digest:
        return None
    if kept[item_id] is None:
        return "its file appeared after the stage key was computed"
    if path is not None and digest is not None:
        cache = Path(stage_path).parent.parent / CACHE_NAME
        try:
            entry = load_cache(cache).get(os.path.abspath(path))
            unchanged = entry is not None and entry[:4] == stat_record(os.stat(path))
        except (OSError, TypeError):
            unchanged = False
        if unchanged and entry[4] == kept[item_id]:
            return (f"the store's content-hash cache {cache} holds SHA-256 "
                    f"{kept[item_id][:12]}... for {path}, whose bytes read {digest[:12]}... "
                    "under the same stat record: the cache is damaged, not the file; "
                    "`featpipe cache verify --repair --rehash` hashes the cached files again, "
                    "then run the command again")
    return ("its file changed after the stage key was computed (SHA-256 "
            f"{(digest or 'missing')[:12]}... read, {kept[item_id][:12]}... keyed): nothing was "
            "written; run the command again once the file is complete")


def file_changed_since_key(stage_path: str | os.PathLike, item_id: str,
                           path: str | os.PathLike) -> str | None:
    """:func:`changed_since_key` for a file read by other code (a video decoder): it is
    hashed once it has been read, so a change before or during the read shows."""
    if item_id not in read_hashes(stage_path):
        return None
    digest = sha256_of(path) if os.path.isfile(path) else None
    return changed_since_key(stage_path, item_id, digest, path)
