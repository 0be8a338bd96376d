"""A stage's items: one array per item (and its sidecars), written atomically and read back
checked, wherever it is.

An item's files are ``items/<2 hex>/<safe id>.npy`` and ``<safe id>+<sidecar>.npy`` (ids map to
file names safely: :func:`featpipe.fileio.safe_stem`), or members of a batch file
(:mod:`featpipe.store.batches`), or datasets of a packed file (:mod:`featpipe.store.packed`);
a view's are its source's (:mod:`featpipe.store.views`).  A write is atomic (temporary file in
the same folder, flush, fsync, ``os.replace``), sidecars first and the main array last (the
commit point), then the ledger line with the checksum of each file
(:mod:`featpipe.store.ledger`).  Every read is checked against that checksum (not a
memory-mapped one: only the rows used are read); resume trusts the ledger plus the file.
"""

from __future__ import annotations

import functools
import math
import os
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from featpipe.checksums import ChecksumError, DamagedItem
from featpipe.errors import ItemError
from featpipe.fileio import (
    atomic_save_npy,
    check_npy_header,
    check_sidecar_name,
    checked_result,
    first_line,
    human_bytes,
    id_digest,
    load_npy,
    make_dirs,
    safe_stem,
)
from featpipe.store import batches
from featpipe.store.batches import BATCH_DIR, BatchFiles

#: Bytes read to check an item's size against its header (featpipe's own headers are 128).
NPY_HEAD_BYTES = 4096


def item_path(stage_path: Path, item_id: str, extra: str | None = None) -> Path:
    """The loose file of ``item_id`` in stage folder ``stage_path`` (of its sidecar
    ``extra``)."""
    stem = safe_stem(item_id)
    suffix = f"+{extra}.npy" if extra else ".npy"
    return stage_path / "items" / id_digest(item_id)[:2] / f"{stem}{suffix}"


# -- writing ----------------------------------------------------------------------------------

def write_item(stage, item_id: str, array: np.ndarray,
               extras: Mapping[str, np.ndarray] | None = None, seconds: float = 0.0) -> Path:
    """Write one item of ``stage`` atomically and record it as done in this process's ledger.

    Floating arrays are cast to the stage dtype (float32 unless the stage says otherwise).
    A non-finite value is refused: a silently wrong number must never reach the disk.
    Sidecars in ``extras`` (timestamps, positions) are written first, the main array last,
    so the main file is the commit point.
    """
    stage._check_on_disk()
    array = checked_result(item_id, array, stage.dtype)
    target = stage.item_path(item_id)
    make_dirs(target.parent)
    sums = {}
    for extra, values in (extras or {}).items():
        check_sidecar_name(extra)
        sums[f"+{extra}.npy"] = atomic_save_npy(stage.item_path(item_id, extra),
                                               np.asarray(values))
    sums[".npy"] = atomic_save_npy(target, array)
    stage.record(item_id, "done", seconds=seconds, sums=sums)
    return target


# -- which items are there --------------------------------------------------------------------

def done_ids(stage) -> set[str]:
    """Items whose ledger says done and whose file exists (resume trusts both); a view's,
    those of its source.  An item packed by ``featpipe cache pack`` counts as existing, and so
    does one in a batch file that exists."""
    view = stage.view()
    if view is not None:
        return view[0].done_ids() & set(stage.items.ids)
    packed = stage.packed()
    packed_ids = packed.ids() if packed is not None else frozenset()
    table = stage.item_table()
    found: dict[str, bool] = {}

    def exists(item_id: str, batch: str | None) -> bool:
        if batch is not None:
            if batch not in found:
                found[batch] = (stage.path / BATCH_DIR / batch).exists()
            if found[batch]:
                return True
        return item_id in packed_ids or stage.item_path(item_id).exists()

    return {item_id for item_id, batch in table.done_items() if exists(item_id, batch)}


def truncated_ids(stage, ids: Iterable[str]) -> set[str]:
    """Of ``ids``, the items whose loose file holds less data than its ``.npy`` header
    declares (cut short by a failing disk or a copy: ``cache verify`` reports them), so that
    a rerun recomputes them; one header read per item, no array is loaded (none for the items
    of batch files, whose every read is checked against its checksum); a view's, those of its
    source."""
    view = stage.view()
    if view is not None:
        return view[0].truncated_ids(ids)
    table = stage.item_table()
    loose = {item_id for item_id, batch in table.done_items() if batch is None}
    found = set()
    for item_id in (i for i in ids if i in loose):
        try:
            with open(stage.item_path(item_id), "rb") as handle:
                head = handle.read(NPY_HEAD_BYTES)
                size = os.fstat(handle.fileno()).st_size
        except FileNotFoundError:
            continue  # packed, or not computed
        except OSError:
            found.add(item_id)
            continue
        if _npy_bytes(head) > size:
            found.add(item_id)
    return found


@functools.lru_cache(maxsize=4096)
def _npy_bytes(head: bytes) -> float:
    """The size an ``.npy`` file must have for the header at the start of ``head`` (items of
    one stage mostly share headers, hence the cache); infinite for a damaged header."""
    import io

    handle = io.BytesIO(head)
    try:
        shape, dtype = check_npy_header(handle, 2**62)
    except (ValueError, EOFError, OSError):
        return float("inf")
    return handle.tell() + math.prod(shape) * dtype.itemsize


