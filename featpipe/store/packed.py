"""Packed items: read access to a stage's items packed into HDF5 files (``featpipe cache
pack``, :mod:`featpipe.store.pack`).

It sits below the store (:meth:`featpipe.store.Stage.read_item` falls back to it); the
writer, :func:`featpipe.store.pack.pack_stage`, sits above.  Each file holds::

    ids                         the item ids in this file (UTF-8 strings)
    items/<safe stem>           the item's array, dtype and shape unchanged
    extras/<safe stem>/<name>   its sidecars (timestamps, positions...)

Every dataset of an item carries the checksum of its bytes (attribute ``crc32``,
:func:`featpipe.checksums.array_checksum`), checked each time it is read, and ``pack.json``
holds the checksum of each whole file (``sums``), checked by ``featpipe cache verify``.
HDF5 files are opened read-only without file locking, which NFS and Lustre often refuse.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from featpipe.checksums import (
    CHECKSUM,
    ChecksumError,
    DamagedItem,
    array_checksum,
    check,
    ids_checksum,
    unseal_json,
)
from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import check_h5_dataset, first_line, safe_stem, shard_of

PACK_DIR = "packed"
PACK_INDEX = "pack.json"
#: What a damaged pack index's error says to do.
REPAIR_INDEX = ("`featpipe cache verify --repair` removes it with the packed files, and a "
                "re-run of the stage's command recomputes their items")


def index_owner(folder: str) -> str:
    """What the pack index of stage folder ``folder`` is sealed to
    (:func:`featpipe.checksums.seal_json`)."""
    return f"stages/{folder}/{PACK_DIR}/{PACK_INDEX}"


#: The name of a packed file: its shard, the shard count, the pack's generation.
SHARD_NAME = re.compile(r"^shard-\d{4,}-of-\d{4,}\.[0-9a-f]+\.h5$")


def shard_files(folder: Path) -> list[Path]:
    """The packed files in ``folder`` (:data:`SHARD_NAME`: no other file)."""
    return sorted(p for p in folder.glob("shard-*.h5") if SHARD_NAME.match(p.name)) \
        if folder.is_dir() else []


def open_h5(path: Path, mode: str = "r"):
    """An HDF5 file opened without file locking (NFS and Lustre often refuse locks)."""
    import h5py

    return h5py.File(path, mode, locking=False)


class PackedItems:
    """Read access to the packed items of one stage (``None`` from :meth:`open` if unpacked)."""

    _cache: dict[str, tuple[tuple[int, int, int], PackedItems]] = {}

    def __init__(self, folder: Path, index: dict):
        self.folder = folder
        self.n_shards = int(index["shards"])
        names = list(index["files"])
        bad = [n for n in names if not isinstance(n, str) or not SHARD_NAME.match(n)]
        if bad or len(names) != self.n_shards:
            raise ValueError(f"file list does not name {self.n_shards} shard files of this "
                             f"folder ({bad[0]!r})" if bad else "file count differs from shards")
        self.files = [folder / name for name in names]
        self.n_items = index.get("n_items")
        sums = index.get("sums")
        if sums is not None and (not isinstance(sums, dict) or set(sums) != set(names) or not
                                 all(isinstance(v, str) and CHECKSUM.match(v)
                                     for v in sums.values())):
            raise ValueError("'sums' must give the checksum of every shard file")
        #: checksum of each file by name (None: packed before featpipe kept checksums)
        self.sums: dict[str, str] | None = sums
        self._ids: frozenset[str] | None = None
        self._handles: dict[Path, object] = {}
        self._pid = os.getpid()

    def _handle(self, path: Path):
        """An open read-only handle, kept for this process (a forked child opens its own)."""
        if self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = open_h5(path)
        return handle

    def _ids_in(self, path: Path) -> list[str]:
        """The ids dataset of ``path``, checked against its ``crc32`` attribute when it has
        one (:func:`featpipe.checksums.ids_checksum`)."""
        try:
            node = self._handle(path)["ids"]
            ids = node.asstr()[()].tolist()
            expected = node.attrs.get("crc32")
            check(f"{path}:ids", ids_checksum(ids), None if expected is None else str(expected))
            return ids
        except ChecksumError as err:
            raise FeatpipeError(f"damaged packed file {path}: {err}; `featpipe cache verify "
                                "--repair` rewrites it without what is damaged") from None
        except (OSError, KeyError, ValueError, TypeError) as err:
            raise FeatpipeError(f"unreadable packed file {path}: {first_line(err)}") from None

    @classmethod
    def open(cls, stage_path: Path, checksummed: bool) -> PackedItems | None:
        """The packed items of the stage folder ``stage_path``; ``pack.json`` is checked
        against its seal, which (with its ``sums``) a stage written with checksums
        (``checksummed``) must have."""
        folder = Path(stage_path) / PACK_DIR
        index_path = folder / PACK_INDEX
        try:
            info = index_path.stat()
        except (FileNotFoundError, NotADirectoryError):  # no pack (a file named like it)
            return None
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)  # a repack replaces the inode
        cached = cls._cache.get(str(index_path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            index, sealed = unseal_json(index_path.read_bytes(),
                                        index_owner(Path(stage_path).name), index_path)
            if checksummed and not (sealed and isinstance(index, dict) and "sums" in index):
                raise ValueError("its checksums are missing, and the stage was written with "
                                 "them")
            packed = cls(folder, index)
        except ChecksumError as err:
            raise FeatpipeError(f"{index_path}: damaged pack index ({first_line(err)}); "
                                f"{REPAIR_INDEX}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                ValueError) as err:
            raise FeatpipeError(f"{index_path}: corrupt pack index ({err}); "
                                f"{REPAIR_INDEX}") from None
        cls._cache[str(index_path)] = (stamp, packed)
        return packed

    def check_files(self) -> None:
        """Open every packed file (no item is read: O(files)); one that cannot be opened is
        a :class:`FeatpipeError` naming it (``status`` and ``cache ls`` say so)."""
        for path in self.files:
            try:
                self._handle(path)
            except (OSError, ValueError) as err:
                raise FeatpipeError(f"unreadable packed file {path}: {first_line(err)}") \
                    from None

    def file_of(self, item_id: str) -> Path:
        return self.files[shard_of(item_id, self.n_shards)]

    def ids(self) -> frozenset[str]:
        """All packed ids (read once from the files' ``ids`` datasets)."""
        if self._ids is None:
            found: set[str] = set()
            for path in self.files:
                found.update(self._ids_in(path))
            self._ids = frozenset(found)
        return self._ids

    def read(self, item_id: str) -> np.ndarray | None:
        """The packed array of ``item_id``, or ``None`` when it is not in the pack."""
        path = self.file_of(item_id)
        try:
            node = self._handle(path)["items"][safe_stem(item_id)]
        except KeyError:
            return None
        except OSError as err:
            raise ItemError(item_id, f"unreadable packed file {path}: {first_line(err)}") \
                from None
        try:
            check_h5_dataset(node, item_id)
            return checked_dataset(node, item_id)
        except ChecksumError as err:
            raise DamagedItem(item_id, err) from None
        except (OSError, ValueError, TypeError) as err:
            raise ItemError(item_id, f"unreadable packed file {path}: {first_line(err)}") \
                from None

    def extras(self, item_id: str) -> dict[str, np.ndarray]:
        path = self.file_of(item_id)
        try:
            group = self._handle(path)["extras"].get(safe_stem(item_id))
            return {} if group is None else {k: checked_dataset(group[k], item_id) for k in group}
        except ChecksumError as err:
            raise DamagedItem(item_id, err) from None
        except (OSError, KeyError, ValueError) as err:
            raise ItemError(item_id, f"unreadable packed file {path}: {first_line(err)}") \
                from None


def checked_dataset(node, item_id: str) -> np.ndarray:
    """A packed dataset's array, checked against its ``crc32`` attribute when it has one."""
    array = node[()]
    expected = node.attrs.get("crc32")
    check(f"{node.file.filename}:{node.name} (item {item_id!r})", array_checksum(array),
          None if expected is None else str(expected))
    return array
