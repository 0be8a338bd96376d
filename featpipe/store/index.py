"""A stage's index: its ledgers folded into one compact record, so that what a stage holds is
read in O(ledgers) (``status``, ``cache ls``) and item by item without a Python object per
item (resume, reads, ``verify``), also at 10^6 items.

The ledgers stay the record (one line per item and process, append-only,
:mod:`featpipe.store.ledger`); the index is what folding them gives, kept beside them as a cache, as
git keeps its index beside its objects::

    STAGE/index.json           counts, each ledger's tally and how far it was folded, the
                               failed items, the errors of failed lines, the problems met,
                               and the table's file name and checksum; its own checksum
                               inside (the CRC-32 of its canonical JSON)
    STAGE/index-<token>.npz    the table: one row per item, sorted by a 64-bit key of its id
                               (BLAKE2b): the id (UTF-8), the times of its latest done,
                               failed and removed lines, how many done lines it has, and the
                               checksums (by file suffix) and batch file of its latest done
                               line

**Folding**: an item is *done* when it has a done line later than its last ``removed`` line
(written by ``cache verify --repair`` when it removes the item's files), whatever failed
lines follow (a later failed line never undoes a done item); else *failed* when a failed line
is later than its last removal; else pending.  "Later" by the lines' times, so the state
follows from the latest line of each status, in whatever order the lines are folded: the
ledgers can be folded a piece at a time.  The index records, per ledger, the bytes folded
(through its last complete line), and a reader folds only what was appended since
(:func:`load`); a ledger that is not a longer copy of what was folded (replaced, cut short,
rewritten: its inode, or its first or last folded 4 KiB differ) makes the whole index be
folded again from the ledgers.  Folded states are merged into the arrays every
:data:`MERGE_EVERY`, and the ledgers are read :data:`_BLOCK` bytes at a time, so folding
10^6 lines takes the table's memory plus a constant.

**Written by** runs (:func:`compact`: when a run ends, and every :data:`COMPACT_EVERY_S`
seconds while it runs), only when the ledgers hold complete lines it lacks; a read writes
nothing, except once for an index that is sound but stale (:func:`outdated`: a copy of the
store gave its ledgers new inodes, a ledger was rewritten or removed), which the first read
writes again (and ``verify --repair``: :func:`rebuild_stale`), so that a copied store reads
at its speed again instead of folding every ledger on every read.  One process writes at a
time (``locks/index``, taken without waiting: a busy lock means another process is writing
it).  Each write is a new table file, then ``index.json`` atomically, then the older tables
are removed: a reader sees one index or the other, never a mix (a table removed under a
reader is read again through the new ``index.json``).  A missing or damaged index, or a
stale one that cannot be written (a read-only store), is folded again from the ledgers, in
memory: the index is never the only copy of anything.  ``cache verify`` checks both checksums
and folds the same ledger bytes again to compare (:func:`problems`); ``verify --repair``
removes an index that disagrees, and the next run writes it again.

The counts (``status``, ``cache ls``) are those of the ledgers: an item whose file was
removed behind featpipe's back counts as done there until ``verify`` or a rerun (which checks
every file, :meth:`featpipe.store.Stage.done_ids`) finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from featpipe.checksums import CHECKSUM, as_text, check, stream_checksum
from featpipe.fileio import atomic_save_npz, atomic_write_bytes, first_line, make_dirs

#: The index record of a stage folder, and the names of its table files.
INDEX_FILE = "index.json"
TABLE_PREFIX = "index-"
TABLE_NAME = re.compile(r"^index-[0-9a-f]{12}\.npz$")
#: Bytes of a ledger read at a time.
_BLOCK = 1 << 18
#: Bytes at the start and at the end of a folded ledger whose checksums say it is unchanged.
_PROBE = 4096
#: A run writes the index at least this often (seconds) while it computes.
COMPACT_EVERY_S = 60.0
#: Item states folded into the arrays every this many (a state held apart costs about
#: half a kB, a row about 60 bytes: folding 10^6 lines needs some tens of MB beyond them).
MERGE_EVERY = 50_000
#: Version of the index format (an index of another version is folded again).
INDEX_FORMAT = 1


def id_key(item_id: str) -> int:
    """The 64-bit key an id is sorted and found by (BLAKE2b of its UTF-8 bytes); two ids
    with one key are told apart by their text, kept beside it."""
    return int.from_bytes(hashlib.blake2b(item_id.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "little")


@dataclass
class LedgerTally:
    """What one ledger file (one process) recorded, as far as it was folded: ``offset``
    bytes (through its last complete line), ``lines`` lines; done, failed and removed
    lines, the summed seconds and first and last times of the done and failed ones; and what
    says it is unchanged: its inode and the checksums of its first and last folded
    :data:`_PROBE` bytes."""

    name: str
    offset: int = 0
    lines: int = 0
    inode: int = 0
    head: str = ""
    tail: str = ""
    done: int = 0
    failed: int = 0
    removed: int = 0
    seconds: float = 0.0
    first: float | None = None
    last: float | None = None

    def count(self, entry) -> None:
        if entry.status == "removed":
            self.removed += 1
            return
        if entry.status == "done":
            self.done += 1
        else:
            self.failed += 1
        self.seconds += entry.seconds
        self.first = entry.time if self.first is None else min(self.first, entry.time)
        self.last = entry.time if self.last is None else max(self.last, entry.time)


@dataclass(slots=True)
class ItemState:
    """The folded lines of one item: the time of its latest done, failed and removed line
    (None: no such line), the checksums and batch file of the latest done line, the error
    of the latest failed line, and how many done lines it has.  Its :attr:`status` follows
    from the times alone, so lines fold in any order (module docstring)."""

    done: float | None = None
    failed: float | None = None
    removed: float | None = None
    sums: dict[str, str] | None = None
    batch: str | None = None
    error: str | None = None
    done_lines: int = 0

    @property
    def status(self) -> str:
        """``done``, ``failed`` or ``removed`` (pending: to be computed again)."""
        return _status(self.done, self.failed, self.removed)

    def fold(self, entry) -> ItemState:
        """This state with one more ledger entry (a new object: states are shared)."""
        new = ItemState(self.done, self.failed, self.removed, self.sums, self.batch,
                        self.error, self.done_lines)
        if entry.status == "done":
            new.done_lines += 1
            if new.done is None or entry.time >= new.done:
                new.done, new.sums, new.batch = entry.time, entry.sums, entry.batch
        elif entry.status == "failed":
            if new.failed is None or entry.time >= new.failed:
                new.failed, new.error = entry.time, entry.error or "failed"
        elif new.removed is None or entry.time >= new.removed:
            new.removed = entry.time
        return new


def _status(done: float | None, failed: float | None, removed: float | None) -> str:
    """An item is done when it has a done line after its last removal (a failed line never
    undoes a done item), failed when it has a failed line after its last removal, else it
    was removed (by ``verify --repair``: pending again)."""
    if done is not None and (removed is None or done > removed):
        return "done"
    if failed is not None and (removed is None or failed > removed):
        return "failed"
    return "removed"


class Table:
    """The per-item part of an index: parallel arrays sorted by :func:`id_key` (times are
    NaN where an item has no such line), and the states of the items folded since
    (``changed``, by id) until :meth:`merged`."""

    COLUMNS = ("keys", "id_end", "ids", "t_done", "t_failed", "t_removed", "done_lines",
               "batch", "sums")

    def __init__(self, arrays: dict[str, np.ndarray] | None = None,
                 suffixes: Iterable[str] = (), batches: Iterable[str] = (),
                 errors: dict[str, str] | None = None):
        arrays = arrays or {}
        self.keys = arrays.get("keys", np.zeros(0, np.uint64))
        self.id_end = arrays.get("id_end", np.zeros(0, np.int64))
        self.ids = arrays.get("ids", np.zeros(0, np.uint8))
        self.t_done = arrays.get("t_done", np.zeros(0))
        self.t_failed = arrays.get("t_failed", np.zeros(0))
        self.t_removed = arrays.get("t_removed", np.zeros(0))
        self.done_lines = arrays.get("done_lines", np.zeros(0, np.uint32))
        self.batch = arrays.get("batch", np.zeros(0, np.int32))
        self.suffixes = list(suffixes)
        self.sums = arrays.get("sums", np.zeros((0, len(self.suffixes)), np.int64))
        self.batches = list(batches)
        #: the error of the latest failed line of every item that has one
        self.errors = dict(errors or {})
        self.changed: dict[str, ItemState] = {}

    def __len__(self) -> int:
        return len(self.keys) + sum(1 for i in self.changed if self._row(i) is None)

    # -- rows -------------------------------------------------------------------------------
    def _row(self, item_id: str) -> int | None:
        key = np.uint64(id_key(item_id))
        row = int(np.searchsorted(self.keys, key))
        encoded = item_id.encode("utf-8", "surrogatepass")
        while row < len(self.keys) and self.keys[row] == key:
            if self._id_bytes(row) == encoded:
                return row
            row += 1
        return None

    def _id_bytes(self, row: int) -> bytes:
        start = int(self.id_end[row - 1]) if row else 0
        return self.ids[start:int(self.id_end[row])].tobytes()

    def _state_at(self, row: int, item_id: str) -> ItemState:
        def when(column: np.ndarray) -> float | None:
            value = float(column[row])
            return None if value != value else value  # NaN: no such line

        sums = {s: as_text(int(v)) for s, v in zip(self.suffixes, self.sums[row], strict=True)
                if v >= 0} or None
        batch = int(self.batch[row])
        return ItemState(when(self.t_done), when(self.t_failed), when(self.t_removed), sums,
                         self.batches[batch] if batch >= 0 else None,
                         self.errors.get(item_id), int(self.done_lines[row]))

    def get(self, item_id: str) -> ItemState | None:
        """The state of ``item_id``, or None when no line names it."""
        state = self.changed.get(item_id)
        if state is not None:
            return state
        row = self._row(item_id)
        return None if row is None else self._state_at(row, item_id)

    def _row_ids(self, rows: Iterable[int]) -> Iterator[tuple[int, str]]:
        blob, ends = self.ids.tobytes(), self.id_end.tolist()
        for row in rows:
            yield row, blob[ends[row - 1] if row else 0:ends[row]].decode("utf-8",
                                                                         "surrogatepass")

    def items(self) -> Iterator[tuple[str, ItemState]]:
        """Every ``(id, state)``: table rows first (in key order), then new ids."""
        for row, item_id in self._row_ids(range(len(self.keys))):
            yield item_id, self.changed.get(item_id) or self._state_at(row, item_id)
        for item_id, state in self.changed.items():
            if self._row(item_id) is None:
                yield item_id, state

    def done_items(self) -> Iterator[tuple[str, str | None]]:
        """``(id, batch file or None)`` of every done item."""
        done = ~np.isnan(self.t_done) & (np.isnan(self.t_removed) |
                                         (self.t_done > self.t_removed))
        batch = self.batch.tolist()
        for row, item_id in self._row_ids(np.flatnonzero(done).tolist()):
            if item_id not in self.changed:
                yield item_id, self.batches[batch[row]] if batch[row] >= 0 else None
        for item_id, state in self.changed.items():
            if state.status == "done":
                yield item_id, state.batch

    # -- folding ----------------------------------------------------------------------------
    def fold(self, entry) -> tuple[ItemState | None, ItemState]:
        """Fold one ledger entry in; returns the item's state before and after."""
        before = self.get(entry.id)
        after = (before or ItemState()).fold(entry)
        self.changed[entry.id] = after
        return before, after

    def merged(self) -> Table:
        """A table whose arrays hold every row: the states of ``changed`` written into their
        rows, the rows of new ids inserted where their keys go (one copy of each array)."""
        if not self.changed:
            return self
        suffixes = list(self.suffixes)
        batches = {name: k for k, name in enumerate(self.batches)}
        updated, new = [], []
        for item_id, state in self.changed.items():
            suffixes.extend(s for s in state.sums or () if s not in suffixes)
            if state.batch is not None:
                batches.setdefault(state.batch, len(batches))
            row = self._row(item_id)
            if row is None:
                new.append((id_key(item_id), item_id.encode("utf-8", "surrogatepass"), state))
            else:
                updated.append((row, state))
        new.sort(key=lambda entry: entry[0])
        column = {suffix: k for k, suffix in enumerate(suffixes)}

        def rows(states):
            """The columns of ``states``, one row each."""
            n = len(states)
            out = {"t_done": np.full(n, np.nan), "t_failed": np.full(n, np.nan),
                   "t_removed": np.full(n, np.nan), "done_lines": np.zeros(n, np.uint32),
                   "batch": np.full(n, -1, np.int32), "sums": np.full((n, len(suffixes)), -1,
                                                                      np.int64)}
            for k, state in enumerate(states):
                for name, value in (("t_done", state.done), ("t_failed", state.failed),
                                    ("t_removed", state.removed)):
                    if value is not None:
                        out[name][k] = value
                out["done_lines"][k] = state.done_lines
                if state.batch is not None:
                    out["batch"][k] = batches[state.batch]
                for suffix, value in (state.sums or {}).items():
                    out["sums"][k, column[suffix]] = int(value[6:], 16)
            return out

        keys = np.fromiter((key for key, _, _ in new), np.uint64, len(new))
        lengths = np.fromiter((len(encoded) for _, encoded, _ in new), np.int64, len(new))
        where = np.searchsorted(self.keys, keys, side="right")  # the rows they go before
        sums = self.sums
        if sums.shape[1] < len(suffixes):
            sums = np.full((len(self.keys), len(suffixes)), -1, np.int64)
            sums[:, :self.sums.shape[1]] = self.sums
        old = {"t_done": self.t_done, "t_failed": self.t_failed, "t_removed": self.t_removed,
               "done_lines": self.done_lines, "batch": self.batch, "sums": sums}
        inserted = rows([state for _, _, state in new])
        arrays = {name: np.insert(old[name], where, inserted[name], axis=0) for name in old}
        starts = np.concatenate([[0], self.id_end]).astype(np.int64)
        arrays["keys"] = np.insert(self.keys, where, keys)
        arrays["ids"] = np.insert(self.ids, np.repeat(starts[where], lengths),
                                  np.frombuffer(b"".join(e for _, e, _ in new), np.uint8))
        arrays["id_end"] = np.cumsum(np.insert(np.diff(self.id_end, prepend=0), where,
                                               lengths)).astype(np.int64)
        if updated:  # an old row moves down by the new rows inserted before it
            at = np.array([row for row, _ in updated], np.int64)
            at += np.searchsorted(where, at, side="right")
            changed = rows([state for _, state in updated])
            for name in old:
                arrays[name][at] = changed[name]
        errors = dict(self.errors)
        errors.update({i: s.error for i, s in self.changed.items() if s.error is not None})
        return Table(arrays, suffixes, batches, errors)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.COLUMNS}


