"""A stage's ledgers: ``ledger/<host>-<pid>.jsonl``, one file per process, one JSON line per
item it computed (``id``, ``status`` done|failed|removed, ``seconds``, ``error``, ``time``, the
checksums of a done item's files by suffix ``sums``, its ``batch`` file).

The ledgers are the record of what a stage holds: an item counts as done only when a ledger
line says so *and* its file exists.  Each line is sealed to its stage
(:func:`featpipe.checksums.seal_json`, owner :func:`ledger_owner`) and appended with one
``os.write`` on an ``O_APPEND`` descriptor, then fsynced (:class:`LedgerWriter`), so a process
killed at any moment leaves at most its last line cut short, which readers skip.  Reading
every line is the slow way to the items' states (:func:`item_states`); the index
(:mod:`featpipe.store.index`) folds them once.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featpipe.checksums import CHECKSUM, ChecksumError, check_seal, seal_json, unseal_json
from featpipe.fileio import HOST, first_line, make_dirs, writing
from featpipe.store.batches import BATCH_NAME

#: The folder of a stage holding its ledgers.
LEDGER_DIR = "ledger"


@dataclass(frozen=True)
class LedgerEntry:
    """One line of a ledger: what happened to one item in one process."""

    id: str
    status: str  # "done", "failed" or "removed" (its files removed by ``verify --repair``)
    seconds: float
    error: str | None
    time: float
    #: checksum of each file of a done item by its suffix (``.npy``, ``+timestamps.npy``);
    #: None for a line written before featpipe kept checksums
    sums: dict[str, str] | None = None
    #: the batch file holding the item (:mod:`featpipe.store.batches`); None for a loose file
    batch: str | None = None


#: What a ledger line says of its item: computed, failed, or its files removed by ``cache
#: verify --repair`` (to be computed again; :mod:`featpipe.store.index` folds the three).
LEDGER_STATUSES = ("done", "failed", "removed")
#: The suffix that names an item's file in its ledger line's ``sums``: ``.npy`` for the
#: array, ``+NAME.npy`` for a sidecar.
SUM_SUFFIX = re.compile(r"^(\+[a-z][a-z0-9_]*)?\.npy$")
#: How far ahead of this host's clock a ledger line's time may be (another host's clock).
_CLOCK_SKEW_S = 86400.0


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        np.isfinite(value)


def ledger_entry(raw, checksummed: bool = False) -> LedgerEntry | str:
    """A parsed ledger line as an entry, or the reason it is not one; in a stage written with
    checksums (``checksummed``) a done line must hold the checksums of its files."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    if not isinstance(raw.get("id"), str):
        return "'id' missing or not a string"
    if raw.get("status") not in LEDGER_STATUSES:
        return f"'status' must be 'done', 'failed' or 'removed', got {raw.get('status')!r}"
    for key in ("seconds", "time"):
        if not _is_number(raw.get(key, 0.0)):
            return f"{key!r} must be a number, got {raw.get(key)!r}"
        if raw.get(key, 0.0) < 0:
            return f"{key!r} must be >= 0, got {raw.get(key)!r}"
    if raw.get("time", 0.0) > time.time() + _CLOCK_SKEW_S:
        return f"'time' {raw['time']!r} is in the future (a clock or a writer gone wrong)"
    if raw.get("seconds", 0.0) > time.time():
        return f"'seconds' {raw['seconds']!r} is more than the time since 1970"
    if not isinstance(raw.get("error"), str | None):
        return "'error' must be a string or null"
    sums = raw.get("sums")
    if sums is not None and not (isinstance(sums, dict) and all(
            isinstance(k, str) and SUM_SUFFIX.match(k) and isinstance(v, str)
            and CHECKSUM.match(v) for k, v in sums.items())):
        return "'sums' must map file suffixes (.npy, +NAME.npy) to checksums crc32:<8 hex>"
    if checksummed and raw["status"] == "done" and not (sums or {}).get(".npy"):
        return ("damaged: a done line without the checksum of its file, in a stage written "
                "with checksums")
    batch = raw.get("batch")
    if batch is not None and not (isinstance(batch, str) and BATCH_NAME.match(batch)):
        return "'batch' must name a batch file (<host>-<pid>-<token>.<crc>.npz)"
    return LedgerEntry(raw["id"], raw["status"], float(raw.get("seconds", 0.0)),
                       raw.get("error"), float(raw.get("time", 0.0)), sums, batch)


