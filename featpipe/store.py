"""The artifact store: stages, keys, atomic item writes, ledgers, resume, names and models.

Layout (docs/store.md)::

    STORE/stages/<kind>-<key>/stage.json        kind, params, input keys, versions, host, created
                             /items.csv         the manifest rows this stage covers
                             /items/<2 hex>/<safe id>.npy          one array per item
                             /items/<2 hex>/<safe id>+<extra>.npy  sidecars (timestamps...)
                             /ledger/<host>-<pid>.jsonl            id, status, seconds, error
                             /models/<name>.npz + <name>.json      fitted objects
    STORE/names/<NAME>                          text: the stage folder a friendly name points to

A stage's key hashes its kind, its canonical parameter record
(:func:`featpipe.parameters.parameter_record`: declared names, defaults filled, values typed
by the declarations), the keys of its inputs and :data:`featpipe.FORMAT_VERSION`, so the
same work always lands in the same folder and a changed parameter lands in a new one.  Item
writes are atomic (temporary file in the same folder, flush, fsync, ``os.replace``); an item
counts as done only when a ledger line says so *and* its file exists, so a process killed at
any moment loses at most the items it was computing.
No pickle anywhere: arrays are ``.npy``/``.npz`` read with ``allow_pickle=False``.

A store is read defensively: a name resolves only to a stage folder of the same store, a
corrupt ``stage.json``, ledger line, item header or model is a one-line
:class:`~featpipe.errors.FeatpipeError` naming the file, and a write that fails (disk full,
read-only store) is a :class:`~featpipe.errors.WriteError` that leaves no partial ledger line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import io
import json
import math
import os
import re
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from featpipe import FORMAT_VERSION, __version__
from featpipe import index as stage_index
from featpipe.batches import BATCH_DIR, BATCH_NAME, BatchFiles, BatchWriter, commits_in_batches
from featpipe.checksums import (
    CHECKSUM,
    CHECKSUM_FORMAT,
    ChecksumError,
    DamagedItem,
    as_text,
    check,
    check_seal,
    name_checksum,
    seal_json,
    unseal_json,
)
from featpipe.errors import FeatpipeError, ItemError, ParameterError, WriteError
from featpipe.fileio import (
    HOST,
    TMP_NAME,
    atomic_save_npy,
    atomic_save_npz,
    atomic_write_bytes,
    check_npy_header,
    check_sidecar_name,
    checked_result,
    first_line,
    human_bytes,
    id_digest,
    load_npy,
    make_dirs,
    os_reason,
    process_gone,
    safe_stem,
    writing,
)
from featpipe.manifest import Manifest
from featpipe.packed import PackedItems
from featpipe.suggest import did_you_mean


def pointer_bytes(name: str, folder: str) -> bytes:
    """The content of name file ``name`` pointing to stage ``folder``: the folder, then the
    checksum of both (:func:`featpipe.checksums.name_checksum`), one line each."""
    return f"{folder}\n{name_checksum(name, folder)}\n".encode()


class DamagedName(FeatpipeError):
    """A name file (or an unfinished run's marker) that is damaged or holds no stage folder;
    ``featpipe cache verify --repair`` removes it and a re-run of the command that named the
    stage names it again."""


NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: A stage folder name, ``<kind>-<16 hex digits of its key>``: one path component, no dots.
STAGE_FOLDER = re.compile(r"^[a-z][a-z0-9-]*-[0-9a-f]{16}$")
_STAGE_FOLDER_BYTES = re.compile(STAGE_FOLDER.pattern.encode())
#: Sub-folder of a stage holding one empty file per process computing it (``<host>-<pid>``).
RUNNING_DIR = "running"
#: The file beside a model's ``.npz`` and ``.json`` that holds their checksums.
MODEL_SUMS = ".sums"
#: A stage folder without ``stage.json`` younger than this is being created, not broken.
CREATION_GRACE_S = 60.0
#: The record of a view stage (:meth:`Stage.make_view`): the input stage whose items it
#: reads and the column range it keeps; such a stage holds no arrays of its own.
VIEW_FILE = "view.json"
#: The content-hash cache of a store (:mod:`featpipe.content`), beside ``stages/`` and
#: ``names/``.
CACHE_NAME = "content-hashes.json"
_VERSIONED_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "opencv-python-headless")


def stage_key(kind: str, params: Mapping, input_keys: Iterable[str]) -> str:
    """Hash of kind, parameters (canonical JSON), input keys and the artifact-format version."""
    payload = {
        "kind": kind,
        "params": params,
        "inputs": list(input_keys),
        "format": FORMAT_VERSION,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _package_versions() -> dict[str, str]:
    versions = {"featpipe": __version__}
    for name in _VERSIONED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


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
    #: the batch file holding the item (:mod:`featpipe.batches`); None for a loose file
    batch: str | None = None


#: What a ledger line says of its item: computed, failed, or its files removed by ``cache
#: verify --repair`` (to be computed again; :mod:`featpipe.index` folds the three).
LEDGER_STATUSES = ("done", "failed", "removed")
#: The suffix that names an item's file in its ledger line's ``sums``: ``.npy`` for the
#: array, ``+NAME.npy`` for a sidecar.
SUM_SUFFIX = re.compile(r"^(\+[a-z][a-z0-9_]*)?\.npy$")
#: How far ahead of this host's clock a ledger line's time may be (another host's clock).
_CLOCK_SKEW_S = 86400.0


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        np.isfinite(value)


def _ledger_entry(raw, checksummed: bool = False) -> LedgerEntry | str:
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


def ledger_owner(folder: str) -> str:
    """What a ledger line of stage folder ``folder`` is sealed to (a line copied from another
    stage's ledger does not pass)."""
    return f"stages/{folder}/ledger"


class _LedgerWriter:
    """Appends JSON lines to ``ledger/<host>-<pid>.jsonl``; one file per process, never shared.

    Each line is sealed (:func:`featpipe.checksums.seal_json`, owner
    :func:`ledger_owner`), written with one ``os.write`` on an ``O_APPEND`` descriptor, then
    fsynced; a last line without its newline that a dead process of the same pid left is
    ended (when whole) or dropped (when cut short) first.
    When the write fails (disk full, read-only store) the file is cut back to its previous
    length, so no partial line is left to be glued to the next one, and a
    :class:`WriteError` names it.
    """

    _open: dict[tuple[str, int], int] = {}

    @classmethod
    def append(cls, ledger_dir: Path, entry: dict) -> None:
        cls.append_lines(ledger_dir, [entry])

    @classmethod
    def append_lines(cls, ledger_dir: Path, entries: list[dict]) -> None:
        """Append ``entries``, one line each, with one ``os.write`` and one fsync (a batch's
        lines, :mod:`featpipe.batches`)."""
        pid = os.getpid()
        key = (str(ledger_dir), pid)
        path = ledger_dir / f"{HOST}-{pid}.jsonl"
        owner = ledger_owner(ledger_dir.parent.name)
        data = b"".join(seal_json(json.dumps(entry, ensure_ascii=False).encode(), owner)
                        + b"\n" for entry in entries)
        fd = cls._open.get(key)
        if fd is not None and not _same_file(fd, path):  # its stage was removed and made anew
            os.close(fd)
            fd = None
        if fd is None:
            make_dirs(ledger_dir)
            with writing(path):
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                _end_last_line(fd, ledger_owner(ledger_dir.parent.name))
            cls._open[key] = fd
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


def record_owner(folder: str, name: str) -> str:
    """What a stage's record file ``name`` (``stage.json``, ``packed/pack.json``) is sealed to:
    its place in the store, so that a record copied to another stage does not pass."""
    return f"stages/{folder}/{name}"


def view_bytes(folder: str, source: str, columns: slice, extras: Iterable[str]) -> bytes:
    """The content of the :data:`VIEW_FILE` of stage folder ``folder`` that reads the columns
    ``columns`` (and the sidecars ``extras``) of stage folder ``source``: sealed to its place
    (:func:`featpipe.checksums.seal_json`); determined by the stage's key, so it is also
    written before ``stage.json``, which keeps its checksum (``files``)."""
    record = {"source": source, "columns": [int(columns.start), int(columns.stop)],
              "extras": sorted(extras)}
    return seal_json(json.dumps(record, sort_keys=True).encode() + b"\n",
                     record_owner(folder, VIEW_FILE))


#: What a damaged stage record's error says to do.
REPAIR_STAGE = ("`featpipe cache verify --repair` removes the stage (and the names pointing at "
                "it); then run the command that computed it again")


class DamagedStage(FeatpipeError):
    """A stage whose ``stage.json`` is damaged or corrupt: it cannot be opened, and what it
    computed cannot be trusted; ``featpipe cache verify --repair`` removes it."""

    def __init__(self, message: str):
        super().__init__(f"{message}; {REPAIR_STAGE}")


class DamagedRecord(FeatpipeError):
    """A record file of a stage (``items.csv``, ``read-hashes.json``) that differs from the
    checksum ``stage.json`` keeps of it, or is missing: ``featpipe cache verify --repair``
    removes it and a re-run of the stage's command writes it again."""


class Stage:
    """One stage folder: its metadata, its items, its ledger and its models."""

    def __init__(self, path: str | os.PathLike, meta: Mapping | None = None,
                 items: Manifest | None = None):
        """Open the stage folder ``path``; with ``meta`` (and ``items``) a *planned* stage that
        is not on disk (a dry run computes its key and its plan without creating it)."""
        self.path = Path(path)
        self.exists = meta is None
        self._items: Manifest | None = items
        #: a planned stage's stand-in models (a dry run's, :meth:`save_model`), by name
        self._stand_in_models: dict[str, tuple[dict, dict]] = {}
        #: what a dry run knows of a planned stage's items (featpipe.stages.dryrun)
        self.planned_items = None
        self._view: tuple[Stage, slice, tuple[str, ...]] | None = None
        if meta is None:
            meta_path = self.path / "stage.json"
            try:
                raw = meta_path.read_bytes()
                meta = json.loads(raw.decode())
            except FileNotFoundError:
                raise FeatpipeError(f"no stage at {self.path} (stage.json missing)") from None
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise DamagedStage(f"{meta_path}: corrupt stage metadata ({err})") from None
            except OSError as err:
                raise FeatpipeError(f"{meta_path}: unreadable ({err.strerror})") from None
            problem = _meta_problem(meta, self.path.name)
            if problem:
                raise DamagedStage(f"{meta_path}: corrupt stage metadata ({problem})")
            try:
                _, sealed = unseal_json(raw, record_owner(self.path.name, "stage.json"),
                                        meta_path)
            except ChecksumError as err:
                raise DamagedStage(f"{meta_path}: damaged stage metadata ({err})") from None
            if not sealed and "checksums" in meta:
                raise DamagedStage(f"{meta_path}: damaged stage metadata (its checksum is "
                                   "missing, and it was written with checksums)")
            meta.pop("crc32", None)
        self.meta = dict(meta)
        if self.exists:  # a view's record is part of the stage's own: damage is found here
            self._view_record()

    # -- identity ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def name(self) -> str:
        """The folder name ``<kind>-<key>``, which identifies the stage inside its store."""
        return self.path.name

    @property
    def params(self) -> dict:
        return self.meta["params"]

    @property
    def checksummed(self) -> bool:
        """Whether the stage was written with checksums of every file
        (:data:`featpipe.checksums.CHECKSUM_FORMAT`): then a missing checksum is damage."""
        return isinstance(self.meta.get("checksums"), int) and \
            self.meta["checksums"] >= CHECKSUM_FORMAT

    @property
    def input_names(self) -> list[str]:
        """Folder names (``kind-key``) of the stages this one was computed from."""
        return list(self.meta.get("inputs", []))

    @property
    def store(self) -> Store:
        return Store(self.path.parent.parent)

    def inputs(self) -> list[Stage]:
        return [self.store.stage_by_folder(name) for name in self.input_names]

    def __repr__(self) -> str:
        return f"Stage({self.name!r})"

    def _check_on_disk(self) -> None:
        if not self.exists:
            raise FeatpipeError(f"stage {self.name} is only planned (a dry run); nothing is "
                                "written to it")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stage) and other.path.resolve() == self.path.resolve()

    def __hash__(self) -> int:
        return hash(str(self.path.resolve()))

    # -- items ------------------------------------------------------------------------------
    @property
    def items(self) -> Manifest:
        """The manifest rows (ids, labels, splits) this stage covers; empty for model stages."""
        if self._items is None:
            path = self.path / "items.csv"
            raw = self.read_record("items.csv")
            if raw is None:
                self._items = Manifest([], root=self.path)
            else:
                try:
                    text = raw.decode()
                except UnicodeDecodeError as err:
                    raise FeatpipeError(f"manifest {path} is not UTF-8 ({err.reason})") \
                        from None
                self._items, problems = Manifest.parse(text, self.path, str(path))
                if problems:
                    raise FeatpipeError(f"manifest {path}, {problems[0]}")
        return self._items

    def read_record(self, name: str) -> bytes | None:
        """The bytes of record file ``name`` (``items.csv``, ``read-hashes.json``), checked
        against the checksum ``stage.json`` keeps of it; None when there is neither the file
        nor a checksum of it.  A damaged or missing record is a :class:`DamagedRecord`."""
        path = self.path / name
        expected = (self.meta.get("files") or {}).get(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if expected is None:
                return None
            raise DamagedRecord(f"stage {self.name}: {path} is missing; a re-run of the "
                                "stage's command writes it again") from None
        except OSError as err:
            raise FeatpipeError(f"stage {self.name}: {path} is unreadable "
                                f"({os_reason(err)})") from None
        try:
            check(path, as_text(zlib.crc32(raw)), expected)
        except ChecksumError as err:
            raise DamagedRecord(f"stage {self.name}: damaged: {err}; `featpipe cache verify "
                                "--repair` removes it and a re-run of the stage's command "
                                "writes it again") from None
        return raw

    def restore_records(self, records: Mapping[str, bytes]) -> None:
        """Write again the record files of ``records`` that are missing (``verify --repair``
        removed them) when their bytes are those ``stage.json`` keeps the checksum of; a
        record of other bytes is an error (an ``items.csv`` whose item paths moved)."""
        expected = self.meta.get("files") or {}
        for name, data in records.items():
            path = self.path / name
            if path.exists() or name not in expected:
                continue
            if as_text(zlib.crc32(data)) != expected[name]:
                raise FeatpipeError(f"stage {self.name}: {path} is missing and this run would "
                                    "write other bytes than it held (item paths that moved?); "
                                    f"remove the stage (`featpipe cache rm {self.name}`) and "
                                    "run the command again")
            atomic_write_bytes(path, data)

    @property
    def n_items(self) -> int:
        """How many items the stage covers (``stage.json`` says, without reading items.csv)."""
        n_items = self.meta.get("n_items")
        return n_items if isinstance(n_items, int) and n_items >= 0 else len(self.items)

    @property
    def is_model_stage(self) -> bool:
        """A fit stage: it covers no items and holds models (once fitted)."""
        return not self.n_items

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta.get("dtype", "float32"))

    def item_path(self, item_id: str, extra: str | None = None) -> Path:
        stem = safe_stem(item_id)
        suffix = f"+{extra}.npy" if extra else ".npy"
        return self.path / "items" / id_digest(item_id)[:2] / f"{stem}{suffix}"

    def write_item(
        self,
        item_id: str,
        array: np.ndarray,
        extras: Mapping[str, np.ndarray] | None = None,
        seconds: float = 0.0,
    ) -> Path:
        """Write one item atomically and record it as done in this process's ledger.

        Floating arrays are cast to the stage dtype (float32 unless the stage says otherwise).
        A non-finite value is refused: a silently wrong number must never reach the disk.
        Sidecars in ``extras`` (timestamps, positions) are written first, the main array last,
        so the main file is the commit point.
        """
        self._check_on_disk()
        array = checked_result(item_id, array, self.dtype)
        target = self.item_path(item_id)
        make_dirs(target.parent)
        sums = {}
        for extra, values in (extras or {}).items():
            check_sidecar_name(extra)
            sums[f"+{extra}.npy"] = atomic_save_npy(self.item_path(item_id, extra),
                                                   np.asarray(values))
        sums[".npy"] = atomic_save_npy(target, array)
        self.record(item_id, "done", seconds=seconds, sums=sums)
        return target

    def record(self, item_id: str, status: str, seconds: float = 0.0, error: str | None = None,
               sums: Mapping[str, str] | None = None):
        """Append one ledger line for ``item_id`` (``done``, ``failed`` or ``removed``:
        :data:`LEDGER_STATUSES`); ``sums`` holds the checksum of each file of a done item by
        its suffix (:data:`SUM_SUFFIX`)."""
        if status not in LEDGER_STATUSES:
            raise ValueError("ledger status must be 'done', 'failed' or 'removed', got "
                             f"{status!r}")
        if status == "done" and self.checksummed and not (sums or {}).get(".npy"):
            raise ValueError("a done line of a stage written with checksums holds the "
                             "checksums of the item's files (sums)")
        self._check_on_disk()
        _LedgerWriter.append(self.path / "ledger", self._line(item_id, status, seconds, error,
                                                              sums))

    @staticmethod
    def _line(item_id: str, status: str, seconds: float, error: str | None,
              sums: Mapping[str, str] | None, batch: str | None = None) -> dict:
        entry = {"id": item_id, "status": status, "seconds": round(float(seconds), 6),
                 "error": error, "time": time.time()}
        if sums is not None:
            entry["sums"] = dict(sums)
        if batch is not None:
            entry["batch"] = batch
        return entry

    def record_removed(self, ids: Iterable[str], why: str) -> None:
        """Record that the files of ``ids`` were removed (``verify --repair``): they are no
        longer done, and a rerun computes them again (one ledger write for all)."""
        self._check_on_disk()
        lines = [self._line(item_id, "removed", 0.0, why, None) for item_id in ids]
        if lines:
            _LedgerWriter.append_lines(self.path / "ledger", lines)

    def batch_writer(self) -> BatchWriter | None:
        """A writer committing a chunk of small items together (:mod:`featpipe.batches`),
        or None when this stage writes each item to its own file."""
        self._check_on_disk()
        if not commits_in_batches(self.n_items):
            return None
        ledger = self.path / "ledger"
        return BatchWriter(self.path / BATCH_DIR, self.dtype, self._line,
                           lambda lines: _LedgerWriter.append_lines(ledger, lines))

    def ledger(self) -> Iterator[LedgerEntry]:
        """All ledger lines of all processes; a line cut short by a killed process is skipped."""
        for _, entry in self.ledger_with_source():
            yield entry

    def ledger_with_source(self) -> Iterator[tuple[str, LedgerEntry]]:
        """Like :meth:`ledger`, each line with the name of its ledger file (one per process).

        Malformed lines are skipped (an item whose only done line is malformed counts as not
        done and is recomputed); :meth:`ledger_problems` lists them.
        """
        for name, _, entry in self._ledger_lines():
            if isinstance(entry, LedgerEntry):
                yield name, entry

    def ledger_problems(self, fresh: bool = False) -> list[str]:
        """Malformed or damaged ledger lines, except a last line cut short by a killed
        process (from the index: the lines folded since it was written are read, not all of
        them; with ``fresh``, as ``cache verify`` reads them, every line of every ledger)."""
        if fresh:
            return [f"ledger {name} line {lineno}: {entry}"
                    for name, lineno, entry in self._ledger_lines() if isinstance(entry, str)]

        def where(problem: str) -> tuple[str, int]:
            name, _, rest = problem.removeprefix("ledger ").partition(" line ")
            return name, int(rest.partition(":")[0])

        return sorted(self.index().problems, key=where)

    def parse_line(self, value, line: bytes, ledger: str | None = None) -> LedgerEntry | str:
        """Ledger line ``line`` (its JSON ``value``, in ledger file ``ledger``) as an entry,
        or the reason it is not one: malformed, or damaged (its seal differs from its bytes,
        or it has none in a stage written with checksums:
        :func:`featpipe.checksums.check_seal`)."""
        entry = _ledger_entry(value, self.checksummed)
        if isinstance(entry, LedgerEntry):  # well formed: is it what was written?
            where = self.path / "ledger" / ledger if ledger else None
            try:
                if not check_seal(line, ledger_owner(self.name), where) and self.checksummed:
                    return "damaged: no checksum of its own, in a stage written with checksums"
            except ChecksumError as err:
                return f"damaged ({first_line(err)})"
        return entry

    def _ledger_lines(self) -> Iterator[tuple[str, int, LedgerEntry | str]]:
        ledger_dir = self.path / "ledger"
        if not ledger_dir.is_dir():
            return
        for path in sorted(ledger_dir.glob("*.jsonl")):
            try:
                lines = path.read_bytes().split(b"\n")
            except OSError as err:
                yield path.name, 0, f"unreadable ({err.strerror})"
                continue
            last = len(lines) - 1  # after the final newline: empty, or a line cut short
            for lineno, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    entry = self.parse_line(json.loads(line), line, path.name)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    if lineno - 1 == last:
                        continue  # the process was killed while writing this line
                    entry = f"not JSON ({err})"
                yield path.name, lineno, entry

    def item_states(self) -> dict[str, LedgerEntry]:
        """Latest ledger entry per item, a ``done`` entry winning over any later ``failed``
        one (all lines read: :meth:`index` is the cheap way to the same states)."""
        states: dict[str, LedgerEntry] = {}
        for entry in sorted(self.ledger(), key=lambda e: e.time):
            previous = states.get(entry.id)
            if previous is not None and previous.status == "done" and entry.status == "failed":
                continue
            states[entry.id] = entry
        return states

    def index(self, need_table: bool = False, trust: bool = True) -> stage_index.Index:
        """The stage's ledgers folded (:mod:`featpipe.index`): counts and failed items in
        O(ledgers) when the index on disk is current, the table of item states with
        ``need_table``; without ``trust``, every ledger folded again (``cache verify``)."""
        return stage_index.load(self.path, self.parse_line, need_table, trust=trust)

    def index_problems(self) -> list[str]:
        """What is wrong with the index on disk (:func:`featpipe.index.problems`)."""
        return stage_index.problems(self.path, self.parse_line)

    def compact_index(self) -> bool:
        """Write the index when the ledgers hold lines it lacks (runs call this)."""
        return self.exists and stage_index.compact(self.path, self.parse_line)

    # -- views ------------------------------------------------------------------------------
    def make_view(self, source: Stage, columns: slice, extras: Iterable[str]) -> None:
        """Make this stage a view of ``source`` (one of its inputs): its items are the columns
        ``columns`` of ``source``'s (the last axis), with the sidecars ``extras`` of each;
        nothing is copied (:data:`VIEW_FILE`).  A stage that existed before (its source was
        not stored yet) gets the view's checksum added to ``stage.json`` after the view is
        written, so that a view record deleted later is damage, as for a view made with its
        stage; the record is determined by the key, so concurrent writers agree."""
        self._check_on_disk()
        if source.name not in self.input_names:
            raise FeatpipeError(f"stage {self.name} cannot be a view of {source.name}, which "
                                "is not its input")
        data = view_bytes(self.name, source.name, columns, extras)
        files = self.meta.get("files") or {}
        if files.get(VIEW_FILE) == as_text(zlib.crc32(data)):
            return
        atomic_write_bytes(self.path / VIEW_FILE, data)
        meta = dict(self.meta, files=dict(files, **{VIEW_FILE: as_text(zlib.crc32(data))}))
        text = json.dumps(meta, indent=2, sort_keys=True).encode() + b"\n"
        atomic_write_bytes(self.path / "stage.json",
                           seal_json(text, record_owner(self.name, "stage.json")))
        self.meta = meta

    def _view_record(self) -> dict | None:
        """The record in :data:`VIEW_FILE` (None: not a view), checked against the checksum
        ``stage.json`` keeps of it (``files``) and against its own seal; a view record that
        is damaged, missing (``stage.json`` has its checksum) or not one of this stage is a
        :class:`DamagedStage`: part of the stage's own record."""
        path = self.path / VIEW_FILE
        try:
            raw = self.read_record(VIEW_FILE)
        except DamagedRecord as err:  # missing, or not the bytes stage.json keeps the sum of
            raise DamagedStage(f"{path}: damaged view record ({first_line(err)})") from None
        if raw is None:
            return None
        try:
            record, sealed = unseal_json(raw, record_owner(self.name, VIEW_FILE), path)
        except ChecksumError as err:
            raise DamagedStage(f"{path}: damaged view record ({first_line(err)})") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise DamagedStage(f"{path}: corrupt view record ({first_line(err)})") from None
        if not sealed and self.checksummed:
            raise DamagedStage(f"{path}: damaged view record (its checksum is missing, and "
                               "the stage was written with checksums)")
        if not (isinstance(record, dict) and record.get("source") in self.input_names
                and isinstance(record.get("columns"), list) and len(record["columns"]) == 2
                and all(isinstance(c, int) and c >= 0 for c in record["columns"])
                and isinstance(record.get("extras"), list)):
            raise DamagedStage(f"{path}: corrupt view record (not one of this stage: an "
                               "input stage, two column bounds, the sidecars kept)")
        if not (self.path.parent / record["source"] / "stage.json").is_file():
            raise DamagedStage(f"{path}: a view of stage {record['source']}, which is gone "
                               "(its items were read from there)")
        return record

    def view(self) -> tuple[Stage, slice, tuple[str, ...]] | None:
        """``(source stage, columns, sidecars kept)`` of a view stage, else None."""
        if self._view is None and self.exists:
            record = self._view_record()
            if record is None:
                return None
            start, stop = record["columns"]
            self._view = (self.store.stage_by_folder(record["source"]), slice(start, stop),
                          tuple(str(e) for e in record["extras"]))
        return self._view

    def done_ids(self) -> set[str]:
        """Items whose ledger says done and whose file exists (resume trusts both); a view's,
        those of its source.

        An item packed by ``featpipe cache pack`` counts as existing, and so does one in a
        batch file that exists (:mod:`featpipe.batches`).
        """
        view = self.view()
        if view is not None:
            return view[0].done_ids() & set(self.items.ids)
        packed = self.packed()
        packed_ids = packed.ids() if packed is not None else frozenset()
        table = self.item_table()
        batches: dict[str, bool] = {}

        def exists(item_id: str, batch: str | None) -> bool:
            if batch is not None:
                if batch not in batches:
                    batches[batch] = (self.path / BATCH_DIR / batch).exists()
                if batches[batch]:
                    return True
            return item_id in packed_ids or self.item_path(item_id).exists()

        return {item_id for item_id, batch in table.done_items() if exists(item_id, batch)}

    def truncated_ids(self, ids: Iterable[str]) -> set[str]:
        """Of ``ids``, the items whose loose file holds less data than its ``.npy`` header
        declares (cut short by a failing disk or a copy: ``cache verify`` reports them), so
        that a rerun recomputes them; one header read per item, no array is loaded (none for
        the items of batch files, whose every read is checked against its checksum); a
        view's, those of its source."""
        view = self.view()
        if view is not None:
            return view[0].truncated_ids(ids)
        table = self.item_table()
        loose = {item_id for item_id, batch in table.done_items() if batch is None}
        found = set()
        for item_id in (i for i in ids if i in loose):
            try:
                with open(self.item_path(item_id), "rb") as handle:
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

    def packed(self):
        """The :class:`featpipe.packed.PackedItems` of this stage, or ``None`` if not packed."""
        return PackedItems.open(self.path, self.checksummed)

    def failed(self) -> dict[str, str]:
        """Items whose latest state is failed, with their recorded error (a done line, in
        any ledger, makes an item done for good); a view's, those of its source."""
        view = self.view()
        if view is not None:
            return {i: e for i, e in view[0].failed().items() if i in set(self.items.ids)}
        return dict(self.index().failed)

    def is_complete(self) -> bool:
        return set(self.items.ids) <= self.done_ids()

    def read_item(self, item_id: str, mmap: bool = False) -> np.ndarray:
        """Load one item's array (``allow_pickle=False``); packed items are read from HDF5.

        The header is checked against the file size first: a corrupt header is an
        :class:`ItemError` naming the item, never a MemoryError.  A view's item is read from
        its source (checked there) and its columns copied, as its method would have stored
        them.
        """
        view = self.view()
        if view is not None:
            source, columns, _ = view
            array = source.read_item(item_id)
            if array.shape[-1] < columns.stop:
                raise ItemError(item_id, f"{array.shape[-1]} columns in {source.name}, the "
                                         f"view {self.name} takes {columns.start}..."
                                         f"{columns.stop - 1}")
            return np.ascontiguousarray(array[..., columns], dtype=self.dtype)
        path = self.item_path(item_id)
        try:
            return self._read_file(item_id, ".npy", path, mmap)
        except FileNotFoundError:
            array = self._read_batched(item_id, ".npy")
            if array is not None:
                return array
            packed = self.packed()
            array = packed.read(item_id) if packed is not None else None
            if array is not None:
                return array
            raise ItemError(item_id, f"not computed in stage {self.name}") from None

    def batch_of(self, item_id: str, reload: bool = False) -> Path | None:
        """The batch file the ledger says holds done item ``item_id`` (it may be gone), or
        None for an item of its own file (:mod:`featpipe.batches`)."""
        state = self._state(item_id, reload)
        batch = state.batch if state is not None and state.status == "done" else None
        return None if batch is None else self.path / BATCH_DIR / batch

    def _read_batched(self, item_id: str, suffix: str) -> np.ndarray | None:
        """The file ``suffix`` of ``item_id`` from its batch file, checked against its
        recorded checksum; None when the item is in none (or its batch file is gone).  A
        batch file that is gone or damaged is looked up once more in a fresh read of the
        ledgers (the item may have been recomputed since, into another batch)."""
        path = self.batch_of(item_id)
        if path is None:
            return None
        try:
            return self._load_batched(item_id, suffix, path)
        except (FileNotFoundError, DamagedItem):
            fresh = self.batch_of(item_id, reload=True)
            if fresh is not None and fresh != path:
                return self._read_batched(item_id, suffix)
            if fresh is None or not fresh.exists():
                return None
            raise

    def _load_batched(self, item_id: str, suffix: str, path: Path) -> np.ndarray | None:
        member = safe_stem(item_id) + suffix
        try:
            return BatchFiles.load(path, member, (self.recorded_sums(item_id) or {}).get(suffix))
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

    def read_extra(self, item_id: str, extra: str) -> np.ndarray | None:
        """Load a sidecar (``timestamps``, ``positions``...) or ``None`` when there is none."""
        view = self.view()
        if view is not None:
            return view[0].read_extra(item_id, extra) if extra in view[2] else None
        path = self.item_path(item_id, extra)
        if not path.exists():
            if self.item_path(item_id).exists():
                return None
            batch = self.batch_of(item_id)
            if batch is not None and batch.exists():
                return self._read_batched(item_id, f"+{extra}.npy")
            packed = self.packed()
            return packed.extras(item_id).get(extra) if packed is not None else None
        return self._read_file(item_id, f"+{extra}.npy", path)

    def extras_of(self, item_id: str) -> dict[str, np.ndarray]:
        """All sidecars of one item, by name."""
        view = self.view()
        if view is not None:
            return {k: v for k, v in view[0].extras_of(item_id).items() if k in view[2]}
        prefix = safe_stem(item_id) + "+"
        folder = self.item_path(item_id).parent
        loose = self.item_path(item_id).exists()
        batch = None if loose else self.batch_of(item_id)
        if batch is not None and batch.exists():
            try:
                names = BatchFiles.sidecars(batch, prefix[:-1])
            except (OSError, ValueError, zipfile.BadZipFile) as err:
                raise ItemError(item_id, f"unreadable batch file {batch}: "
                                         f"{first_line(err)}") from None
            return {name: self._read_batched(item_id, f"+{name}.npy") for name in names}
        packed = None if loose else self.packed()
        found = packed.extras(item_id) if packed is not None else {}
        if folder.is_dir():
            for path in folder.glob(f"{prefix}*.npy"):
                found[path.name[len(prefix):-4]] = self._read_file(
                    item_id, path.name[len(prefix) - 1:], path)
        return found

    #: the item states of the index (:mod:`featpipe.index`), per stage folder, read once per
    #: process (see :meth:`recorded_sums`)
    _tables: dict[str, stage_index.Table] = {}

    def _state(self, item_id: str, reload: bool = False) -> stage_index.ItemState | None:
        """The folded ledger state of ``item_id``: the index's table is read once per
        process and stage, again when ``reload`` or the item is not in it."""
        table = Stage._tables.get(str(self.path))
        state = None if table is None or reload else table.get(item_id)
        return self.item_table().get(item_id) if state is None else state

    def item_table(self, fresh: bool = False) -> stage_index.Table:
        """The item states of the stage's ledgers as they are now (:mod:`featpipe.index`),
        kept for this process's later reads of the stage's items; with ``fresh``, folded from
        every ledger line, the index on disk not trusted (``cache verify``)."""
        table = self.index(need_table=True, trust=not fresh).table
        Stage._tables[str(self.path)] = table
        return table

    def recorded_sums(self, item_id: str, reload: bool = False) -> dict[str, str] | None:
        """The checksums the ledger recorded for the files of done item ``item_id`` (by
        suffix), or None (not done, or done before featpipe kept checksums)."""
        state = self._state(item_id, reload)
        return state.sums if state is not None and state.status == "done" else None

    def _read_file(self, item_id: str, suffix: str, path: Path, mmap: bool = False
                   ) -> np.ndarray:
        """One file of an item, checked against its recorded checksum (not when memory-mapped:
        only the rows used are read); a mismatch is checked once more against a fresh read of
        the ledger (the item may have been recomputed since), then is a :class:`DamagedItem`.
        In a stage written with checksums a file no done ledger line sums is never read."""
        sums = self.recorded_sums(item_id)
        if self.checksummed and suffix not in (sums or {}):  # recomputed since? read again
            sums = self.recorded_sums(item_id, reload=True)
            if sums is None:
                raise ItemError(item_id, f"not computed in stage {self.name}: no ledger line "
                                         f"says it is done, so {path} is not used (`featpipe "
                                         "cache verify` names a damaged ledger)")
            if suffix not in sums:
                raise DamagedItem(item_id, ChecksumError(
                    f"{path}: no checksum of it in the item's ledger line (a file put there "
                    "by hand, or a damaged line)"))
        try:
            return _load_item_file(item_id, path, mmap, None if mmap else
                                   (sums or {}).get(suffix))
        except DamagedItem:
            fresh = self.recorded_sums(item_id, reload=True)
            if fresh == sums:
                raise
            return _load_item_file(item_id, path, mmap, (fresh or {}).get(suffix))

    # -- processes computing it --------------------------------------------------------------
    #: marker path -> the open file whose ``fcntl.flock`` says this process computes the stage
    _held: dict[str, object] = {}

    def mark_running(self) -> None:
        """Record this process as computing the stage (``running/<host>-<pid>``, held with
        ``fcntl.flock``, which the kernel drops when the process dies), until
        :meth:`unmark_running`; ``cache gc`` keeps a stage (and its inputs) while such a
        process lives.  The markers this host's dead processes left are removed."""
        self._check_on_disk()
        folder = self.path / RUNNING_DIR
        make_dirs(folder)
        for stale in folder.iterdir():
            if _marker_alive(stale) is False:
                with contextlib.suppress(OSError):
                    stale.unlink()
        marker = folder / f"{HOST}-{os.getpid()}"
        if str(marker) in Stage._held and marker.exists():
            return  # marked (and locked) already by this process
        with writing(marker):
            handle = open(marker, "a+b")  # noqa: SIM115 - held until unmark_running
        with contextlib.suppress(OSError):
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        previous = Stage._held.pop(str(marker), None)
        if previous is not None:
            previous.close()
        Stage._held[str(marker)] = handle

    def unmark_running(self) -> None:
        marker = self.path / RUNNING_DIR / f"{HOST}-{os.getpid()}"
        with contextlib.suppress(OSError):
            marker.unlink()
        handle = Stage._held.pop(str(marker), None)
        if handle is not None:
            handle.close()

    def running_processes(self, max_age_s: float = 86400.0) -> list[str]:
        """``host-pid`` of the processes computing this stage now: a marker of this host whose
        lock is held (its process lives), or one of another host touched in the last
        ``max_age_s`` seconds (its process cannot be checked from here); a marker left by a
        killed process is stale."""
        folder = self.path / RUNNING_DIR
        if not folder.is_dir():
            return []
        live = []
        for marker in sorted(folder.iterdir()):
            try:
                age = time.time() - marker.stat().st_mtime
            except OSError:
                continue
            alive = _marker_alive(marker)
            if alive or (alive is None and age < max_age_s):
                live.append(marker.name)
        return live

    @contextlib.contextmanager
    def exclusive(self, label: str, waiting: Callable[[], None]) -> Iterator[None]:
        """Hold this stage's lock ``locks/<label>`` (``fcntl.flock``) while the block runs:
        a second identical run (same stage, same shard) waits for the first, calling
        ``waiting()`` first (which may raise instead, to refuse), then finds its items done.
        The kernel drops the lock when its process dies, so a killed run leaves no stale lock.
        Where the file system has no locks (some network file systems) the block runs
        unlocked."""
        import fcntl

        self._check_on_disk()
        self.store.check_writable()
        make_dirs(self.path / "locks")
        with writing(self.path / "locks" / label):
            handle = open(self.path / "locks" / label, "a+b")  # noqa: SIM115 - held below
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waiting()
                fcntl.flock(handle, fcntl.LOCK_EX)
            except OSError:
                pass  # no locking here: the ledger still keeps two runs correct
            yield
        finally:
            handle.close()

    # -- models -----------------------------------------------------------------------------
    #: planned stages given stand-in models by a dry run of this process, by folder
    _stand_ins: dict[str, Stage] = {}

    @classmethod
    def at(cls, path: str | os.PathLike) -> Stage:
        """The stage in folder ``path``; in a dry run, the planned stage there that holds
        stand-in models (:meth:`save_model`), so that later steps plan on them."""
        return cls._stand_ins.get(str(path)) or cls(path)

    def save_model(self, name: str, model, meta: Mapping | None = None) -> None:
        """Save a fitted model as ``models/<name>.npz`` (arrays) + ``models/<name>.json``, then
        the checksums of both in ``models/<name>.sums`` (:data:`MODEL_SUMS`).

        ``model`` follows :mod:`featpipe.models` (``to_arrays() -> (arrays, meta)``, and
        ``meta`` is added to its metadata) or is a dict of arrays.  A planned stage (a dry
        run) keeps it in memory instead: a stand-in of the model's shapes, which later steps
        of the dry run are planned and sized on (:meth:`at`); nothing is written.
        """
        arrays, own = model.to_arrays() if hasattr(model, "to_arrays") else (model, {})
        meta = {**own, **(meta or {})}
        if not self.exists:
            arrays = {k: np.asarray(v) for k, v in arrays.items()}
            self._stand_in_models[name] = (arrays, json.loads(json.dumps(
                dict(meta), default=_json_default)))
            Stage._stand_ins[str(self.path)] = self
            return
        self._check_on_disk()
        folder = self.path / "models"
        make_dirs(folder)
        sums = {".npz": atomic_save_npz(folder / f"{name}.npz", arrays, checksum=True)}
        data = json.dumps(dict(meta), indent=2, sort_keys=True,
                          default=_json_default).encode("utf-8")
        atomic_write_bytes(folder / f"{name}.json", data)
        sums[".json"] = as_text(zlib.crc32(data))
        atomic_write_bytes(folder / f"{name}{MODEL_SUMS}", json.dumps(sums).encode("utf-8"))

    def model_sums(self, name: str) -> dict[str, str] | None:
        """The checksums of model ``name``'s files by suffix (``.npz``, ``.json``), or None
        for a model saved before featpipe kept them; damaged sums are an error naming them."""
        path = self.path / "models" / f"{name}{MODEL_SUMS}"
        try:
            sums = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if self.checksummed:
                raise FeatpipeError(f"model {name!r} of stage {self.name} is damaged: {path} "
                                    "is missing, and the stage was written with checksums; "
                                    "`featpipe cache verify --repair` removes the model and a "
                                    "re-run of the fit recomputes it") from None
            return None
        except (OSError, ValueError) as err:
            raise FeatpipeError(f"model {name!r} of stage {self.name}: {path} is unreadable "
                                f"({first_line(err)})") from None
        if not isinstance(sums, dict) or set(sums) != {".npz", ".json"} or not all(
                isinstance(v, str) and CHECKSUM.match(v) for v in sums.values()):
            raise FeatpipeError(f"model {name!r} of stage {self.name}: {path} does not hold the "
                                "checksums of the .npz and .json files")
        return sums

    def load_model(self, name: str, cls=None):
        """``(arrays, meta)`` of model ``name``, or ``cls.from_arrays(arrays, meta)``; a damaged
        model is one error line (an object array is refused, never unpickled)."""
        if not self.exists:
            if name not in self._stand_in_models:
                raise FeatpipeError(f"stage {self.name} has no model {name!r} (not fitted "
                                    "yet?)")
            arrays, meta = self._stand_in_models[name]
            return (dict(arrays), dict(meta)) if cls is None else cls.from_arrays(arrays, meta)
        folder = self.path / "models"
        path = folder / f"{name}.npz"
        sums = self.model_sums(name) or {}
        try:
            raw = path.read_bytes()  # read once: summed, then parsed
            check(path, as_text(zlib.crc32(raw)), sums.get(".npz"))
            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                arrays = {}
                for key in data.files:
                    try:
                        arrays[key] = data[key]
                    except ValueError as err:
                        reason = ("an object array (featpipe never unpickles)"
                                  if "allow_pickle" in str(err) else str(err))
                        raise FeatpipeError(f"model {name!r} of stage {self.name}: array "
                                            f"{key!r} in {path} is {reason}") from None
            path = folder / f"{name}.json"
            raw = path.read_bytes()
            check(path, as_text(zlib.crc32(raw)), sums.get(".json"))
            meta = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise FeatpipeError(f"stage {self.name} has no model {name!r} (not fitted yet?)") \
                from None
        except ChecksumError as err:
            raise FeatpipeError(f"model {name!r} of stage {self.name} is damaged: {err}; "
                                "`featpipe cache verify --repair` removes it and a re-run of "
                                "the fit recomputes it") from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, MemoryError) as err:
            raise FeatpipeError(f"model {name!r} of stage {self.name}: {path} is unreadable "
                                f"({first_line(err)})") from None
        if not isinstance(meta, dict):
            raise FeatpipeError(f"model {name!r} of stage {self.name}: {path} is not a JSON "
                                "object")
        return (arrays, meta) if cls is None else cls.from_arrays(arrays, meta)

    def model_names(self) -> list[str]:
        """Names of the models this stage holds (fit stages), whole or in part (a file of a
        model missing is damage ``verify`` reports); a planned stage's, its stand-ins."""
        if not self.exists:
            return sorted(self._stand_in_models)
        folder = self.path / "models"
        if not folder.is_dir():
            return []
        return sorted({p.name.removesuffix(suffix) for suffix in (".npz", ".json", MODEL_SUMS)
                       for p in folder.glob(f"*{suffix}")})

    def has_model(self, name: str) -> bool:
        """Whether model ``name`` is saved: its ``.npz`` and ``.json`` are in place and, in a
        stage written with checksums, its checksums (written last: the commit point); a
        planned stage's, whether it holds a stand-in."""
        if not self.exists:
            return name in self._stand_in_models
        folder = self.path / "models"
        return (folder / f"{name}.npz").exists() and (folder / f"{name}.json").exists() and \
            (not self.checksummed or (folder / f"{name}{MODEL_SUMS}").exists())