@dataclass
class Index:
    """A stage's folded ledgers: tallies per ledger, counts, failed items, problems and the
    table (read only when a ledger must be folded or an item looked up).

    ``stale``: the ledgers hold lines the index on disk lacks (or there is none).  A last
    line without its newline (a writer killed in the middle of it) is folded for the reader
    only: its tally is in ``pending``, and no index is written with it."""

    ledgers: dict[str, LedgerTally] = field(default_factory=dict)
    done: int = 0
    removed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    done_lines: int = 0
    recomputed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    table_file: str | None = None
    table_sum: str | None = None
    suffixes: list[str] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)
    #: the error of the latest failed line of every item that has one (failed or not now)
    errors: dict[str, str] = field(default_factory=dict)
    stale: bool = False
    pending: dict[str, LedgerTally] = field(default_factory=dict)
    table: Table | None = None

    def summary(self) -> dict:
        return {"format": INDEX_FORMAT, "done": self.done, "removed": self.removed,
                "failed": self.failed,
                "done_lines": self.done_lines, "recomputed": sorted(self.recomputed),
                "problems": self.problems,
                "ledgers": {name: asdict(t) for name, t in sorted(self.ledgers.items())},
                "table": self.table_file, "table_sum": self.table_sum,
                "suffixes": self.suffixes, "batches": self.batches, "errors": self.errors}

    def tallies(self) -> list[LedgerTally]:
        """Each ledger's tally, its unfolded last line included."""
        found = []
        for name, tally in sorted(self.ledgers.items()):
            extra = self.pending.get(name)
            if extra is not None:
                tally = LedgerTally(**asdict(tally))
                tally.done += extra.done
                tally.failed += extra.failed
                tally.removed += extra.removed
                tally.seconds += extra.seconds
                tally.first = min((v for v in (tally.first, extra.first) if v is not None),
                                  default=None)
                tally.last = max((v for v in (tally.last, extra.last) if v is not None),
                                 default=None)
            found.append(tally)
        return found


