"""Progress of a stage read from its ledgers: done, failed, pending, rate, per-process lines.

Every worker (local process, dask worker, SLURM array task) appends to its own
``ledger/<host>-<pid>.jsonl``, so the ledgers alone tell how far a stage is, on any machine
that sees the store, while it runs.  An item counts as done when a ledger says so and its
array exists (:meth:`featpipe.store.Stage.done_ids`).

:class:`RateEstimate` is the rate and time left of a run while it goes (the progress line).

**The time left is that of the work left, not of the items left** (tqdm's ``total`` in the
work's unit, ``pv``'s bytes): a run plans the work of each item (:class:`WorkPlan`: an
extraction's rows, :attr:`featpipe.extract.estimate.ItemEstimate.work`; an encode stage's
input rows), and its time left is the planned work not done yet over the work done per
second (:class:`WorkEstimate`), so a run whose big items come last is not promised the pace of
its small ones.  The run records its plan when it starts (:func:`record_work`:
``STAGE/planned-work/<host>-<pid>.json``, sealed, removed when it ends), so ``featpipe
status`` times it from another process the same way (:func:`work_left`), from the ledgers
and the record alone; a run without a record (an older featpipe) is timed by its items.

Whether a stage is still being computed: a live run marker says so (every run marks the stage
it computes, :meth:`featpipe.store.Stage.running_processes`), or a ledger of another host had a
line in the last :data:`RECENT_S` seconds (or ten times its mean item time), since a process
there cannot be checked from here.  A ledger of this host counts as active only while its
process lives and a run marks the stage: a process that finished the stage and lives on (a
notebook, a dask worker) is not computing it.  Only while it runs is a time left shown.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from featpipe.checksums import ChecksumError, seal_json, unseal_json
from featpipe.errors import FeatpipeError
from featpipe.fileio import HOST, atomic_write_bytes, make_dirs
from featpipe.store import RUNNING_DIR, STAGE_FOLDER, Stage, Store, record_owner

#: A ledger of another host counts as active when its last line is at most this old.
RECENT_S = 600.0
#: Seconds of completed work the rate of a running display is measured over.
RATE_WINDOW_S = 30.0
#: Folder of a stage holding the work each run computing it planned (:func:`record_work`).
WORK_DIR = "planned-work"


class RateEstimate:
    """The rate and time left of work counted in units (items, frames) as it completes.

    The rate read at ``now`` is the units completed since an anchor over the time since it,
    ``(done - done_anchor) / (now - t_anchor)``; the anchor is the latest update at least
    :data:`RATE_WINDOW_S` seconds old and not after the update before the last one (the run's
    start while none is): the work of about the last 30 s, and at least of the last update,
    however far apart updates are.  A constant rate is returned exactly; a stall lowers it
    (the time since the last update counts); a burst moves it by the burst over the window,
    never over the moment since the previous update.  The callers count work that is done
    (items committed, frames whose features are written), never what decoders read ahead,
    so nothing at the start is left out.  The time left is the units left over that rate.
    Times come from the caller (``now``).
    """

    def __init__(self, start: float, window: float = RATE_WINDOW_S):
        self.start = start
        self.window = window
        self.done: float = 0
        #: (time, units done) at the start and after each update, from the anchor on
        self._updates: deque[tuple[float, float]] = deque([(start, 0)])

    def _bound(self, now: float) -> float:
        """The anchor is the latest update at or before this time."""
        previous = self._updates[-2][0] if len(self._updates) > 1 else self.start
        return min(now - self.window, previous)

    def add(self, n: float, now: float) -> None:
        """``n`` more units done at time ``now``."""
        self.done += n
        self._updates.append((now, self.done))
        bound = self._bound(now)
        while len(self._updates) > 2 and self._updates[1][0] <= bound:
            self._updates.popleft()

    def rate(self, now: float) -> float | None:
        """Units per second (see the class); None before any unit is done."""
        bound = self._bound(now)
        anchor = self._updates[0]
        for update in self._updates:
            if update[0] > bound:
                break
            anchor = update
        if not self.done or now <= anchor[0]:
            return None
        return (self.done - anchor[1]) / (now - anchor[0])

    def average(self, now: float) -> float | None:
        """Units per second since the start (None before anything is counted)."""
        return self.done / (now - self.start) if self.done and now > self.start else None

    def eta(self, now: float, total: float | None) -> float | None:
        """Seconds left for ``total`` units at the current rate (None while it is unknown)."""
        rate = self.rate(now)
        if not rate or total is None:
            return None
        return max(total - self.done, 0) / rate


class WorkPlan:
    """The work of a run, per item: its work units (what computing it costs in proportion
    to) and the units its progress is counted in (an extraction's frames; an item stage's
    items, one each), hence the work of one counted unit.

    ``work`` and ``units`` map ids to numbers, or None where unknown (an item not probed, a
    container without a frame count): such an item counts as the mean of the known ones
    (units, work, and work per unit); with no work known, an item's work is its units --
    the count (``unit`` says which: ``rows``, else ``frames`` or ``items``).  ``ids`` are the
    run's items, in order; ``units_total`` their units (a display's total).
    """

    def __init__(self, ids: Sequence[str], work: Mapping[str, float | None],
                 units: Mapping[str, float | None] | None = None):
        units = units or {}
        given = {i: float(units[i]) for i in ids if units.get(i)}
        mean_units = sum(given.values()) / len(given) if given else 1.0
        counted = {i: given.get(i, mean_units) for i in ids}
        known = {i: float(work[i]) for i in ids if work.get(i) is not None}
        self.unit = "rows" if known else "frames" if given else "items"
        known = known or counted
        mean = sum(known.values()) / len(known) if known else 1.0
        base = sum(counted[i] for i in known)
        per_unit = sum(known.values()) / base if base else 1.0
        self.work = {i: known.get(i, mean) for i in ids}
        self.per_unit = {i: known[i] / counted[i] if i in known else per_unit for i in ids}
        self.mean_work = mean
        self.mean_per_unit = per_unit
        self.total = sum(self.work.values())
        self.units_total = sum(counted.values())

    def of(self, item_id: str) -> float:
        """The planned work of ``item_id`` (the mean for an item not in the plan)."""
        return self.work.get(item_id, self.mean_work)

    def unit_work(self, item_id: str) -> float:
        """The work of one counted unit (a frame) of ``item_id``."""
        return self.per_unit.get(item_id, self.mean_per_unit)


class WorkEstimate:
    """The time left of a run from its :class:`WorkPlan`: the planned work not done yet,
    ``left = Σ_i max(w_i − d_i, 0)`` over the items not ended (``w_i`` planned, ``d_i`` the
    work of its units counted so far), over the work done per second
    (:class:`RateEstimate` of the counted units' work, the last 30 s).  An item that ends
    (done or failed) leaves nothing: a container that declared more frames than it had
    leaves no work behind, one that declared fewer is worked on at no planned cost.  No time
    left before some work is done (None), as for :class:`RateEstimate`."""

    def __init__(self, plan: WorkPlan, start: float, window: float = RATE_WINDOW_S):
        self.plan = plan
        self.rate = RateEstimate(start, window)
        self.left = plan.total
        self._done: dict[str, float] = {}
        self._ended: set[str] = set()

    def add(self, n: float, item_id: str, now: float) -> None:
        """``n`` more counted units of ``item_id`` done at ``now``."""
        work = n * self.plan.unit_work(item_id)
        if item_id not in self._ended:
            planned = self.plan.of(item_id)
            before = self._done.get(item_id, 0.0)
            self._done[item_id] = before + work
            self.left -= max(planned - before, 0.0) - max(planned - before - work, 0.0)
        self.rate.add(work, now)

    def end(self, item_id: str) -> None:
        """``item_id`` is done or failed: nothing of it is left."""
        if item_id in self._ended:
            return
        self._ended.add(item_id)
        self.left -= max(self.plan.of(item_id) - self._done.pop(item_id, 0.0), 0.0)

    def eta(self, now: float) -> float | None:
        """Seconds left: the work left at the current rate (None while it is unknown)."""
        rate = self.rate.rate(now)
        return max(self.left, 0.0) / rate if rate else None


@dataclass
class LedgerProgress:
    """What one ledger file (one worker process) recorded."""

    name: str
    done: int = 0
    failed: int = 0
    seconds: float = 0.0  # summed compute seconds of its items
    first: float | None = None
    last: float | None = None

    @property
    def rate(self) -> float | None:
        """Items per second between its first and last line (None with fewer than 2 lines)."""
        if self.first is None or self.last is None or self.last <= self.first:
            return None
        return (self.done + self.failed - 1) / (self.last - self.first)

    def active(self, now: float, marked: bool) -> bool:
        """Whether its process is still computing (see the module docstring); ``marked``:
        whether a live run marks the stage."""
        host, _, pid = self.name.rpartition("-")
        if host == HOST and pid.isdigit():
            if not marked:
                return False
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass
            return True
        lines = self.done + self.failed
        patience = max(RECENT_S, 10 * self.seconds / lines) if lines else RECENT_S
        return self.last is not None and now - self.last <= patience


@dataclass
class RunWork:
    """The work of the runs computing a stage now, from their records (:func:`record_work`)
    and the ledgers: what they planned, did (their items done since they started) and have
    left (their items neither done nor failed since), in work units; when the first of them
    started and the latest ledger line was written."""

    planned: float
    done: float
    left: float
    started: float
    last: float | None
    unit: str = "rows"

    @property
    def rate(self) -> float | None:
        """Work units per second from the runs' start to the latest ledger line (None before
        an item is done)."""
        if not self.done or self.last is None or self.last <= self.started:
            return None
        return self.done / (self.last - self.started)

    def eta(self, now: float) -> float | None:
        """Seconds left: the work left at that rate, less the time since the latest line
        (spent on the items in progress; never below 0)."""
        rate = self.rate
        if rate is None or self.last is None:
            return None
        return max(self.left / rate - max(now - self.last, 0.0), 0.0)

    def to_dict(self) -> dict:
        return {"unit": self.unit, "planned": self.planned, "done": self.done,
                "left": self.left, "started": self.started, "per_second": self.rate}


@dataclass
class StageProgress:
    """Counts over the stage's items; ``failed`` maps ids to the recorded reason; ``work``
    the planned work of the runs computing it (None without a record: then the time left
    is that of the items left)."""

    total: int
    done: int
    failed: dict[str, str]
    done_lines: int
    ledgers: list[LedgerProgress] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)  # ids with more than one done line
    processes: list[str] = field(default_factory=list)  # live run markers (host-pid)
    work: RunWork | None = None

    @property
    def pending(self) -> int:
        return self.total - self.done - len(self.failed)

    @property
    def complete(self) -> bool:
        return self.done == self.total

    @property
    def rate(self) -> float | None:
        """Items per second of the whole stage, from its earliest to its latest ledger line."""
        firsts = [p.first for p in self.ledgers if p.first is not None]
        lasts = [p.last for p in self.ledgers if p.last is not None]
        if not firsts or max(lasts) <= min(firsts):
            return None
        lines = sum(p.done + p.failed for p in self.ledgers)
        return (lines - 1) / (max(lasts) - min(firsts))

    def running(self, now: float | None = None) -> bool:
        """Whether any process is still computing this stage."""
        now = time.time() if now is None else now
        return bool(self.processes) or any(ledger.active(now, False) for ledger in self.ledgers)

    def eta_seconds(self, now: float | None = None) -> float | None:
        """Seconds left, only while the stage is running: the work left at the work's rate
        (:class:`RunWork`) when the runs recorded their work, else the items left at the
        items' rate."""
        now = time.time() if now is None else now
        if not self.pending or not self.running(now):
            return None
        if self.work is not None:
            return self.work.eta(now)
        rate = self.rate
        return self.pending / rate if rate else None

    def to_dict(self) -> dict:
        """JSON-ready counts, rate, time left, ledgers and failures (``status --json``)."""
        now = time.time()
        return {"total": self.total, "done": self.done, "failed": len(self.failed),
                "pending": self.pending, "complete": self.complete,
                "running": self.running(now), "items_per_second": self.rate,
                "eta_seconds": self.eta_seconds(now),
                "eta_from": "work" if self.work is not None else "items",
                "work": None if self.work is None else self.work.to_dict(),
                "done_lines": self.done_lines,
                "recomputed": self.recomputed, "failed_items": self.failed,
                "ledgers": [dict(asdict(p), rate=p.rate, active=p.active(now, bool(self.processes)))
                            for p in self.ledgers]}


