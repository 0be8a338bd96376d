"""File primitives every other module builds on: atomic writes, safe item file names, shards.

A leaf module (it imports nothing of featpipe but its errors and checksums), so the store,
manifests, packs and executors can all use it without importing each other.

- Atomic writes: a temporary file ``<name>.tmp.<host>.<pid>`` in the same folder, flushed and
  fsynced, then ``os.replace``: a reader sees the old file, the new file or no file, never a
  partial one; the temporary file is removed when the write fails (disk full, read-only).
- Item ids map to file stems that cannot escape their folder and never collide (a readable
  part plus a digest of the exact id).
- Shards: item ``i`` belongs to shard ``int(sha256(i)[:8], 16) mod N``.
- Write failures (disk full, read-only file system, no permission) become one
  :class:`~featpipe.errors.WriteError` line naming the file.
- ``.npy`` headers are checked against the bytes that hold the data before anything is
  allocated, so a header that declares a shape of 10^12 rows is an error, not a MemoryError.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import io
import logging
import math
import os
import re
import socket
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from featpipe.checksums import DataCrc, check, npy_checksum, npy_parts, stream_checksum
from featpipe.errors import ItemError, ParameterError, WriteError

HOST = socket.gethostname().split(".")[0] or "host"
_SAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def process_gone(host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` has certainly ended: only a process of this host
    can be checked (one of another host is never known to be gone)."""
    if host != HOST or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


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


#: The end of a temporary name, ``.tmp.<host>.<pid>`` (of a file, or of a folder gc deletes).
TMP_NAME = re.compile(r"\.tmp\.([^./]+)\.(\d+)$")
#: A temporary file of another host is a leftover once it is this old (its writer cannot be
#: checked from here).
TMP_MAX_AGE_S = 86400.0


def stale_tmp(path: Path) -> bool:
    """Whether ``path`` (``<name>.tmp.<host>.<pid>``, a file or a folder) was left by a writer
    that is gone: a process of this host that died, or one older than :data:`TMP_MAX_AGE_S`."""
    match = TMP_NAME.search(path.name)
    if match is None:
        return False
    if process_gone(match.group(1), int(match.group(2))):
        return True
    try:
        return time.time() - path.stat().st_mtime > TMP_MAX_AGE_S
    except FileNotFoundError:
        return False


def remove_stale_tmps(path: Path) -> None:
    """Remove the temporary files that killed writers of ``path`` left beside it (an export
    killed while writing leaves ``FILE.npz.tmp.<host>.<pid>``: its rerun removes it)."""
    for leftover in path.parent.glob(f"{glob.escape(path.name)}.tmp.*"):
        if leftover.is_file() and stale_tmp(leftover):
            with writing(leftover, "remove"):
                leftover.unlink(missing_ok=True)


_WRITE_HINTS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system"}


def os_reason(err: OSError, path: str | os.PathLike | None = None) -> str:
    """``strerror`` of an OSError, with a hint for the write failures users meet most.

    numpy reports a short write without an errno (``8176 written``): when the file system of
    ``path`` then has no free block left, that is a full disk, and it is said so.
    """
    code = err.errno
    if code is None and path is not None and free_bytes(Path(path)) == 0:
        code = errno.ENOSPC
    text = os.strerror(code) if code is not None and not err.strerror else err.strerror
    text = text or first_line(err)
    hint = _WRITE_HINTS.get(code)
    return f"{text} ({hint})" if hint and hint not in text.lower() else text


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path``."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def writing(path: str | os.PathLike, verb: str = "write") -> Iterator[None]:
    """Turn an OSError raised inside the block into a :class:`WriteError` naming ``path``
    (``cannot <verb> <path>: <reason>``)."""
    try:
        yield
    except OSError as err:
        raise WriteError(f"cannot {verb} {path}: {os_reason(err, path)}") from None


def make_dirs(path: str | os.PathLike) -> None:
    """``mkdir -p`` whose failure is a :class:`WriteError` naming the folder."""
    with writing(path):
        Path(path).mkdir(parents=True, exist_ok=True)


