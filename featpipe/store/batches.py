"""Small items committed together: one file and one ledger write for a batch of items (group
commit), so a stage of 10^6 small items is not 10^6 files and 2 x 10^6 fsyncs.

A stage of at least :data:`MIN_ITEMS` items writes each result of at most :data:`SMALL_BYTES`
(its array and sidecars together) into the batch of the worker's current chunk of items
(:data:`COMMIT_ITEMS`), instead of a file of its own::

    STAGE/batches/<host>-<pid>-<token>.<crc>.npz

An uncompressed zip of the items' ``.npy`` files, named as their loose files would be
(``<safe stem>.npy``, ``<safe stem>+<sidecar>.npy``), so ``np.load`` opens it; ``<crc>`` is the
CRC-32 of the whole file (:func:`featpipe.checksums.file_checksum`), which ``cache verify``
checks.  Each item's ledger line records the batch (``"batch": NAME``) beside the checksums
of its files (``"sums"``, the same as for loose files: :func:`featpipe.checksums.npy_checksum`).

The commit point is the ledger: the batch file is written under a temporary name, fsynced
and renamed, then every line of the batch (done items and failed ones) is appended with one
``write`` and one fsync.  A process killed before that loses the batch in flight and nothing
else: its items have no done line and are computed again; a batch file no line names is a
leftover (``cache gc`` removes it).  Large items, and every item of a smaller stage, are
written one file each, as before; readers (:meth:`featpipe.store.Stage.read_item`) find an
item wherever it is (:func:`read_batched` for the items of batch files).

``verify --repair`` removes a damaged batch file whole: its items are computed again by the
next run (at most :data:`COMMIT_ITEMS` small items).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from featpipe.checksums import (
    ChecksumError,
    DamagedItem,
    npy_checksum,
    npy_parts,
    stream_checksum,
)
from featpipe.errors import ItemError
from featpipe.fileio import (
    HOST,
    check_sidecar_name,
    checked_result,
    first_line,
    make_dirs,
    npy_from_bytes,
    safe_stem,
    tmp_path,
    write_npz,
    writing,
)
from featpipe.store import states

#: A stage of at least this many items commits its small items in batches.
MIN_ITEMS = 1000
#: An item whose array and sidecars hold at most this many bytes is small.
SMALL_BYTES = 64 * 1024
#: Items of a batch: a run hands its workers chunks of this many items (at least).
COMMIT_ITEMS = 256
#: The stage sub-folder of the batch files.
BATCH_DIR = "batches"
#: A batch file's name: host, process, a random token, the CRC-32 of the file.
BATCH_NAME = re.compile(r"^[A-Za-z0-9._-]+-\d+-[0-9a-f]{12}\.([0-9a-f]{8})\.npz$")
_HOST = re.sub(r"[^A-Za-z0-9._-]+", "_", HOST)


def commits_in_batches(n_items: int) -> bool:
    """Whether a stage of ``n_items`` items commits its small items in batches."""
    return n_items >= MIN_ITEMS


def is_small(array: np.ndarray, extras: Mapping[str, np.ndarray]) -> bool:
    return np.asarray(array).nbytes + sum(np.asarray(v).nbytes for v in extras.values()) \
        <= SMALL_BYTES


class BatchWriter:
    """The batch of one chunk of items: :meth:`add` small results and :meth:`fail` items,
    then :meth:`commit` (see the module docstring).  ``line(item_id, status, seconds,
    error, sums, batch)`` makes a ledger line; ``append(lines)`` appends them at once."""

    def __init__(self, folder: Path, dtype, line, append):
        self.folder = Path(folder)
        self.dtype = dtype
        self.line = line
        self.append = append
        self.members: dict[str, tuple[bytes, np.ndarray]] = {}
        self.done: list[tuple[str, float, dict[str, str]]] = []
        self.failures: list[tuple[str, float, str]] = []

    def add(self, item_id: str, array: np.ndarray, extras: Mapping[str, np.ndarray],
            seconds: float) -> None:
        """Check and hold one item (cast to the stage dtype, finite, as
        :meth:`featpipe.store.Stage.write_item` checks it)."""
        array = checked_result(item_id, array, self.dtype)
        stem = safe_stem(item_id)
        sums = {}
        for extra, values in extras.items():
            check_sidecar_name(extra)
            sums[f"+{extra}.npy"] = self._member(f"{stem}+{extra}.npy", np.asarray(values))
        sums[".npy"] = self._member(f"{stem}.npy", array)
        self.done.append((item_id, seconds, sums))

    def _member(self, name: str, array: np.ndarray) -> str:
        header, data = npy_parts(array)
        self.members[name] = (header, data)
        return npy_checksum(header, _crc(data))

    def fail(self, item_id: str, seconds: float, error: str) -> None:
        self.failures.append((item_id, seconds, error))

    def commit(self) -> None:
        """Write the batch file (when it holds items), then all lines in one append."""
        name = self._write() if self.done else None
        lines = [self.line(i, "done", seconds, None, sums, name)
                 for i, seconds, sums in self.done]
        lines += [self.line(i, "failed", seconds, error, None, None)
                  for i, seconds, error in self.failures]
        if lines:
            self.append(lines)

    def _write(self) -> str:
        make_dirs(self.folder)
        token = f"{_HOST}-{os.getpid()}-{secrets.token_hex(6)}"
        tmp = tmp_path(self.folder / f"{token}.npz")
        try:
            with writing(tmp):
                with open(tmp, "w+b") as handle:
                    write_npz(handle, self.members)
                    handle.flush()
                    os.fsync(handle.fileno())
                    handle.seek(0)
                    crc = stream_checksum(handle)
                name = f"{token}.{crc[6:]}.npz"
                os.replace(tmp, self.folder / name)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        return name


def _crc(data) -> int:
    import zlib

    return zlib.crc32(data)


def _header_bytes(data: bytes) -> int:
    """The length of the header of the ``.npy`` bytes ``data``."""
    import io

    handle = io.BytesIO(data)
    if np.lib.format.read_magic(handle) == (1, 0):
        np.lib.format.read_array_header_1_0(handle)
    else:
        np.lib.format.read_array_header_2_0(handle)
    return handle.tell()


class BatchFiles:
    """Read access to a stage's batch files, the open ones kept per process (a forked
    child opens its own: a zip file's offset must not be shared)."""

    _open: dict[str, zipfile.ZipFile] = {}
    _pid = os.getpid()
    KEEP = 8

    @classmethod
    def _archive(cls, path: Path) -> zipfile.ZipFile:
        if cls._pid != os.getpid():
            cls._open, cls._pid = {}, os.getpid()
        archive = cls._open.pop(str(path), None)
        if archive is None:
            archive = zipfile.ZipFile(path)  # FileNotFoundError: gone (packed, repaired)
            if len(cls._open) >= cls.KEEP:
                cls._open.pop(next(iter(cls._open))).close()
        cls._open[str(path)] = archive  # most recent last
        return archive

    @classmethod
    def forget(cls, path: Path) -> None:
        archive = cls._open.pop(str(path), None)
        if archive is not None:
            archive.close()

    @classmethod
    def load(cls, path: Path, member: str, checksum: str | None) -> np.ndarray:
        """The array of ``member`` of batch file ``path`` (a copy: writable, as a loose
        read gives), checked against ``checksum``; KeyError when the batch lacks it,
        :class:`ChecksumError` when its bytes differ, ValueError for other damage."""
        try:
            data = cls._archive(path).read(member)
        except zipfile.BadZipFile as err:
            cls.forget(path)
            if str(err).startswith("Bad CRC-32"):  # zip's own check of the member's bytes
                raise ChecksumError(f"{path}:{member}: its checksum (the zip's CRC-32) "
                                    "differs from the one recorded when it was written "
                                    "(damaged at rest)") from None
            raise ValueError(f"{path}: {err}") from None
        array = npy_from_bytes(data)
        if checksum is not None:
            start = _header_bytes(data)
            found = npy_checksum(data[:start], _crc(memoryview(data)[start:]))
            if found != checksum:
                raise ChecksumError(f"{path}:{member}: checksum {found} differs from "
                                    f"{checksum} recorded when it was written (damaged at "
                                    "rest)")
        return array.copy()

    @classmethod
    def sidecars(cls, path: Path, stem: str) -> list[str]:
        """The sidecar names of the item with file stem ``stem`` in batch file ``path``."""
        prefix = f"{stem}+"
        return [name[len(prefix):-4] for name in cls._archive(path).namelist()
                if name.startswith(prefix) and name.endswith(".npy")]