# -- reading --------------------------------------------------------------------------------

def _canonical(summary: dict) -> bytes:
    return json.dumps(summary, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def read_record(stage_path: Path) -> dict | None:
    """The summary in ``index.json``, checked against the checksum it carries; None when
    there is none; a :class:`~featpipe.checksums.ChecksumError` or ValueError when damaged."""
    path = stage_path / INDEX_FILE
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("index"), dict) or \
            not isinstance(raw.get("sum"), str) or not CHECKSUM.match(raw["sum"]):
        raise ValueError("not an index record (index and sum)")
    check(path, as_text(zlib.crc32(_canonical(raw["index"]))), raw["sum"])
    return raw["index"]


def _from_record(record: dict) -> Index:
    if record.get("format") != INDEX_FORMAT:
        raise ValueError(f"index format {record.get('format')!r}, not {INDEX_FORMAT}")
    return Index(ledgers={name: LedgerTally(**t) for name, t in record["ledgers"].items()},
                 done=int(record["done"]), removed=int(record["removed"]),
                 failed=dict(record["failed"]),
                 done_lines=int(record["done_lines"]), recomputed=list(record["recomputed"]),
                 problems=list(record["problems"]), table_file=record["table"],
                 table_sum=record["table_sum"], suffixes=list(record["suffixes"]),
                 batches=list(record["batches"]), errors=dict(record["errors"]))


