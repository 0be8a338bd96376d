"""Checksums of what the store writes: taken of the very bytes written, kept beside them,
checked when they are read and by ``featpipe cache verify`` (as restic, git and DVC do).

The checksum is CRC-32 (``zlib.crc32``, the polynomial of zip, gzip and PNG): it detects every
error burst up to 32 bits and every odd number of flipped bits, and runs at the speed of a
memory copy, so the write path pays almost nothing for it (``benchmarks/bench_checksums.py``).
It guards against damage at rest (a flipped bit, an outside write), not against an attacker.
A checksum is the text ``crc32:<8 hex digits>``.

- An ``.npy`` file (an item or its sidecar): the CRC of its data bytes followed by its header
  bytes (:func:`npy_checksum`), so a file whose header is patched after its rows were
  appended (:class:`featpipe.store.item_files.RowFile`) is summed in one pass as it is written.
- Any other file (a model's ``.npz`` and ``.json``, a packed HDF5 shard, a stage's
  ``items.csv`` and ``read-hashes.json``): the CRC of its bytes in order
  (:func:`file_checksum`), kept in another file (the ledger, ``models/<name>.sums``,
  ``pack.json``, ``stage.json``).
- A record that holds checksums itself (``stage.json``, ``pack.json``, a ledger line, the
  store's ``content-hashes.json``) is *sealed*: its JSON object ends with a member
  ``"crc32": "crc32:<8 hex>"``, the CRC of every byte before that member, started from the
  CRC of its owner (the stage folder and file it belongs to), so a record copied to another
  place does not pass either (:func:`seal_json`, :func:`unseal_json`).  A name file holds
  its stage folder and, on a second line, the CRC of the name and that folder
  (:func:`name_checksum`).

:data:`CHECKSUM_FORMAT` is recorded in each stage's ``stage.json`` (``"checksums"``): in a
stage written with it, a missing checksum is damage, never the mark of an older store
(``docs/store.md``).
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import zlib
from typing import BinaryIO

import numpy as np

from featpipe.errors import ItemError

#: What a stored checksum looks like.
CHECKSUM = re.compile(r"^crc32:[0-9a-f]{8}$")
_BLOCK = 1 << 20
#: The checksum rules a stage records as written with (``"checksums"`` in ``stage.json``):
#: 2 = every file the store writes (issue 39).  Stages without the field were written
#: before, when items, models and packed files had checksums and records did not.
CHECKSUM_FORMAT = 2


class ChecksumError(ValueError):
    """A file's bytes no longer match the checksum taken when it was written."""


class DamagedItem(ItemError):
    """An item whose stored bytes differ from the checksum taken when they were written:
    never used; ``featpipe cache verify --repair`` removes it so that a re-run recomputes it."""

    def __init__(self, item: str, err: ChecksumError):
        super().__init__(item, f"damaged: {err}; `featpipe cache verify --repair` removes it "
                               "and a re-run of its stage's command recomputes it")


def array_checksum(array: np.ndarray) -> str:
    """The checksum of an array's bytes in C order (a packed item: its shape and dtype are
    the HDF5 dataset's own)."""
    return as_text(zlib.crc32(np.ascontiguousarray(array).ravel().view(np.uint8)))


def ids_checksum(ids: list[str]) -> str:
    """The checksum of a packed file's list of item ids: their UTF-8 bytes, one a line (a
    manifest refuses ids that are not valid UTF-8)."""
    return as_text(zlib.crc32("\n".join(ids).encode()))


def as_text(crc: int) -> str:
    return f"crc32:{crc & 0xFFFFFFFF:08x}"


def owner_crc(owner: str) -> int:
    """The CRC a sealed record's checksum starts from: that of the place it belongs to."""
    return zlib.crc32(owner.encode())


#: The end of a sealed JSON record: its checksum member, then ``}`` and a newline (a ledger
#: line, whose newline is the ledger's, ends with the ``}``).
_SEAL = re.compile(rb'(?:, |)"crc32": "(crc32:[0-9a-f]{8})"}\n?\Z')


def seal_json(text: bytes, owner: str) -> bytes:
    """The JSON object ``text`` (ending with ``}``) with its checksum as its last member:
    the CRC of every byte before that member, started from :func:`owner_crc`; a newline
    ends it unless ``text`` ended without one (a ledger line)."""
    end = b"\n" if text.endswith(b"\n") else b""
    head = text.rstrip()
    if not head.endswith(b"}"):
        raise ValueError("a sealed record is a JSON object")
    head = head[:-1].rstrip()
    if not head.endswith(b"{"):
        head += b", "
    crc = as_text(zlib.crc32(head, owner_crc(owner)))
    return head + b'"crc32": "' + crc.encode() + b'"}' + end


