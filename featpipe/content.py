"""Files keyed by content: what identifies the files a stage reads in its key.

A file is identified by its size and the SHA-256 of its bytes, never by its path or its
modification time: a rewritten file gives a new key, a moved, copied or merely touched one
keeps it.  Reading every byte on every run would be slow, so :class:`ContentHashes` keeps each
file's hash in a cache file of the store (``STORE/content-hashes.json``) under its size,
modification and change times (ns) and inode, as git's index does: a file whose stat record
is unchanged is not read again.  Measured on 13,320 small files: ``benchmarks/
bench_content_keys.py`` (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from featpipe.fileio import atomic_write_bytes

#: The cache file of a store, beside ``stages/`` and ``names/``.
CACHE_NAME = "content-hashes.json"
_BLOCK = 1 << 20


def _stat_record(info: os.stat_result) -> list[int]:
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
        record = _stat_record(info)
        cached = self._cache.get(path)
        if isinstance(cached, list) and len(cached) == 5 and cached[:4] == record:
            return info.st_size, cached[4]
        digest = sha256_of(path)
        self.read_bytes += info.st_size
        self._cache[path] = [*record, digest]
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
        atomic_write_bytes(self.cache_file, json.dumps(self._cache).encode("utf-8"))
        self._changed = False