def read_table(stage_path: Path, index: Index) -> Table:
    """The table file ``index`` names, checked against its checksum (raises when damaged,
    FileNotFoundError when a newer index replaced it meanwhile)."""
    if index.table_file is None:
        return Table(suffixes=index.suffixes, batches=index.batches, errors=index.errors)
    path = stage_path / index.table_file
    with open(path, "rb") as handle:  # summed, then read, through one open file
        check(path, stream_checksum(handle), index.table_sum)
        handle.seek(0)
        with np.load(handle, allow_pickle=False) as data:
            arrays = {name: data[name] for name in Table.COLUMNS}
    return Table(arrays, index.suffixes, index.batches, index.errors)


def _probe(handle, start: int, end: int) -> str:
    handle.seek(start)
    return as_text(zlib.crc32(handle.read(end - start)))


def _unchanged(path: Path, tally: LedgerTally) -> bool:
    """Whether ledger ``path`` still begins with the bytes ``tally`` folded."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if info.st_ino != tally.inode or info.st_size < tally.offset:
                return False
            return tally.offset == 0 or (
                _probe(handle, 0, min(_PROBE, tally.offset)) == tally.head and
                _probe(handle, max(0, tally.offset - _PROBE), tally.offset) == tally.tail)
    except OSError:
        return False


def ledger_files(stage_path: Path) -> list[Path]:
    folder = stage_path / "ledger"
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def outdated(index: Index, files: list[Path]) -> bool:
    """Whether ``index`` no longer describes the ledgers ``files``: one of those it folded
    was removed, or is not a longer copy of what it folded (rewritten, cut short, replaced,
    or copied with the store: a new inode)."""
    return bool(set(index.ledgers) - {p.name for p in files}) or not all(
        _unchanged(p, index.ledgers[p.name]) for p in files if p.name in index.ledgers)


def rebuild_stale(stage_path: Path, parse: Callable) -> bool:
    """Write the index again when the one on disk is sound but :func:`outdated` (``cache
    verify --repair``; a read does the same, :func:`load`); returns whether it wrote."""
    try:
        record = read_record(stage_path)
        index = _from_record(record) if record is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return False  # damaged: verify names it, repair removes it
    return index is not None and outdated(index, ledger_files(stage_path)) and \
        compact(stage_path, parse)


def load(stage_path: Path, parse: Callable, need_table: bool = False,
         trust: bool = True, pending: bool = True, rebuild: bool = True) -> Index:
    """The stage's index, with everything its ledgers hold now folded in (with ``pending``,
    a last line without its newline too, for this reader only).

    ``parse(value, line, ledger)`` turns a ledger line's JSON value (and its bytes, whose
    seal it checks, and its ledger file's name) into an entry or the reason it is not one
    (:meth:`featpipe.store.Stage.parse_line`).  The record and table on disk are used when
    they are sound (``trust``) and the ledgers only grew since; the table is read only when
    a ledger must be folded or ``need_table``.  Nothing is written, except when the index on
    disk is sound but stale (:func:`outdated`: the store was copied, a ledger rewritten):
    then, with ``rebuild``, it is written again first (:func:`compact`), once, so that every
    read after this one finds it current.
    """
    index = None
    if trust:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = read_record(stage_path)
            index = _from_record(record) if record is not None else None
    files = ledger_files(stage_path)
    if index is not None and outdated(index, files):
        index = None  # a ledger was removed, replaced or rewritten: fold them all again
        if rebuild and compact(stage_path, parse):
            return load(stage_path, parse, need_table, trust, pending, rebuild=False)
    if index is None:
        index = Index(stale=True, table=Table())
    grown = [p for p in files if p.name not in index.ledgers or
             _size(p) > index.ledgers[p.name].offset]
    if (grown or need_table) and index.table is None:
        for _ in range(2):  # once more if a newer index replaced the table meanwhile
            try:
                index.table = read_table(stage_path, index)
                break
            except FileNotFoundError:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    record = read_record(stage_path)
                    index = _from_record(record) if record is not None else index
            except (OSError, ValueError, KeyError, TypeError):
                break
        if index.table is None:
            return load(stage_path, parse, need_table, trust=False, pending=pending,
                        rebuild=False)
        grown = [p for p in files if p.name not in index.ledgers or
                 _size(p) > index.ledgers[p.name].offset]
    for path in grown:
        _fold_ledger(index, path, parse, pending)
    return index


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _fold_ledger(index: Index, path: Path, parse: Callable, pending: bool,
                 limit: int | None = None) -> None:
    """Fold what ``path`` holds beyond its tally's offset (up to ``limit`` bytes from its
    start when given), :data:`_BLOCK` bytes at a time: complete lines into the index, with
    ``pending`` a last line without its newline into this reader's view only."""
    tally = index.ledgers.get(path.name) or LedgerTally(path.name)
    start, rest = tally.offset, b""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            end = info.st_size if limit is None else limit
            handle.seek(tally.offset)
            position = tally.offset
            while position < end:
                block = handle.read(min(_BLOCK, end - position))
                if not block:
                    break
                position += len(block)
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    tally.lines += 1
                    tally.offset += len(line) + 1
                    _fold_line(index, tally, line, parse, tally.lines, index.problems)
                    if len(index.table.changed) >= MERGE_EVERY:
                        index.table = index.table.merged()
            if tally.offset > start or path.name not in index.ledgers:
                index.stale = True
            tally.inode = info.st_ino
            if tally.offset:
                tally.head = _probe(handle, 0, min(_PROBE, tally.offset))
                tally.tail = _probe(handle, max(0, tally.offset - _PROBE), tally.offset)
    except OSError as err:
        index.problems.append(f"ledger {path.name} line {tally.lines + 1}: unreadable "
                              f"({err.strerror})")
        return
    index.ledgers[path.name] = tally
    if pending and rest.strip():
        extra = LedgerTally(path.name)
        _fold_line(index, extra, rest, parse, tally.lines + 1, None)
        if extra.done or extra.failed or extra.removed:
            index.pending[path.name] = extra