def ledger_owner(folder: str) -> str:
    """What a ledger line of stage folder ``folder`` is sealed to (a line copied from another
    stage's ledger does not pass)."""
    return f"stages/{folder}/ledger"


# -- writing ----------------------------------------------------------------------------------

def _same_file(fd: int, path: Path) -> bool:
    """Whether the open descriptor ``fd`` is still the file at ``path``."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _end_last_line(fd: int, owner: str) -> None:
    """Before this process appends to a ledger whose last line has no newline (a ledger of
    a dead process whose pid this one reuses, ``<host>-<pid>``): end that line when it is
    whole (cut just before its newline), drop it when it is cut short (readers skip it
    anyway), so that it never glues itself to this process's first line."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(size - (1 << 16), 0)
    tail = os.pread(fd, size - start, start)
    while b"\n" not in tail and start > 0:  # a line longer than the tail read
        start = max(start - (1 << 16), 0)
        tail = os.pread(fd, size - start, start)
    cut = tail.rfind(b"\n") + 1
    try:
        whole = unseal_json(tail[cut:], owner)[1]
    except ValueError:  # not JSON, or its seal differs
        whole = False
    if whole:
        os.write(fd, b"\n")
    else:
        os.ftruncate(fd, start + cut)


class LedgerWriter:
    """Appends JSON lines to ``ledger/<host>-<pid>.jsonl``; one file per process, never shared.

    Each line is sealed (:func:`featpipe.checksums.seal_json`, owner
    :func:`ledger_owner`), written with one ``os.write`` on an ``O_APPEND`` descriptor, then
    fsynced; a last line without its newline that a dead process of the same pid left is
    ended (when whole) or dropped (when cut short) first.
    When the write fails (disk full, read-only store) the file is cut back to its previous
    length, so no partial line is left to be glued to the next one, and a
    :class:`~featpipe.errors.WriteError` names it.
    """

    #: open descriptors by (ledger folder, pid), the most recently used last; at most
    #: :data:`OPEN_AT_MOST` stay open (the least recently used is closed), so that a process
    #: that runs many stages (a library user's loop, a test suite) holds a bounded number
    _open: collections.OrderedDict[tuple[str, int], int] = collections.OrderedDict()
    OPEN_AT_MOST = 32

    @classmethod
    def append(cls, ledger_dir: Path, entry: dict) -> None:
        cls.append_lines(ledger_dir, [entry])

    @classmethod
    def append_lines(cls, ledger_dir: Path, entries: list[dict]) -> None:
        """Append ``entries``, one line each, with one ``os.write`` and one fsync (a batch's
        lines, :mod:`featpipe.store.batches`)."""
        pid = os.getpid()
        key = (str(ledger_dir), pid)
        path = ledger_dir / f"{HOST}-{pid}.jsonl"
        owner = ledger_owner(ledger_dir.parent.name)
        data = b"".join(seal_json(json.dumps(entry, ensure_ascii=False).encode(), owner)
                        + b"\n" for entry in entries)
        fd = cls._open.pop(key, None)
        if fd is not None and not _same_file(fd, path):  # its stage was removed and made anew
            os.close(fd)
            fd = None
        if fd is None:
            make_dirs(ledger_dir)
            with writing(path):
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                _end_last_line(fd, ledger_owner(ledger_dir.parent.name))
        cls._open[key] = fd
        while len(cls._open) > cls.OPEN_AT_MOST:
            os.close(cls._open.popitem(last=False)[1])
        size = os.fstat(fd).st_size
        with writing(path):
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(28, "No space left on device")
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise


def line(item_id: str, status: str, seconds: float, error: str | None,
         sums: Mapping[str, str] | None, batch: str | None = None) -> dict:
    """The ledger line of one item, stamped with the time now."""
    entry = {"id": item_id, "status": status, "seconds": round(float(seconds), 6),
             "error": error, "time": time.time()}
    if sums is not None:
        entry["sums"] = dict(sums)
    if batch is not None:
        entry["batch"] = batch
    return entry