# -- reading ----------------------------------------------------------------------------------

def read_item(stage, item_id: str, mmap: bool = False) -> np.ndarray:
    """Load one item's array (``allow_pickle=False``): its loose file, else its batch file,
    else its packed file.  The header is checked against the file size first: a corrupt header
    is an :class:`ItemError` naming the item, never a MemoryError.  A view's item is read from
    its source (checked there) and its columns copied, as its method would have stored them."""
    view = stage.view()
    if view is not None:
        source, columns, _ = view
        array = source.read_item(item_id)
        if array.shape[-1] < columns.stop:
            raise ItemError(item_id, f"{array.shape[-1]} columns in {source.name}, the "
                                     f"view {stage.name} takes {columns.start}..."
                                     f"{columns.stop - 1}")
        return np.ascontiguousarray(array[..., columns], dtype=stage.dtype)
    path = stage.item_path(item_id)
    try:
        return read_file(stage, item_id, ".npy", path, mmap)
    except FileNotFoundError:
        array = batches.read_batched(stage, item_id, ".npy")
        if array is not None:
            return array
        packed = stage.packed()
        array = packed.read(item_id) if packed is not None else None
        if array is not None:
            return array
        raise ItemError(item_id, f"not computed in stage {stage.name}") from None


def read_extra(stage, item_id: str, extra: str) -> np.ndarray | None:
    """Load a sidecar (``timestamps``, ``positions``...) or ``None`` when there is none."""
    view = stage.view()
    if view is not None:
        return view[0].read_extra(item_id, extra) if extra in view[2] else None
    path = stage.item_path(item_id, extra)
    if not path.exists():
        if stage.item_path(item_id).exists():
            return None
        batch = stage.batch_of(item_id)
        if batch is not None and batch.exists():
            return batches.read_batched(stage, item_id, f"+{extra}.npy")
        packed = stage.packed()
        return packed.extras(item_id).get(extra) if packed is not None else None
    return read_file(stage, item_id, f"+{extra}.npy", path)


def extras_of(stage, item_id: str) -> dict[str, np.ndarray]:
    """All sidecars of one item, by name."""
    view = stage.view()
    if view is not None:
        return {k: v for k, v in view[0].extras_of(item_id).items() if k in view[2]}
    prefix = safe_stem(item_id) + "+"
    folder = stage.item_path(item_id).parent
    loose = stage.item_path(item_id).exists()
    batch = None if loose else stage.batch_of(item_id)
    if batch is not None and batch.exists():
        try:
            names = BatchFiles.sidecars(batch, prefix[:-1])
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise ItemError(item_id, f"unreadable batch file {batch}: "
                                     f"{first_line(err)}") from None
        return {name: batches.read_batched(stage, item_id, f"+{name}.npy") for name in names}
    packed = None if loose else stage.packed()
    found = packed.extras(item_id) if packed is not None else {}
    if folder.is_dir():
        for path in folder.glob(f"{prefix}*.npy"):
            found[path.name[len(prefix):-4]] = read_file(
                stage, item_id, path.name[len(prefix) - 1:], path)
    return found


def read_file(stage, item_id: str, suffix: str, path: Path, mmap: bool = False) -> np.ndarray:
    """One file of an item, checked against its recorded checksum (not when memory-mapped:
    only the rows used are read); a mismatch is checked once more against a fresh read of
    the ledger (the item may have been recomputed since), then is a :class:`DamagedItem`.
    In a stage written with checksums a file no done ledger line sums is never read."""
    sums = stage.recorded_sums(item_id)
    if stage.checksummed and suffix not in (sums or {}):  # recomputed since? read again
        sums = stage.recorded_sums(item_id, reload=True)
        if sums is None:
            raise ItemError(item_id, f"not computed in stage {stage.name}: no ledger line "
                                     f"says it is done, so {path} is not used (`featpipe "
                                     "cache verify` names a damaged ledger)")
        if suffix not in sums:
            raise DamagedItem(item_id, ChecksumError(
                f"{path}: no checksum of it in the item's ledger line (a file put there "
                "by hand, or a damaged line)"))
    try:
        return load_item_file(item_id, path, mmap, None if mmap else (sums or {}).get(suffix))
    except DamagedItem:
        fresh = stage.recorded_sums(item_id, reload=True)
        if fresh == sums:
            raise
        return load_item_file(item_id, path, mmap, (fresh or {}).get(suffix))


def load_item_file(item_id: str, path: Path, mmap: bool = False,
                   checksum: str | None = None) -> np.ndarray:
    """One item (or sidecar) file, checked against ``checksum`` when given; FileNotFoundError
    passes, a checksum mismatch is a :class:`DamagedItem`, any other damage an ItemError."""
    try:
        return load_npy(path, mmap, checksum)
    except FileNotFoundError:
        raise
    except ChecksumError as err:
        raise DamagedItem(item_id, err) from None
    except (ValueError, EOFError, OSError) as err:
        raise ItemError(item_id, f"unreadable array {path}: {first_line(err)}") from None
    except MemoryError:
        raise ItemError(item_id, f"array {path} ({human_bytes(path.stat().st_size)}) does not "
                                 "fit in memory") from None