def _fold_line(index: Index, tally: LedgerTally, line: bytes, parse: Callable, lineno: int,
               problems: list[str] | None) -> None:
    """Fold one ledger line (as :meth:`featpipe.store.Stage.ledger_problems` reads them: a
    line that is not JSON is a problem, except a last one cut short by a killed writer, for
    which ``problems`` is None)."""
    if not line.strip():
        return
    try:
        entry = parse(json.loads(line), line, tally.name)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        if problems is not None:
            problems.append(f"ledger {tally.name} line {lineno}: not JSON ({err})")
        return
    if isinstance(entry, str):
        (index.problems if problems is None else problems).append(
            f"ledger {tally.name} line {lineno}: {entry}")
        return
    tally.count(entry)
    before, after = index.table.fold(entry)
    if entry.status == "done":
        index.done_lines += 1
        if after.done_lines == 2:
            index.recomputed.append(entry.id)
    was, now = (before.status if before else None), after.status
    index.done += (now == "done") - (was == "done")
    index.removed += (now == "removed") - (was == "removed")
    if now == "failed":
        index.failed[entry.id] = after.error
    elif was == "failed":
        index.failed.pop(entry.id, None)


# -- writing --------------------------------------------------------------------------------

def compact(stage_path: Path, parse: Callable) -> bool:
    """Write the stage's index when its ledgers hold complete lines it lacks (a run calls
    this at its end and while it runs); returns whether it wrote.  Skipped when another
    process holds ``locks/index`` (it is writing the same thing) or the store cannot be
    written (readers then fold the ledgers in memory)."""
    import fcntl

    from featpipe.errors import WriteError

    try:
        make_dirs(stage_path / "locks")
        handle = open(stage_path / "locks" / "index", "a+b")  # noqa: SIM115 - closed below
    except (OSError, WriteError):
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            pass  # no locks on this file system: two writers write equal indexes
        index = load(stage_path, parse, pending=False, rebuild=False)
        if not index.stale:
            return False
        try:
            write(stage_path, index)
        except (OSError, WriteError):
            return False
    return True


