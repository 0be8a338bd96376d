"""An item written row by row as its frames arrive, so it never has to fit in memory.

:class:`ItemFiles` (an :class:`featpipe.items.ItemSink`) appends rows to an ``.npy`` file (and
per-row sidecars to theirs) as they come: each file is written under a temporary name beside
its final place with a placeholder header of :data:`NPY_HEADER_BYTES`, the header is patched
with the final row count (:class:`RowFile`), and :meth:`PendingItem.commit` renames the files
into place, main array last, then appends the ledger line: the same commit point as
:meth:`featpipe.store.Stage.write_item`.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featpipe.checksums import npy_checksum
from featpipe.errors import InputError, ItemError
from featpipe.fileio import (
    atomic_save_npy,
    check_sidecar_name,
    checked_result,
    make_dirs,
    tmp_path,
    writing,
)

#: bytes reserved for the header of an incrementally written .npy (magic, version, length,
#: the header dict padded with spaces); a multiple of 64 as numpy aligns its own headers
NPY_HEADER_BYTES = 128
_NPY_MAGIC = b"\x93NUMPY\x01\x00"


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 .npy header of exactly :data:`NPY_HEADER_BYTES` bytes."""
    text = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                 "fortran_order": False, "shape": tuple(int(s) for s in shape)})
    body = NPY_HEADER_BYTES - len(_NPY_MAGIC) - 2
    if len(text) + 1 > body:
        raise ValueError(f"shape {shape} does not fit the reserved .npy header")
    text = text.ljust(body - 1) + "\n"
    return _NPY_MAGIC + body.to_bytes(2, "little") + text.encode("latin1")


class RowFile:
    """An ``.npy`` written a block of rows at a time: a placeholder header first, rows
    appended, the header patched with the final count on :meth:`close` (then fsynced).
    :attr:`checksum` is then the checksum of the bytes written (the rows' CRC is updated as
    they are written, the header's added last: :func:`featpipe.checksums.npy_checksum`).
    A failed write (disk full) is a :class:`~featpipe.errors.WriteError`: the store's
    fault, not the item's."""

    def __init__(self, path: str | os.PathLike, dtype, row_shape: tuple[int, ...] | None = None):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.row_shape = None if row_shape is None else tuple(row_shape)
        self.rows = 0
        self.crc = 0
        self.checksum: str | None = None
        with writing(self.path):
            self.handle = open(self.path, "wb")  # noqa: SIM115 - closed by close()/abort()
            self.handle.write(_npy_header(self.dtype, (0, *(self.row_shape or ()))))

    def append(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if self.row_shape is None:
            self.row_shape = rows.shape[1:]
        elif rows.shape[1:] != self.row_shape:
            raise InputError(f"rows of shape {rows.shape[1:]} after rows of shape "
                             f"{self.row_shape}")
        with writing(self.path):
            self.handle.write(rows.data)
        self.crc = zlib.crc32(rows.data, self.crc)
        self.rows += rows.shape[0]

    def close(self) -> None:
        header = _npy_header(self.dtype, (self.rows, *(self.row_shape or ())))
        with writing(self.path):
            self.handle.seek(0)
            self.handle.write(header)
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
        self.checksum = npy_checksum(header, self.crc)

    def abort(self) -> None:
        try:
            self.handle.close()  # flushes what is buffered: fails on a full disk
        except OSError:
            pass
        self.path.unlink(missing_ok=True)


@dataclass
class PendingItem:
    """An item whose files are written but not yet in place: :meth:`commit` makes it done.

    ``files`` maps a sidecar name ("" for the main array) to its finished temporary file and
    ``sums`` to its checksum; ``sidecars`` are small arrays written at commit; ``array`` is a
    whole small result written at commit instead of a main file.
    """

    item_id: str
    files: dict[str, str] = field(default_factory=dict)
    sums: dict[str, str] = field(default_factory=dict)
    sidecars: dict[str, np.ndarray] = field(default_factory=dict)
    array: np.ndarray | None = None

    def commit(self, stage, seconds: float = 0.0) -> None:
        """Sidecars, then the main array (the commit point), then the ledger line."""
        if self.array is not None:
            stage.write_item(self.item_id, self.array, self.sidecars, seconds=seconds)
            return
        target = stage.item_path(self.item_id)
        make_dirs(target.parent)
        sums = {f"+{name}.npy" if name else ".npy": value for name, value in self.sums.items()}
        for name, values in self.sidecars.items():
            sums[f"+{name}.npy"] = atomic_save_npy(stage.item_path(self.item_id, name),
                                                   np.asarray(values))
        for name, path in self.files.items():
            if name:
                os.replace(path, stage.item_path(self.item_id, name))
        os.replace(self.files[""], target)
        stage.record(self.item_id, "done", seconds=seconds, sums=sums)

    def discard(self) -> None:
        for path in self.files.values():
            Path(path).unlink(missing_ok=True)


class ItemFiles:
    """An :class:`ItemSink` on disk for one item of ``stage``: rows are cast to the stage's
    dtype, checked finite and appended, with their per-row sidecars, to temporary files
    beside their final place, so an item costs a few frames of memory whatever its length;
    :meth:`close` gives the :class:`PendingItem` to commit, :meth:`abort` removes the files."""

    def __init__(self, stage, item_id: str):
        self.stage = stage
        self.item_id = item_id
        self.dtype = stage.dtype
        self.files: dict[str, RowFile] = {}
        self.sidecars: dict[str, np.ndarray] = {}
        self.array: np.ndarray | None = None

    def paths(self) -> list[str]:
        """Every temporary file this item may leave behind (for cleanup by another process)."""
        return [str(f.path) for f in self.files.values()]

    def _file(self, name: str, dtype) -> RowFile:
        if name not in self.files:
            if name:
                check_sidecar_name(name)
            target = self.stage.item_path(self.item_id, name or None)
            make_dirs(target.parent)
            self.files[name] = RowFile(tmp_path(target), dtype)
        return self.files[name]

    def append(self, rows, **row_sidecars) -> None:
        rows = checked_result(self.item_id, rows, self.dtype)
        self._file("", rows.dtype).append(rows)
        for name, values in row_sidecars.items():
            values = np.asarray(values)
            if values.shape[0] != rows.shape[0]:
                raise ValueError(f"sidecar {name!r} has {values.shape[0]} rows for "
                                 f"{rows.shape[0]}")
            self._file(name, values.dtype).append(values)

    def write(self, array, **sidecars) -> None:
        self.array = checked_result(self.item_id, array, self.dtype)
        self.sidecars.update(sidecars)

    def set(self, **sidecars) -> None:
        """Item-level sidecars (``timestamps``, ``image_size``), written at commit."""
        self.sidecars.update(sidecars)

    def close(self) -> PendingItem:
        if self.array is None and "" not in self.files:
            raise ItemError(self.item_id, "no frames were produced")
        for handle in self.files.values():
            handle.close()
        return PendingItem(self.item_id, {k: str(f.path) for k, f in self.files.items()},
                           {k: f.checksum for k, f in self.files.items()},
                           dict(self.sidecars), self.array)

    def abort(self) -> None:
        for handle in self.files.values():
            handle.abort()
        self.files = {}