def _meta_problem(meta, folder: str) -> str | None:
    """Why ``stage.json`` content is not a stage's metadata, or ``None``."""
    if not isinstance(meta, dict):
        return f"not a JSON object but {type(meta).__name__}"
    for key, kind in (("kind", str), ("key", str), ("params", dict), ("inputs", list)):
        if not isinstance(meta.get(key), kind):
            return f"{key!r} missing or not a {kind.__name__}"
    if not all(isinstance(name, str) and STAGE_FOLDER.match(name) for name in meta["inputs"]):
        return "'inputs' must list stage folders (kind-key)"
    if f"{meta['kind']}-{meta['key']}" != folder:
        return f"it describes {meta['kind']}-{meta['key']}, not the folder {folder}"
    try:
        if np.dtype(meta.get("dtype", "float32")).kind != "f":
            raise TypeError
    except TypeError:
        return f"'dtype' must be a floating dtype, got {meta.get('dtype')!r}"
    return None


def _marker_alive(marker: Path) -> bool | None:
    """Whether the process of a ``running/<host>-<pid>`` marker lives: on this host, whether
    its ``flock`` is held (the kernel drops it at the process's death, whatever reuses the
    pid); ``None`` for another host's marker (not known from here)."""
    import fcntl

    host, _, pid = marker.name.rpartition("-")
    if not pid.isdigit():
        return False
    if host != HOST:
        return None
    if int(pid) == os.getpid():
        return str(marker) in Stage._held
    try:
        with open(marker, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False
    except OSError:  # no locks on this file system: ask whether the pid lives
        return not process_gone(host, int(pid))
    return False


#: Bytes read to check an item's size against its header (featpipe's own headers are 128).
NPY_HEAD_BYTES = 4096


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


def _load_item_file(item_id: str, path: Path, mmap: bool = False,
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


def is_store(path: Path) -> bool:
    """Whether folder ``path`` holds a featpipe store: a ``stages/`` folder with a stage
    folder in it, a ``names/`` folder with a name file, or the content-hash cache."""
    def points_to_stage(name_file: Path) -> bool:
        with open(name_file, "rb") as handle:
            return bool(_STAGE_FOLDER_BYTES.match(handle.read(200).split(b"\n")[0]))

    try:
        if (path / CACHE_NAME).is_file():
            return True
        stages, names = path / "stages", path / "names"
        if stages.is_dir() and any(STAGE_FOLDER.match(p.name.split(".")[0])
                                   for p in stages.iterdir()):
            return True
        return names.is_dir() and any(p.is_file() and points_to_stage(p)
                                      for p in names.iterdir())
    except OSError:
        return False


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class Store:
    """A folder of stages plus friendly names pointing at them."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        #: names a dry run of several steps plans (``featpipe run --dry-run``): each resolves
        #: to the stage planned for it, not to what the name points to on disk now
        self.planned: dict[str, Stage] = {}

    @property
    def stages_dir(self) -> Path:
        return self.root / "stages"

    @property
    def names_dir(self) -> Path:
        return self.root / "names"

    def stage(
        self,
        kind: str,
        params: Mapping,
        inputs: Iterable[Stage] = (),
        items: Manifest | None = None,
        dtype: str = "float32",
        create: bool = True,
        records: Mapping[str, bytes] | None = None,
    ) -> Stage:
        """Open the stage for (kind, params, inputs), creating it exclusively if it is new.

        ``items`` are the manifest rows the stage covers (default: those of its first input),
        written as ``items.csv``; ``records`` are other files of the stage that its key
        determines (``read-hashes.json``).  Both are written before ``stage.json``, which keeps
        their checksums (``files``) and the checksum rules the stage is written with
        (``checksums``) and is sealed (:func:`featpipe.checksums.seal_json`); an existing
        stage gets back those of them ``verify --repair`` removed (:meth:`Stage.restore_records`).
        Creation is race-free: ``stage.json`` is written to a temporary file and hard-linked
        into place, which fails if another process got there first.  With ``create=False``
        (a dry run) a new stage is only planned: its key and items, nothing on disk.
        """
        if not re.fullmatch(r"[a-z][a-z0-9-]*", kind):
            raise ValueError(f"stage kind {kind!r} must match [a-z][a-z0-9-]*")
        inputs = list(inputs)
        params = json.loads(json.dumps(dict(params), default=_json_default))
        key_params = dict(params, dtype=dtype) if dtype != "float32" else params
        key = stage_key(kind, key_params, [s.key for s in inputs])
        path = self.stages_dir / f"{kind}-{key}"
        if items is None and inputs:
            items = inputs[0].items
        records = dict(records or {})
        if (path / "stage.json").exists():
            stage = Stage(path)
            if create and items is not None and not (path / "items.csv").exists():
                records["items.csv"] = items.to_csv(None).encode()
            if create:
                stage.restore_records(records)
            return stage
        if items is not None:
            records["items.csv"] = items.to_csv(None).encode()
        meta = {
            "kind": kind,
            "key": key,
            "params": params,
            "inputs": [s.name for s in inputs],
            "dtype": dtype,
            "n_items": len(items) if items is not None else 0,
            "format": FORMAT_VERSION,
            "versions": _package_versions(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "host": HOST,
            "checksums": CHECKSUM_FORMAT,
            "files": {name: as_text(zlib.crc32(data)) for name, data in records.items()},
        }
        if not create:
            return Stage(path, meta=meta, items=items if items is not None else Manifest([]))
        self.check_not_nested()
        self.check_writable()
        make_dirs(path)
        for name, data in records.items():
            atomic_write_bytes(path / name, data)
        tmp = path / f"stage.json.tmp.{HOST}.{os.getpid()}"
        text = json.dumps(meta, indent=2, sort_keys=True).encode()
        try:
            with writing(path / "stage.json"):
                tmp.write_bytes(seal_json(text + b"\n", record_owner(path.name, "stage.json")))
                try:
                    os.link(tmp, path / "stage.json")
                except FileExistsError:
                    pass  # another process created it first; its metadata is identical by key
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        return Stage(path)

    def stage_by_folder(self, folder: str) -> Stage:
        """The stage in folder ``stages/<folder>``; anything but a ``kind-key`` name (a path
        with ``/`` or ``..``) is refused, so no stage outside this store is ever opened."""
        if not isinstance(folder, str) or not STAGE_FOLDER.match(folder):
            raise FeatpipeError(f"{folder!r} is not a stage folder name (kind-key) of store "
                                f"{self.root}")
        return Stage(self.stages_dir / folder)

    def check_writable(self) -> None:
        """A :class:`~featpipe.errors.WriteError` naming the store when this process cannot
        write into its folder (a read-only file system, or no permission), before a command
        that must write starts."""
        folder = Path(os.path.abspath(self.root))
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if os.access(folder, os.W_OK):
            return
        why = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else \
            "Permission denied: not writable by this user"
        raise WriteError(f"store {self.root} is read-only ({folder}: {why}): nothing was "
                         "written; run this command where the store can be written")

    def check_not_nested(self) -> None:
        """Refuse (a :class:`~featpipe.errors.ParameterError` for ``store``) a store folder
        inside another store's folder: the outer store's ``gc`` and ``verify`` would take
        the inner store's files for their own."""
        root = Path(os.path.abspath(self.root))
        for parent in root.parents:
            if is_store(parent):
                raise ParameterError("store", f"{self.root} is inside the store {parent}; a "
                                              "store cannot hold another store: give a folder "
                                              "outside it")

    def require(self) -> Store:
        """This store, or a one-line error when its folder does not exist or is not a store."""
        if not self.root.is_dir():
            what = "is not a folder" if self.root.exists() else "does not exist"
            raise FeatpipeError(f"no store at {self.root}: the folder {what}")
        if not self.stages_dir.is_dir() and not self.names_dir.is_dir() and \
                any(self.root.iterdir()):
            raise FeatpipeError(f"{self.root} is not a featpipe store (no stages/ or names/ "
                                "folder in it)")
        return self

    def scan(self) -> tuple[list[Stage], list[tuple[str, str]]]:
        """Every stage folder: the stages that open, and ``(folder, problem)`` for the others
        (corrupt ``stage.json``, a stray folder), so one broken stage stops nothing."""
        if not self.stages_dir.is_dir():
            return [], []
        stages, problems = [], []
        for path in sorted(self.stages_dir.iterdir()):
            if TMP_NAME.search(path.name):  # a stage gc is deleting (or a killed gc left)
                continue
            if not path.is_dir() or not (path / "stage.json").exists():
                if path.is_dir() and STAGE_FOLDER.match(path.name) and \
                        time.time() - path.stat().st_mtime > CREATION_GRACE_S:
                    problems.append((path.name, "stage.json missing"))
                continue
            try:
                stages.append(self.stage_by_folder(path.name))
            except FeatpipeError as err:
                problems.append((path.name, str(err)))
        return stages, problems

    def all_stages(self) -> list[Stage]:
        """The stages that open (see :meth:`scan` for the broken ones)."""
        return self.scan()[0]

    # -- names ------------------------------------------------------------------------------
    def set_name(self, name: str, stage: Stage) -> None:
        """Point ``name`` at ``stage`` (atomic; an existing name is moved)."""
        if not NAME_PATTERN.match(name):
            raise FeatpipeError(
                f"invalid name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)"
            )
        make_dirs(self.names_dir)
        atomic_write_bytes(self.names_dir / name, pointer_bytes(name, stage.name))

    def read_name(self, name: str) -> str:
        """The stage folder ``name`` points to; a name file holding anything but a stage
        folder name of this store (``../../other/stages/X``) is an error, never followed."""
        return self.read_pointer(self.names_dir / name, name, "name")

    def read_pointer(self, path: Path, name: str, what: str) -> str:
        """The stage folder a name file (``names/NAME``, ``names/.running/NAME``: ``what``)
        points to, checked against its checksum (:func:`pointer_bytes`); a file without one
        is read as written before featpipe kept them, unless the stage it points to was
        written with checksums.  Damage is a :class:`DamagedName`."""
        label = f"{what} {name!r}: {path}"
        try:
            text = path.read_bytes().decode()
        except UnicodeDecodeError as err:
            raise DamagedName(f"{label} is damaged ({first_line(err)})") from None
        except OSError as err:
            raise FeatpipeError(f"{label} is unreadable ({first_line(err)})") from None
        lines = text.split("\n")
        folder = lines[0].strip()
        if not STAGE_FOLDER.match(folder):
            raise DamagedName(f"{label} holds {folder[:200]!r}, not a stage folder of this "
                              "store (kind-key); names never point outside their store's "
                              "stages/")
        if text == pointer_bytes(name, folder).decode():
            return folder
        recorded = lines[1].strip() if len(lines) > 1 else ""
        if recorded == name_checksum(name, folder):  # the sum holds: bytes cut or added
            raise DamagedName(f"{label} is damaged (its checksum holds, but its bytes are not "
                              "those featpipe writes: cut short, or bytes added)")
        if recorded and CHECKSUM.match(recorded):
            raise DamagedName(f"{label} is damaged (checksum {name_checksum(name, folder)} of "
                              f"its name and stage differs from {recorded} recorded "
                              "when it was written)")
        if any(line.strip() for line in lines[1:]) or self._checksummed(folder):
            raise DamagedName(f"{label} is damaged (its checksum is missing, and the stage "
                              f"{folder} it points to was written with checksums)")
        return folder  # written before featpipe kept checksums of names

    def _checksummed(self, folder: str) -> bool:
        """Whether stage folder ``folder`` opens and was written with checksums."""
        try:
            return self.stage_by_folder(folder).checksummed
        except FeatpipeError:
            return False

    def names(self, problems: list[str] | None = None) -> dict[str, str]:
        """All valid names and the stage folder each points to; a corrupt name file is left
        out (and described in ``problems`` when a list is given)."""
        if not self.names_dir.is_dir():
            return {}
        found = {}
        for path in sorted(self.names_dir.iterdir()):
            if not NAME_PATTERN.match(path.name) or not path.is_file():
                continue
            try:
                found[path.name] = self.read_name(path.name)
            except FeatpipeError as err:
                if problems is not None:
                    problems.append(str(err))
        return found

    def resolve(self, name: str) -> Stage:
        """The stage a name points to; a stage folder name (``kind-key``) works too; a name
        in :attr:`planned` gives its planned stage."""
        if name in self.planned:
            return self.planned[name]
        self.require()
        if NAME_PATTERN.match(name) and (self.names_dir / name).is_file():
            folder = self.read_name(name)
            if not (self.stages_dir / folder / "stage.json").exists():
                raise FeatpipeError(f"name {name!r} points to missing stage {folder}")
            return self.stage_by_folder(folder)
        if STAGE_FOLDER.match(name) and (self.stages_dir / name / "stage.json").exists():
            return self.stage_by_folder(name)
        names = self.names()
        hint = did_you_mean(name, names)
        raise FeatpipeError(
            f"no stage named {name!r} in store {self.root}{': ' + hint if hint else ''} "
            f"(names: {', '.join(names) or 'none yet'}; see `featpipe cache ls`)"
        )
