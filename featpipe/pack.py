"""Pack a finished stage's items into one HDF5 file per shard (``featpipe cache pack``).

Parallel filesystems (Lustre, GPFS, NFS) handle millions of small files badly.  Packing
moves every item of a finished stage into ``packed/shard-IIII-of-NNNN.<generation>.h5``,
item ``i`` going to shard ``shard_of(i, N)`` (the same stable hash that splits SLURM array
tasks).  Each file holds::

    ids                         the item ids in this file (UTF-8 strings)
    items/<safe stem>           the item's array, dtype and shape unchanged
    extras/<safe stem>/<name>   its sidecars (timestamps, positions...)

Steps, each safe to interrupt: write every shard file to a temporary name, fsync, rename;
read every item back and compare it bit for bit with its source; then write
``packed/pack.json`` (the list of files) atomically: this is the commit point.  Only then are
the loose ``.npy`` files (and the files of an older pack) removed.  Readers
(:meth:`featpipe.store.Stage.read_item`) prefer a loose file and fall back to the pack, so
they see every item at every moment.  HDF5 files are opened read-only without file locking,
which NFS and Lustre often refuse.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from featpipe.errors import FeatpipeError, ItemError, WriteError
from featpipe.fileio import (
    HOST,
    atomic_write_bytes,
    check_h5_dataset,
    first_line,
    make_dirs,
    safe_stem,
    shard_of,
    writing,
)
from featpipe.parallel import resolve_jobs, worker_pool

if TYPE_CHECKING:
    from featpipe.store import Stage

PACK_DIR = "packed"
PACK_INDEX = "pack.json"
LOCK_NAME = "pack.lock"
#: Default number of items per HDF5 file when ``shards`` is not given.
ITEMS_PER_FILE = 10_000
_SHARD_FILE = re.compile(r"^shard-\d{4,}-of-\d{4,}\.[0-9a-f]+\.h5$")


def _open_h5(path: Path, mode: str = "r"):
    import h5py

    return h5py.File(path, mode, locking=False)


class PackedItems:
    """Read access to the packed items of one stage (``None`` from :meth:`open` if unpacked)."""

    _cache: dict[str, tuple[tuple[int, int, int], PackedItems]] = {}

    def __init__(self, folder: Path, index: dict):
        self.folder = folder
        self.n_shards = int(index["shards"])
        names = list(index["files"])
        bad = [n for n in names if not isinstance(n, str) or not _SHARD_FILE.match(n)]
        if bad or len(names) != self.n_shards:
            raise ValueError(f"file list does not name {self.n_shards} shard files of this "
                             f"folder ({bad[0]!r})" if bad else "file count differs from shards")
        self.files = [folder / name for name in names]
        self._ids: frozenset[str] | None = None
        self._handles: dict[Path, object] = {}
        self._pid = os.getpid()

    def _handle(self, path: Path):
        """An open read-only handle, kept for this process (a forked child opens its own)."""
        if self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = _open_h5(path)
        return handle

    def _ids_in(self, path: Path) -> list[str]:
        try:
            return self._handle(path)["ids"].asstr()[()].tolist()
        except (OSError, KeyError, ValueError, TypeError) as err:
            raise FeatpipeError(f"unreadable packed file {path}: {first_line(err)}") from None

    @classmethod
    def open(cls, stage_path: Path) -> PackedItems | None:
        folder = Path(stage_path) / PACK_DIR
        index_path = folder / PACK_INDEX
        try:
            info = index_path.stat()
        except FileNotFoundError:
            return None
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)  # a repack replaces the inode
        cached = cls._cache.get(str(index_path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            packed = cls(folder, index)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise FeatpipeError(f"{index_path}: corrupt pack index ({err})") from None
        cls._cache[str(index_path)] = (stamp, packed)
        return packed

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
            return node[()]
        except (OSError, ValueError, TypeError) as err:
            raise ItemError(item_id, f"unreadable packed file {path}: {first_line(err)}") \
                from None

    def extras(self, item_id: str) -> dict[str, np.ndarray]:
        path = self.file_of(item_id)
        try:
            group = self._handle(path)["extras"].get(safe_stem(item_id))
            return {} if group is None else {k: group[k][()] for k in group}
        except (OSError, KeyError, ValueError) as err:
            raise ItemError(item_id, f"unreadable packed file {path}: {first_line(err)}") \
                from None



@dataclass
class PackSummary:
    items: int
    files: list[Path]
    bytes: int
    removed: int

    def line(self) -> str:
        return (f"packed {self.items} items into {len(self.files)} HDF5 file(s), "
                f"{self.bytes / 2**20:.1f} MiB; removed {self.removed} loose file(s)")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_shard(stage: Stage, ids: list[str], target: Path) -> None:
    import h5py

    tmp = target.with_name(f"{target.name}.tmp.{HOST}.{os.getpid()}")
    try:
        with writing(target), _open_h5(tmp, "w") as handle:
            handle.create_dataset("ids", data=ids, dtype=h5py.string_dtype("utf-8"))
            items = handle.create_group("items")
            extras = handle.create_group("extras")
            for item_id in ids:
                stem = safe_stem(item_id)
                items.create_dataset(stem, data=stage.read_item(item_id))
                sidecars = stage.extras_of(item_id)
                if sidecars:
                    group = extras.create_group(stem)
                    for name, values in sidecars.items():
                        group.create_dataset(name, data=values)
        with writing(target):
            _fsync_file(tmp)
            os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _check_shard(stage: Stage, ids: list[str], path: Path) -> None:
    """Read every packed item back and compare it with its source, bit for bit."""
    with _open_h5(path) as handle:
        if sorted(handle["ids"].asstr()[()].tolist()) != sorted(ids):
            raise FeatpipeError(f"{path}: packed ids differ from the stage's; nothing removed")
        for item_id in ids:
            stem = safe_stem(item_id)
            packed = handle["items"][stem][()]
            source = stage.read_item(item_id)
            if packed.dtype != source.dtype or packed.shape != source.shape or \
                    packed.tobytes() != source.tobytes():
                raise FeatpipeError(f"{path}: item {item_id!r} differs after packing; "
                                    "nothing removed")
            group = handle["extras"].get(stem)
            packed_extras = {} if group is None else {k: group[k][()] for k in group}
            source_extras = stage.extras_of(item_id)
            if packed_extras.keys() != source_extras.keys() or any(
                    packed_extras[k].tobytes() != np.asarray(source_extras[k]).tobytes()
                    for k in source_extras):
                raise FeatpipeError(f"{path}: sidecars of {item_id!r} differ after packing; "
                                    "nothing removed")


def pack_stage(stage: Stage, shards: int | None = None, keep_files: bool = False,
               jobs: int = 1) -> PackSummary:
    """Pack all items of a finished ``stage`` into HDF5 files; see the module docstring.

    ``jobs`` processes write (and check) different shard files at the same time.
    """
    ids = list(stage.items.ids)
    if not ids:
        raise FeatpipeError(f"stage {stage.name} has no items to pack")
    done = stage.done_ids()
    missing = [i for i in ids if i not in done]
    if missing:
        raise FeatpipeError(f"stage {stage.name} is not finished ({len(ids) - len(missing)} of "
                            f"{len(ids)} items done, e.g. {missing[0]!r} is not); finish it "
                            "before packing")
    if shards is None:
        shards = max(1, -(-len(ids) // ITEMS_PER_FILE))
    if shards < 1:
        raise FeatpipeError(f"--shards must be at least 1, got {shards}")
    jobs = resolve_jobs(jobs)
    folder = stage.path / PACK_DIR
    make_dirs(folder)
    lock = folder / LOCK_NAME
    try:
        with writing(lock):
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except WriteError:
        if not lock.exists():
            raise
        raise FeatpipeError(f"stage {stage.name} is being packed by another process ({lock} "
                            "exists; remove it if that process is gone)") from None
    try:
        with writing(lock):
            os.write(fd, f"{HOST} {os.getpid()}\n".encode())
            os.close(fd)
        files, removed = _pack_locked(stage, ids, shards, folder, keep_files, jobs)
    finally:
        with contextlib.suppress(OSError):
            lock.unlink(missing_ok=True)
    return PackSummary(len(ids), files, sum(p.stat().st_size for p in files), removed)


def _write_and_check(stage: Stage, ids: list[str], path: Path) -> None:
    _write_shard(stage, ids, path)
    _check_shard(stage, ids, path)


def _pack_locked(stage: Stage, ids: list[str], shards: int, folder: Path, keep_files: bool,
                 jobs: int) -> tuple[list[Path], int]:
    generation = secrets.token_hex(4)
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    for item_id in ids:
        by_shard[shard_of(item_id, shards)].append(item_id)
    files = [folder / f"shard-{i:04d}-of-{shards:04d}.{generation}.h5" for i in range(shards)]
    try:
        if jobs == 1 or shards == 1:
            for shard_ids, path in zip(by_shard, files, strict=True):
                _write_and_check(stage, shard_ids, path)
        else:
            from joblib import delayed

            worker_pool(jobs)(
                delayed(_write_and_check)(stage, shard_ids, path)
                for shard_ids, path in zip(by_shard, files, strict=True))
    except BaseException:
        for path in files:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    index = {"shards": shards, "files": [p.name for p in files], "n_items": len(ids),
             "generation": generation}
    atomic_write_bytes(folder / PACK_INDEX, json.dumps(index, indent=2).encode("utf-8"))
    for path in folder.glob("shard-*.h5"):  # older generations, or leftovers of a crash
        if path not in files:
            with writing(path, "remove"):
                path.unlink()
    removed = 0
    if not keep_files:  # main file first: while it exists, its loose sidecars exist too
        for item_id in ids:
            main = stage.item_path(item_id)
            sidecars = list(main.parent.glob(f"{safe_stem(item_id)}+*.npy"))
            for path in [main, *sidecars]:
                if path.exists():
                    with writing(path, "remove"):
                        path.unlink()
                    removed += 1
    return files, removed