def format_duration(seconds: float) -> str:
    """``42 s``, ``5 min 03 s``, ``2 h 10 min``; under a second is ``less than 1 s``; a
    duration that is not finite is ``an unknown time``."""
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 1:
        return "less than 1 s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def format_time(stamp: float | None) -> str:
    """A POSIX time as ``2026-11-24 21:38:42`` (UTC); ``-`` for none; a value that is no date
    (a corrupt ledger line or model record) is shown as itself, never raised on."""
    if stamp is None:
        return "-"
    try:
        return _dt.datetime.fromtimestamp(stamp, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError, TypeError):
        return f"{stamp!r} (not a date)"


def stage_progress(stage: Stage) -> StageProgress:
    """Count the stage's items from its index (:meth:`featpipe.store.Stage.index`: the
    ledgers folded, O(ledgers) when the index is current, whatever the item count): done
    and failed as the ledgers say (a done item whose file was removed behind featpipe's back
    counts as done until ``cache verify`` or a rerun, which check every file, find it); the
    packed files of a packed stage are opened (O(files)); a view's from its source's."""
    if stage.view() is not None:  # its items are its source's: counted there
        return StageProgress(total=stage.n_items, done=len(stage.done_ids()),
                             failed=stage.failed(), done_lines=0,
                             processes=stage.running_processes())
    packed = stage.packed()
    if packed is not None:
        packed.check_files()
    processes = stage.running_processes()
    records = read_work(stage, processes)
    index = stage.index(need_table=bool(records))  # the items' states, to time the runs
    tallies = index.tallies()
    ledgers = [LedgerProgress(t.name.removesuffix(".jsonl"), t.done, t.failed, t.seconds,
                              t.first, t.last) for t in tallies]
    last = max((t.last for t in tallies if t.last is not None), default=None)
    return StageProgress(
        total=stage.n_items, done=index.done, failed=dict(index.failed),
        done_lines=index.done_lines,
        ledgers=ledgers, recomputed=sorted(index.recomputed),
        processes=processes,
        work=work_left(records, index.table, index.failed, last) if records else None,
    )