def write(stage_path: Path, index: Index) -> None:
    """Write ``index`` (its table merged) as a new table file and ``index.json``; then remove
    the older table files."""
    index.table = index.table.merged()
    name = f"{TABLE_PREFIX}{secrets.token_hex(6)}.npz"
    index.table_sum = atomic_save_npz(stage_path / name, index.table.arrays(), checksum=True)
    index.table_file, index.suffixes, index.batches, index.errors = \
        name, index.table.suffixes, index.table.batches, index.table.errors
    summary = index.summary()
    atomic_write_bytes(stage_path / INDEX_FILE, json.dumps(
        {"index": summary, "sum": as_text(zlib.crc32(_canonical(summary)))}).encode("utf-8"))
    index.stale = False
    for old in table_files(stage_path):
        if old.name != name:
            with contextlib.suppress(OSError):
                old.unlink()


def remove(stage_path: Path) -> None:
    """Remove the index (``verify --repair``, after it removed items): the next run writes
    it again; reads fold the ledgers meanwhile."""
    (stage_path / INDEX_FILE).unlink(missing_ok=True)
    for old in table_files(stage_path):
        old.unlink(missing_ok=True)


def table_files(stage_path: Path) -> list[Path]:
    """The index table files of the stage folder (:data:`TABLE_NAME`: no other file)."""
    return sorted(p for p in stage_path.glob(f"{TABLE_PREFIX}*.npz") if TABLE_NAME.match(p.name))


