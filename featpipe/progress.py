"""Progress of a stage read from its ledgers: done, failed, pending, rate, per-process lines.

Every worker (local process, dask worker, SLURM array task) appends to its own
``ledger/<host>-<pid>.jsonl``, so the ledgers alone tell how far a stage is, on any machine
that sees the store, while it runs.  An item counts as done when a ledger says so and its
array exists (:meth:`featpipe.store.Stage.done_ids`).

:class:`RateEstimate` is the rate and time left of a run while it goes (the progress line).

Whether a stage is still being computed: a live run marker says so (every run marks the stage
it computes, :meth:`featpipe.store.Stage.running_processes`), or a ledger of another host had a
line in the last :data:`RECENT_S` seconds (or ten times its mean item time), since a process
there cannot be checked from here.  A ledger of this host counts as active only while its
process lives and a run marks the stage: a process that finished the stage and lives on (a
notebook, a dask worker) is not computing it.  Only while it runs is a time left shown.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from featpipe.fileio import HOST
from featpipe.store import Stage

#: A ledger of another host counts as active when its last line is at most this old.
RECENT_S = 600.0
#: Seconds of completed work the rate of a running display is measured over.
RATE_WINDOW_S = 30.0


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
        self.done = 0
        #: (time, units done) at the start and after each update, from the anchor on
        self._updates: deque[tuple[float, int]] = deque([(start, 0)])

    def _bound(self, now: float) -> float:
        """The anchor is the latest update at or before this time."""
        previous = self._updates[-2][0] if len(self._updates) > 1 else self.start
        return min(now - self.window, previous)

    def add(self, n: int, now: float) -> None:
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

    def eta(self, now: float, total: int | None) -> float | None:
        """Seconds left for ``total`` units at the current rate (None while it is unknown)."""
        rate = self.rate(now)
        if not rate or total is None:
            return None
        return max(total - self.done, 0) / rate


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
class StageProgress:
    """Counts over the stage's items; ``failed`` maps ids to the recorded reason."""

    total: int
    done: int
    failed: dict[str, str]
    done_lines: int
    ledgers: list[LedgerProgress] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)  # ids with more than one done line
    processes: list[str] = field(default_factory=list)  # live run markers (host-pid)

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
        """Seconds left at the current rate, only while the stage is running."""
        rate = self.rate
        if not self.pending or not rate or not self.running(now):
            return None
        return self.pending / rate

    def to_dict(self) -> dict:
        """JSON-ready counts, rate, time left, ledgers and failures (``status --json``)."""
        now = time.time()
        return {"total": self.total, "done": self.done, "failed": len(self.failed),
                "pending": self.pending, "complete": self.complete,
                "running": self.running(now), "items_per_second": self.rate,
                "eta_seconds": self.eta_seconds(now), "done_lines": self.done_lines,
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
    index = stage.index()
    ledgers = [LedgerProgress(t.name.removesuffix(".jsonl"), t.done, t.failed, t.seconds,
                              t.first, t.last) for t in index.tallies()]
    return StageProgress(
        total=stage.n_items, done=index.done, failed=dict(index.failed),
        done_lines=index.done_lines,
        ledgers=ledgers, recomputed=sorted(index.recomputed),
        processes=stage.running_processes(),
    )