# -- the work a run planned, recorded for `featpipe status` -----------------------------------

@dataclass
class WorkRecord:
    """What one run recorded when it started: the time, whether it recomputes done items
    (``force``), its items and the planned work of each, in order."""

    started: float
    force: bool
    ids: list[str]
    work: list[float]
    unit: str = "rows"


def _record_path(stage: Stage, process: str):
    return stage.path / WORK_DIR / f"{process}.json"


def record_work(stage: Stage, plan: WorkPlan, force: bool = False) -> None:
    """Record this process's plan for ``stage`` (``planned-work/<host>-<pid>.json``, sealed
    to its place: :func:`featpipe.checksums.seal_json`), now, as the run starts its items
    (call it after :meth:`Stage.mark_running`); the records of processes that no longer
    compute the stage (of this host, or without a run marker) are removed.
    :func:`clear_work` removes it when the run ends."""
    process = f"{HOST}-{os.getpid()}"
    folder = stage.path / WORK_DIR
    make_dirs(folder)
    live = set(stage.running_processes())
    for old in folder.glob("*.json"):
        if old.stem != process and old.stem not in live and (
                old.stem.startswith(f"{HOST}-") or
                not (stage.path / RUNNING_DIR / old.stem).exists()):
            old.unlink(missing_ok=True)
    ids = list(plan.work)
    text = json.dumps({"started": time.time(), "force": bool(force), "unit": plan.unit,
                       "ids": ids, "work": [plan.work[i] for i in ids]}).encode()
    path = _record_path(stage, process)
    atomic_write_bytes(path, seal_json(text + b"\n",
                                       record_owner(stage.name, f"{WORK_DIR}/{path.name}")))