def unseal_json(raw: bytes, owner: str, where: str | os.PathLike | None = None
                ) -> tuple[object, bool]:
    """The JSON value of ``raw`` (its ``crc32`` member removed) and whether it was sealed; a
    seal that differs from its bytes is a :class:`ChecksumError` naming ``where`` (default:
    the owner), text that is not JSON a ``ValueError``.  An unsealed record is returned as
    read: whether that is damage (a record of a stage written with :data:`CHECKSUM_FORMAT`)
    is the caller's rule."""
    sealed = check_seal(raw, owner, where)
    value = json.loads(raw.decode())
    if sealed:  # a JSON object whose last member is the seal
        del value["crc32"]
    return value, sealed


def check_seal(raw: bytes, owner: str, where: str | os.PathLike | None = None) -> bool:
    """Whether ``raw`` is sealed (:func:`seal_json`); a seal that differs from its bytes is
    a :class:`ChecksumError` naming ``where`` (default: the owner)."""
    found = _SEAL.search(raw)
    if found is None:
        return False
    head = raw[:found.start()]
    if found.group(0).startswith(b", "):
        head += b", "
    check(where or owner, as_text(zlib.crc32(head, owner_crc(owner))),
          found.group(1).decode())
    return True


def name_checksum(name: str, folder: str) -> str:
    """The checksum a name file (``names/NAME``, ``names/.running/NAME``) keeps on its second
    line: of the name and the stage folder it points to, so that a name file copied onto
    another name does not pass."""
    return as_text(zlib.crc32(f"{name}\n{folder}".encode()))


def npy_checksum(header: bytes, data_crc: int) -> str:
    """The checksum of an ``.npy`` file from the CRC of its data and its header bytes."""
    return as_text(zlib.crc32(header, data_crc))


def npy_parts(array: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The header a version 1.0 ``.npy`` of ``array`` starts with (the one ``np.save`` writes)
    and its data as a flat uint8 array in C order (no pickle: an object array is refused)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # not ``np.ascontiguousarray``: it makes a 0-d array 1-d
        array = array.copy(order="C")
    if array.dtype.hasobject:
        raise ValueError("Object arrays cannot be saved when allow_pickle=False")
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, np.lib.format.header_data_from_array_1_0(array))
    return buffer.getvalue(), array.ravel().view(np.uint8)


#: Buffers from this size on are summed by a second thread while they are written.
PARALLEL_BYTES = 1 << 18


class DataCrc:
    """The CRC-32 of a buffer; a large one is summed by a second thread (``zlib`` releases
    the GIL), so the sum runs while the same bytes are written and fsynced and the write
    path waits for it only when it takes longer than the write."""

    def __init__(self, data: np.ndarray):
        self.value = None
        self._thread = None
        if data.nbytes < PARALLEL_BYTES:
            self.value = zlib.crc32(data)
        else:
            self._thread = threading.Thread(target=self._sum, args=(data,))
            self._thread.start()

    def _sum(self, data) -> None:
        self.value = zlib.crc32(data)

    def result(self) -> int:
        if self._thread is not None:
            self._thread.join()
        return self.value


def check(path: str | os.PathLike, found: str, expected: str | None) -> None:
    """Raise :class:`ChecksumError` when ``found`` differs from ``expected`` (None: unknown)."""
    if expected is not None and found != expected:
        raise ChecksumError(f"{path}: checksum {found} differs from {expected} recorded when it "
                            "was written (damaged at rest)")


def npy_file_checksum(path: str | os.PathLike) -> str:
    """The checksum (:func:`npy_checksum`) of an ``.npy`` file, read once in 1 MiB blocks;
    everything after the header counts as data (trailing bytes change it too)."""
    with open(path, "rb") as handle:
        if np.lib.format.read_magic(handle) == (1, 0):
            np.lib.format.read_array_header_1_0(handle)
        else:
            np.lib.format.read_array_header_2_0(handle)
        size = handle.tell()
        handle.seek(0)
        header = handle.read(size)
        crc = 0
        for block in iter(lambda: handle.read(_BLOCK), b""):
            crc = zlib.crc32(block, crc)
    return npy_checksum(header, crc)


def stream_checksum(handle: BinaryIO) -> str:
    """The checksum of the bytes of ``handle`` from where it stands to its end."""
    crc = 0
    for block in iter(lambda: handle.read(_BLOCK), b""):
        crc = zlib.crc32(block, crc)
    return as_text(crc)


def file_checksum(path: str | os.PathLike) -> str:
    """The checksum of a whole file, its bytes in order, read in 1 MiB blocks."""
    with open(path, "rb") as handle:
        return stream_checksum(handle)