def batch_checksum(name: str) -> str | None:
    """The checksum a batch file's name records, or None for a name that is not one."""
    match = BATCH_NAME.match(name)
    return f"crc32:{match.group(1)}" if match else None


# -- an item read from its batch file -----------------------------------------------------------

def batch_of(stage, item_id: str, reload: bool = False) -> Path | None:
    """The batch file the ledger says holds done item ``item_id`` of ``stage`` (it may be
    gone), or None for an item of its own file."""
    state = states.state_of(stage, item_id, reload)
    batch = state.batch if state is not None and state.status == "done" else None
    return None if batch is None else stage.path / BATCH_DIR / batch


def read_batched(stage, item_id: str, suffix: str) -> np.ndarray | None:
    """The file ``suffix`` of ``item_id`` from its batch file, checked against its
    recorded checksum; None when the item is in none (or its batch file is gone).  A
    batch file that is gone or damaged is looked up once more in a fresh read of the
    ledgers (the item may have been recomputed since, into another batch)."""
    path = stage.batch_of(item_id)
    if path is None:
        return None
    try:
        return _load_batched(stage, item_id, suffix, path)
    except (FileNotFoundError, DamagedItem):
        fresh = stage.batch_of(item_id, reload=True)
        if fresh is not None and fresh != path:
            return read_batched(stage, item_id, suffix)
        if fresh is None or not fresh.exists():
            return None
        raise


def _load_batched(stage, item_id: str, suffix: str, path: Path) -> np.ndarray | None:
    member = safe_stem(item_id) + suffix
    try:
        return BatchFiles.load(path, member, (stage.recorded_sums(item_id) or {}).get(suffix))
    except KeyError:
        if suffix != ".npy":
            return None
        raise ItemError(item_id, f"batch file {path} lacks {member}") from None
    except ChecksumError as err:
        raise DamagedItem(item_id, err) from None
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ItemError(item_id, f"unreadable batch file {path}: {first_line(err)}") \
            from None