def clear_work(stage: Stage) -> None:
    """Remove this process's record of its work on ``stage`` (the run ended)."""
    try:
        _record_path(stage, f"{HOST}-{os.getpid()}").unlink(missing_ok=True)
    except OSError:  # a read-only store: the record is of a dead process from now on
        pass


def read_work(stage: Stage, processes: Sequence[str]) -> list[WorkRecord]:
    """The records of the live runs ``processes`` (host-pid) that have one; a missing,
    damaged or malformed record is left out (that run is then timed by its items)."""
    found = []
    for process in processes:
        path = _record_path(stage, process)
        try:
            raw = path.read_bytes()
            value, sealed = unseal_json(raw, record_owner(stage.name,
                                                          f"{WORK_DIR}/{path.name}"), path)
            started, ids, work = value["started"], value["ids"], value["work"]
            if not (sealed and isinstance(started, float | int) and isinstance(ids, list)
                    and isinstance(work, list) and len(ids) == len(work)):
                continue  # (the values of a sealed record are those written)
            found.append(WorkRecord(float(started), bool(value.get("force")), ids, work,
                                    str(value.get("unit", "rows"))))
        except (OSError, ValueError, KeyError, TypeError, ChecksumError, FeatpipeError):
            continue
    return found


def work_left(records: Sequence[WorkRecord], table, failed: Mapping[str, str],
              last: float | None) -> RunWork:
    """The work of ``records`` done and left, from the items' states (``table``:
    :meth:`featpipe.store.Stage.item_table`; ``failed``: the failed ids): an item of a run
    is done when it is done and was not done when the run started (a ``force`` run: its
    done line is later than the start), ended when it failed since the start; ``last`` is
    the latest ledger line."""
    done_ids = {item_id for item_id, _ in table.done_items()}
    planned = done = left = 0.0
    for record in records:
        for item_id, work in zip(record.ids, record.work, strict=True):
            planned += work
            if item_id in done_ids:
                state = table.get(item_id) if record.force else None
                if state is None or state.done >= record.started:
                    done += work
                    continue
            if item_id in failed:
                state = table.get(item_id)
                if state is not None and state.failed is not None and \
                        state.failed >= record.started:
                    continue
            left += work
    units = {r.unit for r in records}
    return RunWork(planned, done, left, min(r.started for r in records), last,
                   units.pop() if len(units) == 1 else "work units")


