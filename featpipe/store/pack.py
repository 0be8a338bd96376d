"""Pack a finished stage's items into one HDF5 file per shard (``featpipe cache pack``).

Parallel filesystems (Lustre, GPFS, NFS) handle millions of small files badly.  Packing
moves every item of a finished stage into ``packed/shard-IIII-of-NNNN.<generation>.h5``,
item ``i`` going to shard ``shard_of(i, N)`` (the same stable hash that splits SLURM array
tasks).  Each file holds::

    ids                         the item ids in this file (UTF-8 strings)
    items/<safe stem>           the item's array, dtype and shape unchanged
    extras/<safe stem>/<name>   its sidecars (timestamps, positions...)

Steps, each safe to interrupt: check that the disk has room for the files (their size is
estimated from the items' files); write every shard file to a temporary name, fsync, rename;
read every item back and compare it bit for bit with its source; then write
``packed/pack.json`` (the list of files and the checksum of each) atomically: this is the
commit point.  Each item dataset carries the checksum of its bytes
(:mod:`featpipe.store.packed`).
Only then are the loose ``.npy`` files, the batch files (:mod:`featpipe.store.batches`) and the
files of an older pack removed.  Readers
(:meth:`featpipe.store.Stage.read_item`) prefer a loose file and fall back to the pack, so
they see every item at every moment.  HDF5 files are opened read-only without file locking,
which NFS and Lustre often refuse.  One packer at a time: the stage's lock ``locks/pack``
(``fcntl.flock``, dropped by the kernel when its process dies, so a killed pack blocks
nothing).  HDF5 writes through a Python file object, so a full disk is an ``OSError`` (one
``error:`` line, the temporary file removed), never a crash inside the HDF5 library.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featpipe.checksums import (
    ChecksumError,
    array_checksum,
    file_checksum,
    ids_checksum,
    seal_json,
)
from featpipe.errors import FeatpipeError
from featpipe.fileio import (
    atomic_write_bytes,
    free_bytes,
    human_bytes,
    make_dirs,
    safe_stem,
    shard_of,
    tmp_path,
    writing,
)
from featpipe.parallel import resolve_jobs, worker_pool
from featpipe.store.batches import BATCH_DIR
from featpipe.store.facade import Stage
from featpipe.store.packed import (
    PACK_DIR,
    PACK_INDEX,
    checked_dataset,
    index_owner,
    open_h5,
    shard_files,
)

#: Default number of items per HDF5 file when ``shards`` is not given.
ITEMS_PER_FILE = 10_000
#: HDF5's bytes beyond the arrays, per dataset and per file (measured with h5py 3.16:
#: 450-940 bytes per dataset, 7.5 KiB for a file of one item; the estimate keeps a margin).
_H5_DATASET_BYTES = 4096
_H5_FILE_BYTES = 65536


@dataclass
class PackSummary:
    items: int
    files: list[Path]
    bytes: int
    removed: int

    def line(self) -> str:
        return (f"packed {self.items} items into {len(self.files)} HDF5 file(s), "
                f"{self.bytes / 2**20:.1f} MiB; removed {self.removed} loose file(s)")


def _write_shard(stage: Stage, ids: list[str], target: Path, read=None) -> str:
    """Write the items ``ids`` into the shard file ``target``; returns its checksum.  Each
    item is ``read(item_id)`` -> (array, sidecars) (default: the stage's reads)."""
    import h5py

    read = read or (lambda item_id: (stage.read_item(item_id), stage.extras_of(item_id)))
    tmp = tmp_path(target)
    try:
        with writing(target):
            with open(tmp, "w+b") as file:  # through Python: a full disk is an OSError
                with open_h5(file, "w") as handle:
                    handle.create_dataset("ids", data=ids, dtype=h5py.string_dtype()
                                          ).attrs["crc32"] = ids_checksum(ids)
                    items = handle.create_group("items")
                    extras = handle.create_group("extras")
                    for item_id in ids:
                        stem = safe_stem(item_id)
                        array, sidecars = read(item_id)
                        items.create_dataset(stem, data=array).attrs["crc32"] = \
                            array_checksum(array)
                        if sidecars:
                            group = extras.create_group(stem)
                            for name, values in sidecars.items():
                                group.create_dataset(name, data=values).attrs["crc32"] = \
                                    array_checksum(values)
                file.flush()
                os.fsync(file.fileno())
            checksum = file_checksum(tmp)
            os.replace(tmp, target)
        return checksum
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _check_shard(stage: Stage, ids: list[str], path: Path) -> None:
    """Read every packed item back and compare it with its source, bit for bit."""
    with open_h5(path) as handle:
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
    view = stage.view()
    if view is not None:
        raise FeatpipeError(f"stage {stage.name} is a view of {view[0].name} (it holds no "
                            "arrays of its own); pack that stage")
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

    def refuse() -> None:
        raise FeatpipeError(f"stage {stage.name} is being packed by another process")

    with stage.exclusive("pack", refuse):
        _check_room(stage, ids, shards)
        make_dirs(folder)
        files, removed = _pack_locked(stage, ids, shards, folder, keep_files, jobs)
    return PackSummary(len(ids), files, sum(p.stat().st_size for p in files), removed)


def _check_room(stage: Stage, ids: list[str], shards: int) -> None:
    """Refuse to start when the disk cannot hold the packed files: the items' loose files
    (and an older pack, which may hold some of them) plus HDF5's overhead."""
    needed = _H5_FILE_BYTES * shards
    for item_id in ids:
        main = stage.item_path(item_id)
        sidecars = list(main.parent.glob(f"{safe_stem(item_id)}+*.npy"))
        for path in (main, *sidecars):
            with contextlib.suppress(FileNotFoundError):
                needed += path.stat().st_size + _H5_DATASET_BYTES
    packed = stage.packed()
    if packed is not None:
        needed += sum(p.stat().st_size for p in packed.files if p.exists())
    free = free_bytes(stage.path)
    if free is not None and needed > free:
        raise FeatpipeError(f"cannot pack stage {stage.name}: the packed files need about "
                            f"{human_bytes(needed)} but its disk has {human_bytes(free)} free; "
                            "nothing was written (free some space, or pack another stage "
                            "first: each pack frees its loose files)")


def _write_and_check(stage: Stage, ids: list[str], path: Path) -> str:
    checksum = _write_shard(stage, ids, path)
    _check_shard(stage, ids, path)
    return checksum


def _pack_locked(stage: Stage, ids: list[str], shards: int, folder: Path, keep_files: bool,
                 jobs: int) -> tuple[list[Path], int]:
    generation = secrets.token_hex(4)
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    for item_id in ids:
        by_shard[shard_of(item_id, shards)].append(item_id)
    files = [folder / f"shard-{i:04d}-of-{shards:04d}.{generation}.h5" for i in range(shards)]
    try:
        if jobs == 1 or shards == 1:
            sums = [_write_and_check(stage, shard_ids, path)
                    for shard_ids, path in zip(by_shard, files, strict=True)]
        else:
            from joblib import delayed

            sums = worker_pool(jobs)(
                delayed(_write_and_check)(stage, shard_ids, path)
                for shard_ids, path in zip(by_shard, files, strict=True))
    except BaseException:
        for path in files:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    index = {"shards": shards, "files": [p.name for p in files], "n_items": len(ids),
             "generation": generation,
             "sums": {p.name: checksum for p, checksum in zip(files, sums, strict=True)}}
    batched = {batch for _, batch in stage.item_table().done_items() if batch is not None}
    _write_index(stage, index)
    for path in shard_files(folder):  # older generations, or leftovers of a crash
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
        for name in sorted(batched):  # the ledger's batch files: every item is packed now
            path = stage.path / BATCH_DIR / name
            if path.exists():
                with writing(path, "remove"):
                    path.unlink()
                removed += 1
    return files, removed


def _write_index(stage: Stage, index: dict) -> None:
    """Write ``packed/pack.json`` atomically, sealed to its stage
    (:func:`featpipe.checksums.seal_json`): the commit point of a pack or a repair."""
    text = json.dumps(index, indent=2).encode() + b"\n"
    atomic_write_bytes(stage.path / PACK_DIR / PACK_INDEX,
                       seal_json(text, index_owner(stage.name)))


def repair_pack(stage: Stage, damaged: set[str], damaged_files: set[str]) -> list[str]:
    """Rewrite the packed files of ``stage`` that hold ``damaged`` items, or that are damaged
    themselves (``damaged_files``: names), with the items of each that pass their checksums
    and are not ``damaged`` (read from that file alone; a file that does not open keeps
    none), then ``pack.json``; returns the ids dropped, which a re-run of the stage's command
    recomputes as loose files.  A pack index that is damaged itself goes with every packed
    file (:func:`remove_pack`).  Holds the pack lock, as :func:`pack_stage` does (a pack
    running is refused)."""

    def refuse() -> None:
        raise FeatpipeError(f"stage {stage.name} is being packed by another process")

    with stage.exclusive("pack", refuse):
        return _repair_locked(stage, damaged, damaged_files)


def remove_pack(stage: Stage) -> list[str]:
    """Remove the pack of ``stage`` whose index is damaged: ``pack.json`` first (its items
    are then no longer done), then every shard file; returns the ids that were packed (by
    the stage's item list and the shard each belongs to), for a re-run to recompute."""

    def refuse() -> None:
        raise FeatpipeError(f"stage {stage.name} is being packed by another process")

    folder = stage.path / PACK_DIR
    with stage.exclusive("pack", refuse):
        loose = {i for i in stage.items.ids if stage.item_path(i).exists()}
        for path in [folder / PACK_INDEX, *shard_files(folder)]:
            with writing(path, "remove"):
                path.unlink(missing_ok=True)
    return [i for i in stage.items.ids if i not in loose]


def _salvage(path: Path, item_id: str):
    """An item's array and sidecars from packed file ``path`` alone, each checked against its
    checksum; None when the file, the item or a check fails."""
    try:
        handle = open_h5(path)
    except OSError:
        return None
    with handle:
        try:
            stem = safe_stem(item_id)
            array = checked_dataset(handle["items"][stem], item_id)
            group = handle["extras"].get(stem)
            sidecars = {} if group is None else {k: checked_dataset(group[k], item_id)
                                                  for k in group}
        except (ChecksumError, OSError, KeyError, ValueError, TypeError):
            return None
    return array, sidecars


def _repair_locked(stage: Stage, damaged: set[str], damaged_files: set[str]) -> list[str]:
    packed = stage.packed()
    folder = stage.path / PACK_DIR
    sums = dict(packed.sums or {})
    index = {"shards": packed.n_shards, "files": [p.name for p in packed.files],
             "generation": secrets.token_hex(4)}
    dropped, replaced = [], []
    for k, path in enumerate(packed.files):
        assigned = [i for i in stage.items.ids if shard_of(i, packed.n_shards) == k]
        if path.name not in damaged_files and not damaged.intersection(assigned):
            continue
        found = {i: _salvage(path, i) for i in assigned if i not in damaged}
        keep = [i for i, got in found.items() if got is not None]
        target = folder / f"shard-{k:04d}-of-{packed.n_shards:04d}.{index['generation']}.h5"
        sums[target.name] = _write_shard(stage, keep, target, read=found.get)
        sums.pop(path.name, None)
        index["files"][k] = target.name
        dropped.extend(i for i in assigned
                       if i not in keep and not stage.item_path(i).exists())
        replaced.append(path)
    for name in index["files"]:  # a pack written before checksums: summed as it is now
        if name not in sums:
            sums[name] = file_checksum(folder / name)
    index.update(n_items=max((packed.n_items or 0) - len(dropped), 0), sums=sums)
    _write_index(stage, index)
    for path in replaced:
        with writing(path, "remove"):
            path.unlink(missing_ok=True)
    return dropped
