"""Files keyed by content: what identifies the files a stage reads in its key.

A file is identified by its size and the SHA-256 of its bytes, never by its path or its
modification time: a rewritten file gives a new key, a moved, copied or merely touched one
keeps it.  Reading every byte on every run would be slow, so :class:`ContentHashes` keeps each
file's hash in a cache file of the store (``STORE/content-hashes.json``) under its size,
modification and change times (ns) and inode, as git's index does: a file whose stat record
is unchanged is not read again.  Measured on 13,320 small files: ``benchmarks/
bench_content_keys.py`` (``benchmarks/RESULTS.md``).

A key must be of the bytes the stage then reads: a file rewritten between the hash and the
read would leave a stage keyed by one content and holding another.  So the SHA-256 each item's
file had when the key was computed is kept in the stage (``read-hashes.json``,
:func:`save_read_hashes`) and the reader checks the bytes it read against it
(:func:`changed_since_key`): a file that changed fails its item with one line.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path

from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_write, write_if_changed

#: The cache file of a store, beside ``stages/`` and ``names/``.
CACHE_NAME = "content-hashes.json"
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


class ContentHashes:
    """SHA-256 of files, cached by stat record in ``cache_file`` (``None``: no cache).

    :meth:`save` writes the cache (atomically; two processes saving at once lose entries,
    never correctness: a missing entry is hashed again).
    """

    def __init__(self, cache_file: str | os.PathLike | None):
        self.cache_file = Path(cache_file) if cache_file is not None else None
        self._cache: dict[str, list] = {}
        self._changed = False
        self.read_bytes = 0  # bytes hashed (not served from the cache) by this object
        #: ``[size, mtime_ns, ctime_ns, inode, sha256]`` of every file hashed or looked up by
        #: this object: what a stage key was computed from (a reader may pop what it took)
        self.seen: dict[str, list] = {}
        if self.cache_file is not None:
            try:
                loaded = json.loads(self.cache_file.read_text(encoding="utf-8"))
                self._cache = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self._cache = {}  # missing or damaged: rebuilt

    def file_hash(self, path: str | os.PathLike) -> tuple[int, str]:
        """``(size, sha256)`` of the file at ``path`` (symbolic links followed)."""
        path = os.path.abspath(path)
        info = os.stat(path)
        record = stat_record(info)
        cached = self._cache.get(path)
        if isinstance(cached, list) and len(cached) == 5 and cached[:4] == record:
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
        self._cache[path] = self.seen[path] = [*record, digest]
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

        def write(handle) -> None:  # streamed: no copy of the whole text (10^6 files)
            text = io.TextIOWrapper(handle, encoding="utf-8", write_through=True)
            json.dump(self._cache, text)
            text.detach()

        atomic_write(self.cache_file, write)
        self._changed = False


def save_read_hashes(stage_path: str | os.PathLike, hashes: dict[str, str | None]) -> None:
    """Keep ``hashes`` (item id -> SHA-256 of its file when the key was computed) in the
    stage; the stage key covers them, so every run of the stage writes the same content."""
    path = Path(stage_path) / READ_HASHES
    write_if_changed(path, json.dumps(hashes, sort_keys=True).encode("utf-8"))


@functools.lru_cache(maxsize=8)
def _read_hashes(path: str, stamp: tuple) -> dict:
    try:
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def read_hashes(stage_path: str | os.PathLike) -> dict[str, str | None]:
    """The hashes :func:`save_read_hashes` kept (read once per process; empty for a stage
    made before featpipe kept them, whose reads are then not checked)."""
    path = Path(stage_path) / READ_HASHES
    try:
        info = path.stat()
    except OSError:
        return {}
    return _read_hashes(str(path), (info.st_ino, info.st_mtime_ns, info.st_size))


def changed_since_key(stage_path: str | os.PathLike, item_id: str,
                      digest: str | None) -> str | None:
    """Why the bytes of ``item_id``'s file, whose SHA-256 is ``digest`` as read, are not the
    ones the stage key was computed from, or None when they are (or nothing was kept)."""
    kept = read_hashes(stage_path)
    if item_id not in kept or kept[item_id] == digest:
        return None
    if kept[item_id] is None:
        return "its file appeared after the stage key was computed"
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
    return changed_since_key(stage_path, item_id, digest)
