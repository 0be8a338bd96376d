"""File primitives every other module builds on: atomic writes, safe item file names, shards.

A leaf module (it imports nothing of featpipe but its errors), so the store, manifests, packs
and executors can all use it without importing each other.

- Atomic writes: a temporary file ``<name>.tmp.<host>.<pid>`` in the same folder, flushed and
  fsynced, then ``os.replace``: a reader sees the old file, the new file or no file, never a
  partial one; the temporary file is removed when the write fails (disk full, read-only).
- Item ids map to file stems that cannot escape their folder and never collide (a readable
  part plus a digest of the exact id).
- Shards: item ``i`` belongs to shard ``int(sha256(i)[:8], 16) mod N``.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

HOST = socket.gethostname().split(".")[0] or "host"
_SAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def id_digest(item_id: str) -> str:
    """Stable hex digest of an item id (file names and shard assignment use it)."""
    return hashlib.sha256(item_id.encode("utf-8", "surrogatepass")).hexdigest()


def safe_stem(item_id: str) -> str:
    """A file-name stem for ``item_id`` that cannot escape its folder and never collides.

    Readable part: runs of characters outside ``[A-Za-z0-9._-]`` become ``_``, at most 80
    characters, no leading dot.  Uniqueness comes from the appended 20-hex-digit digest of the
    exact id, so ``a/b`` and ``a_b`` map to different files.
    """
    readable = _SAFE_CHARS.sub("_", item_id)[:80].lstrip(".") or "item"
    return f"{readable}-{id_digest(item_id)[:20]}"


def shard_of(item_id: str, n_shards: int) -> int:
    """Deterministic shard index of an item: a stable hash of its id, modulo ``n_shards``."""
    return int(id_digest(item_id)[:8], 16) % n_shards


def tmp_path(path: Path) -> Path:
    """The temporary name a write of ``path`` goes through (same folder, host and pid)."""
    return path.with_name(f"{path.name}.tmp.{HOST}.{os.getpid()}")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write(handle)`` into a temporary file, fsync it and rename it onto ``path``.

    Whatever fails (disk full, read-only folder, a bad array), the temporary file is removed
    and the old ``path``, if any, is untouched.
    """
    path = Path(path)
    tmp = tmp_path(path)
    try:
        with open(tmp, "w+b") as handle:  # readable too: h5py reads what it writes
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda handle: handle.write(data))


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    """``np.save`` made atomic (no pickle)."""
    atomic_write(path, lambda handle: np.save(handle, array, allow_pickle=False))


def atomic_save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` made atomic (no pickle: object arrays are refused)."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for key, value in arrays.items():
        if value.dtype.hasobject:
            raise ValueError(f"array {key!r} has dtype object; featpipe never pickles")
    atomic_write(path, lambda handle: np.savez(handle, **arrays))