def check_output_path(path: str | os.PathLike, option: str,
                      store_root: str | os.PathLike | None = None) -> None:
    """Refuse, before any work is done, an output file that cannot be written (a folder, a
    parent that is a file, a folder that is read-only) or that lies inside the store folder
    ``store_root`` (a file in its ``names/`` or ``stages/`` breaks ``cache ls`` and ``gc``):
    a :class:`ParameterError` for ``option``, so results are never computed and then lost."""
    path = Path(path)
    if store_root is not None:
        check_outside_store(path, option, store_root)
    if path.is_dir():
        raise ParameterError(option, f"{path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ParameterError(option, f"cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
        raise ParameterError(option, f"cannot write {path}: {parent} is "
                             + ("on a read-only file system" if read_only else "not writable"))


#: The folder of a store that holds log files (``featpipe submit``'s default task logs).
STORE_LOGS = "logs"


def check_outside_store(path: str | os.PathLike, option: str,
                        store_root: str | os.PathLike) -> None:
    """A :class:`ParameterError` for ``option`` when ``path`` is inside the store folder
    ``store_root`` (links resolved) but not in its :data:`STORE_LOGS` folder: featpipe's own
    files are the only files a store holds."""
    root, target = Path(store_root).resolve(), Path(path).resolve()
    if target.is_relative_to(root) and not target.is_relative_to(root / STORE_LOGS):
        raise ParameterError(option, f"{path} is inside the store {store_root}; write it "
                                     f"outside the store folder (or in its {STORE_LOGS}/)")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write(handle)`` into a temporary file, fsync it and rename it onto ``path``.

    Whatever fails (disk full, read-only folder, a bad array), the temporary file is removed
    and the old ``path``, if any, is untouched; an OSError becomes a :class:`WriteError`.
    """
    path = Path(path)
    tmp = tmp_path(path)
    try:
        with writing(path):
            with open(tmp, "w+b") as handle:  # readable too: h5py reads what it writes
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda handle: handle.write(data))


def write_if_changed(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` (atomically) unless the file holds exactly it already: a
    rerun that changes nothing touches nothing."""
    try:
        if Path(path).read_bytes() == data:
            return
    except OSError:
        pass
    atomic_write_bytes(path, data)


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> str:
    """``np.save`` made atomic (no pickle); returns the checksum of the bytes written
    (:func:`featpipe.checksums.npy_checksum`), summed while they are written and fsynced
    (:class:`featpipe.checksums.DataCrc`)."""
    header, data = npy_parts(array)
    crc = DataCrc(data)
    try:
        atomic_write(path, lambda handle: (handle.write(header), handle.write(data.data)))
    finally:
        value = crc.result()
    return npy_checksum(header, value)


def atomic_save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                    checksum: bool = False) -> str | None:
    """What ``np.savez`` writes (no pickle: object arrays are refused), made atomic and the
    same bytes on every Python (:func:`write_npz`); with ``checksum`` returns the checksum of
    the file (:func:`featpipe.checksums.stream_checksum`, read back before the rename:
    zipfile seeks back to patch its headers, so the bytes are summed once they are final)."""
    arrays = {key: np.asarray(value) for key, value in arrays.items()}
    for key, value in arrays.items():
        if value.dtype.hasobject:
            raise ValueError(f"array {key!r} has dtype object; featpipe never pickles")
    members = {f"{key}.npy": npy_parts(value) for key, value in arrays.items()}
    written = []

    def write(handle):
        write_npz(handle, members)
        if checksum:
            handle.flush()
            handle.seek(0)
            written.append(stream_checksum(handle))

    atomic_write(path, write)
    return written[0] if checksum else None


#: The time stamp of every member of an ``.npz`` featpipe writes (zipfile's own default).
NPZ_MEMBER_TIME = (1980, 1, 1, 0, 0, 0)


def write_npz(handle: BinaryIO, members: Mapping[str, tuple[bytes, np.ndarray]]) -> None:
    """An uncompressed zip of ``.npy`` files, ``{member name: npy_parts(array)}``
    (:func:`featpipe.checksums.npy_parts`: each array in C order), as ``np.savez`` writes
    one and ``np.load`` reads it (``.npz``), every member dated 1980-01-01 (zipfile's
    default).  Each member's size is given before it is written, so zipfile adds the ZIP64
    fields only to a member that needs them (over about 2 GiB), instead of to every member
    as ``np.savez`` asks (``force_zip64``), whose bytes changed between Python 3.11.2 and
    3.11.7 (CPython gh-103861): a store's files do not depend on the Python that wrote them."""
    with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, (header, data) in members.items():
            member = zipfile.ZipInfo(name, date_time=NPZ_MEMBER_TIME)
            member.file_size = len(header) + data.nbytes
            member.external_attr = 0o600 << 16
            with archive.open(member, "w") as out:
                out.write(header)
                out.write(data.data)