# -- the whole store (`featpipe status` without a name) ---------------------------------------

#: A stage's state in the whole store's status, in the order they are counted.
STATES = ("running", "failed", "incomplete", "done")


@dataclass
class StoreEntry:
    """One stage of the whole store's status: the names pointing at it, the names whose
    unfinished run computes it (``names/.running``), its state (:data:`STATES`), and its item
    counts (``progress``; None for a fitted-model stage, whose ``models`` say whether it is
    done)."""

    stage: Stage
    names: list[str]
    runs: list[str]
    state: str
    progress: StageProgress | None = None
    models: list[str] = field(default_factory=list)

    def to_dict(self, now: float) -> dict:
        counts = None if self.progress is None else {
            "total": self.progress.total, "done": self.progress.done,
            "failed": len(self.progress.failed), "pending": self.progress.pending}
        eta = None if self.progress is None else self.progress.eta_seconds(now)
        return {"stage": self.stage.name, "kind": self.stage.kind, "names": self.names,
                "unfinished_runs": self.runs, "state": self.state, "items": counts,
                "models": None if self.progress is not None else self.models,
                "eta_seconds": eta,
                "eta_from": None if eta is None else
                ("work" if self.progress.work is not None else "items")}


def store_entry(stage: Stage, names: Sequence[str] = (), runs: Sequence[str] = (),
                now: float | None = None) -> StoreEntry:
    """The state of ``stage``: ``running`` while a process computes it, else ``done`` when
    every item is (a fitted-model stage: when it holds a model), ``failed`` when some item
    failed, else ``incomplete`` (items pending, no process on them)."""
    now = time.time() if now is None else now
    if stage.is_model_stage:
        models = stage.model_names()
        state = "running" if stage.running_processes() else "done" if models else "incomplete"
        return StoreEntry(stage, list(names), list(runs), state, models=models)
    progress = stage_progress(stage)
    state = "running" if progress.running(now) else "done" if progress.complete else \
        "failed" if progress.failed else "incomplete"
    return StoreEntry(stage, list(names), list(runs), state, progress)


def _computed_now(store: Store) -> list[str]:
    """Folders of the stages with a live run marker (``running/``), read from the markers
    alone (no stage is opened for the others)."""
    found = []
    if not store.stages_dir.is_dir():
        return found
    for folder in sorted(store.stages_dir.iterdir()):
        if not STAGE_FOLDER.match(folder.name):
            continue
        markers = folder / RUNNING_DIR
        try:
            if markers.is_dir() and any(markers.iterdir()) and \
                    (folder / "stage.json").is_file():
                found.append(folder.name)
        except OSError:
            continue
    return found


def store_status(store: Store, running: Mapping[str, str], problems: list[str]
                 ) -> list[StoreEntry]:
    """Every named stage, every stage an unfinished named run computes (``running``: name ->
    folder, :func:`featpipe.stages.base.running_names`) and every stage a live process
    computes, each once with its names and state (:func:`store_entry`), named stages first
    by name; a stage that cannot be read is described in ``problems`` instead.  Reads the
    ledgers' indexes as ``featpipe status NAME`` does, never the items."""
    names: dict[str, list[str]] = {}
    for name, folder in store.names(problems).items():
        names.setdefault(folder, []).append(name)
    runs: dict[str, list[str]] = {}
    for name, folder in running.items():
        runs.setdefault(folder, []).append(name)
    order = sorted(set(names) | set(runs),
                   key=lambda f: (min(names.get(f, []) + runs.get(f, [])), f))
    order += [f for f in _computed_now(store) if f not in names and f not in runs]
    now = time.time()
    entries = []
    for folder in order:
        try:
            stage = store.stage_by_folder(folder)
            entry = store_entry(stage, sorted(names.get(folder, [])),
                                sorted(runs.get(folder, [])), now)
        except FeatpipeError as err:
            named = ", ".join(names.get(folder, []) + runs.get(folder, [])) or "unnamed"
            problems.append(f"stage {folder} ({named}): {err}")
            continue
        if entry.state == "running" or folder in names or folder in runs:
            entries.append(entry)
    return entries