def problems(stage_path: Path, parse: Callable) -> list[str]:
    """What ``cache verify`` finds wrong with the index on disk: a damaged record or table
    (their checksums), or states and counts that differ from the same ledger bytes folded
    again from scratch.  An index older than a ledger that was rewritten since is stale, not
    damaged: nothing reads it (:func:`load` folds the ledgers again)."""
    try:
        record = read_record(stage_path)
        if record is None:
            return []
        stored = _from_record(record)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"index {INDEX_FILE}: damaged ({first_line(err)})"]
    try:
        table = read_table(stage_path, stored)
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"index {INDEX_FILE}: its table {stored.table_file}: damaged or missing "
                f"({first_line(err)})"]
    fresh = Index(table=Table())
    for name, tally in sorted(stored.ledgers.items()):
        ledger = stage_path / "ledger" / name
        if not _unchanged(ledger, tally):
            return []  # stale, not damaged: every read folds the ledgers again, a run too
        _fold_ledger(fresh, ledger, parse, pending=False, limit=tally.offset)
    if (fresh.done, fresh.removed, fresh.failed, fresh.problems) != \
            (stored.done, stored.removed, stored.failed, stored.problems):
        return [f"index {INDEX_FILE}: its counts differ from its ledgers'"]
    if len(table) != len(fresh.table):
        return [f"index {INDEX_FILE}: {len(table)} items, its ledgers {len(fresh.table)}"]
    for item_id, state in table.items():
        if fresh.table.get(item_id) != state:
            return [f"index {INDEX_FILE}: item {item_id!r} differs from its ledgers' lines"]
    return []