def _npy_header(handle: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(handle)
    return np.lib.format.read_array_header_2_0(handle)


def human_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _checked_header(handle: BinaryIO, total_bytes: int
                    ) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    shape, fortran, dtype = _npy_header(handle)
    declared = 0 if dtype.hasobject else math.prod(shape) * dtype.itemsize
    available = total_bytes - handle.tell()
    if declared > available:
        raise ValueError(f"header declares shape {shape} {dtype} ({human_bytes(declared)}) "
                         f"but the file holds {human_bytes(max(available, 0))} of data "
                         "(truncated or corrupt)")
    return shape, fortran, dtype, declared


def check_npy_header(handle: BinaryIO, total_bytes: int) -> tuple[tuple[int, ...], np.dtype]:
    """Read an ``.npy`` header and check that the ``total_bytes`` of the stream hold the data
    it declares; raises ``ValueError`` (before anything is allocated) when they do not."""
    shape, _, dtype, _ = _checked_header(handle, total_bytes)
    return shape, dtype


def load_npy(path: str | os.PathLike, mmap: bool = False, checksum: str | None = None
             ) -> np.ndarray:
    """One ``.npy`` file (no pickle: an object array is a ``ValueError``), its header checked
    by :func:`check_npy_header` first; read through one open file, memory-mapped with
    ``mmap``.  With ``checksum`` (not with ``mmap``) the bytes read are checked against it:
    a :class:`~featpipe.checksums.ChecksumError` when they differ."""
    with open(path, "rb") as handle:
        shape, fortran, dtype, nbytes = _checked_header(handle, os.fstat(handle.fileno()).st_size)
        if dtype.hasobject:
            raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
        if not mmap:
            start = handle.tell()
            buffer = np.empty(nbytes, np.uint8)  # not zero-filled: read straight into it
            if handle.readinto(buffer.data) != nbytes:
                raise EOFError(f"{path}: file shorter than its header declares")
            if checksum is not None:
                handle.seek(0)
                found = npy_checksum(handle.read(start), zlib.crc32(buffer))
                check(path, found, checksum)
            return buffer.view(dtype).reshape(shape, order="F" if fortran else "C")
    return np.load(path, mmap_mode="r", allow_pickle=False)


def npy_from_bytes(data: bytes) -> np.ndarray:
    """The array of an ``.npy`` file's bytes (read-only, no copy), checked as by
    :func:`load_npy` (no pickle, a header that declares more data than there is refused)."""
    handle = io.BytesIO(data)
    shape, fortran, dtype, nbytes = _checked_header(handle, len(data))
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    flat = np.frombuffer(data, np.uint8, nbytes, handle.tell())
    return flat.view(dtype).reshape(shape, order="F" if fortran else "C")


def memory_bytes() -> int:
    """Physical memory of this machine (the most one array could ever take)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**62


def check_h5_dataset(node, name: str) -> None:
    """Refuse, before reading, an HDF5 dataset that cannot hold the array it declares: an
    ``h5py.Empty`` one (no shape), one larger than this machine's memory, or an unfiltered one
    with fewer bytes stored than its shape needs (truncated, or never written: reading it would
    give fill values).  Raises ``ValueError`` naming ``name``."""
    if node.shape is None:
        raise ValueError(f"dataset {name!r} is empty (h5py.Empty: no shape, no data)")
    declared = math.prod(node.shape) * node.dtype.itemsize
    if declared > memory_bytes():
        raise ValueError(f"dataset {name!r} declares shape {node.shape} {node.dtype} "
                         f"({human_bytes(declared)}), more than this machine's memory "
                         f"({human_bytes(memory_bytes())})")
    stored = node.id.get_storage_size()
    plist = getattr(node, "plist", None) or node.id.get_create_plist()
    if plist.get_nfilters() == 0 and stored < declared:
        raise ValueError(f"dataset {name!r} declares shape {node.shape} {node.dtype} "
                         f"({human_bytes(declared)}) but only {human_bytes(stored)} are stored "
                         "(truncated or never written)")


#: Names of an item's sidecar files (``timestamps``, ``positions``...).
SIDECAR_NAME = re.compile(r"[a-z][a-z0-9_]*")


def check_sidecar_name(name: str) -> None:
    if not SIDECAR_NAME.fullmatch(name):
        raise ValueError(f"sidecar name {name!r} must match [a-z][a-z0-9_]*")


def checked_result(item_id: str, array, dtype) -> np.ndarray:
    """An item's result as the stage stores it: numeric, floats cast to ``dtype``; a NaN or
    Inf, or a value that overflows ``dtype``, is refused (a silently wrong number must never
    reach the disk); nonzero values that the cast turns into 0 (below float16's smallest
    subnormal, 6e-8) are stored with a warning naming the item and their count."""
    array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        raise ItemError(item_id, f"result has non-numeric dtype {array.dtype}")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)):
            raise ItemError(item_id, "result contains NaN or Inf; nothing was written")
        if array.dtype != dtype:  # only a cast can overflow or underflow
            with np.errstate(over="ignore", under="ignore"):
                cast = array.astype(dtype)
            if not np.all(np.isfinite(cast)):
                raise ItemError(item_id, f"result overflows {dtype}; nothing was written")
            if np.finfo(dtype).tiny > np.finfo(array.dtype).tiny:  # a narrower type
                lost = int(np.count_nonzero((cast == 0) & (array != 0)))
                if lost:
                    logging.getLogger("featpipe").warning(
                        "%s: %d of %d nonzero values are below the smallest %s (%.2g) and are "
                        "stored as 0", item_id, lost, int(np.count_nonzero(array)), dtype,
                        np.finfo(dtype).smallest_subnormal)
            array = cast
    return array