def record(stage, item_id: str, status: str, seconds: float = 0.0, error: str | None = None,
           sums: Mapping[str, str] | None = None) -> None:
    """Append one line of ``stage``'s ledger for ``item_id`` (:data:`LEDGER_STATUSES`);
    ``sums`` holds the checksum of each file of a done item by its suffix
    (:data:`SUM_SUFFIX`)."""
    if status not in LEDGER_STATUSES:
        raise ValueError("ledger status must be 'done', 'failed' or 'removed', got "
                         f"{status!r}")
    if status == "done" and stage.checksummed and not (sums or {}).get(".npy"):
        raise ValueError("a done line of a stage written with checksums holds the "
                         "checksums of the item's files (sums)")
    stage._check_on_disk()
    LedgerWriter.append(stage.path / LEDGER_DIR, line(item_id, status, seconds, error, sums))


def record_removed(stage, ids: Iterable[str], why: str) -> None:
    """Record that the files of ``ids`` were removed (``verify --repair``): they are no
    longer done, and a rerun computes them again (one ledger write for all)."""
    stage._check_on_disk()
    lines = [line(item_id, "removed", 0.0, why, None) for item_id in ids]
    if lines:
        LedgerWriter.append_lines(stage.path / LEDGER_DIR, lines)


# -- reading ----------------------------------------------------------------------------------

def parse_line(stage, value, raw: bytes, ledger: str | None = None) -> LedgerEntry | str:
    """Ledger line ``raw`` of ``stage`` (its JSON ``value``, in ledger file ``ledger``) as an
    entry, or the reason it is not one: malformed, or damaged (its seal differs from its
    bytes, or it has none in a stage written with checksums:
    :func:`featpipe.checksums.check_seal`)."""
    entry = ledger_entry(value, stage.checksummed)
    if isinstance(entry, LedgerEntry):  # well formed: is it what was written?
        where = stage.path / LEDGER_DIR / ledger if ledger else None
        try:
            if not check_seal(raw, ledger_owner(stage.name), where) and stage.checksummed:
                return "damaged: no checksum of its own, in a stage written with checksums"
        except ChecksumError as err:
            return f"damaged ({first_line(err)})"
    return entry


def ledger_lines(stage) -> Iterator[tuple[str, int, LedgerEntry | str]]:
    """``(ledger file, line number, entry or the reason it is none)`` of every line of every
    ledger of ``stage``, a last line cut short by a killed process left out."""
    ledger_dir = stage.path / LEDGER_DIR
    if not ledger_dir.is_dir():
        return
    for path in sorted(ledger_dir.glob("*.jsonl")):
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError as err:
            yield path.name, 0, f"unreadable ({err.strerror})"
            continue
        last = len(lines) - 1  # after the final newline: empty, or a line cut short
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                entry = stage.parse_line(json.loads(raw), raw, path.name)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                if lineno - 1 == last:
                    continue  # the process was killed while writing this line
                entry = f"not JSON ({err})"
            yield path.name, lineno, entry


def problems(stage, fresh: bool = False) -> list[str]:
    """Malformed or damaged ledger lines of ``stage``, except a last line cut short by a
    killed process (from the index: the lines folded since it was written are read, not all
    of them; with ``fresh``, as ``cache verify`` reads them, every line of every ledger)."""
    if fresh:
        return [f"ledger {name} line {lineno}: {entry}"
                for name, lineno, entry in ledger_lines(stage) if isinstance(entry, str)]

    def where(problem: str) -> tuple[str, int]:
        name, _, rest = problem.removeprefix("ledger ").partition(" line ")
        return name, int(rest.partition(":")[0])

    return sorted(stage.index().problems, key=where)


def item_states(stage) -> dict[str, LedgerEntry]:
    """Latest ledger entry per item, a ``done`` entry winning over any later ``failed`` one
    (all lines read: the index is the cheap way to the same states)."""
    states: dict[str, LedgerEntry] = {}
    for entry in sorted(stage.ledger(), key=lambda e: e.time):
        previous = states.get(entry.id)
        if previous is not None and previous.status == "done" and entry.status == "failed":
            continue
        states[entry.id] = entry
    return states
