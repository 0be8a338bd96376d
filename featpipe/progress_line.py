"""The progress line of a running stage: count, rate and ETA, for the command line and for
stages called from Python (:class:`featpipe.reporting.Reporter`).

- **On a terminal** (stderr is a tty): one status line on stderr, redrawn in place at most
  every 0.1 s and at every change of a display that was quiet longer than that::

      encode [########------------]  40%  32/80 items  4.1 items/s  ETA 0:12

  Several displays at once (items and frames of ``extract``) share the line, ``|``-separated.
  Log lines and warnings are printed above it (the line is cleared, the text written, the
  line redrawn).
- **Off a terminal** (a SLURM log, a pipe, ``> out.txt``): a plain line every 30 s
  (:data:`DEFAULT_INTERVAL`) and a last line when the run ends, if it ran that long (a
  shorter step has its summary line); with ``-v`` every 10 s (:data:`VERBOSE_INTERVAL`) and
  always the last line; ``FEATPIPE_PROGRESS_INTERVAL`` sets both intervals::

      progress: encode 32/80 items (40%), 4.1 items/s, about 12 s left
      progress: encode 80/80 items in 19 s (4.2 items/s)

  with ``-vv`` a line at every update.
- ``-q``: nothing (the reporter hands out the silent base ``Progress``).
- ``--log-file``: the plain lines every 10 s (or ``FEATPIPE_PROGRESS_INTERVAL``) and the
  last line, at any verbosity.

The rate is that of :class:`featpipe.progress.RateEstimate`: the units completed over about
the last 30 s (all of it in a shorter run), counted by the stages as they complete (items
stored, frames whose features are written).  The ETA is the remaining work at the rate of
the work (:class:`featpipe.progress.WorkEstimate`) when the run planned its work per item
(:meth:`ProgressDisplay.plan_work`: an extraction's rows, an encode stage's input rows), else
the remaining count at the count's rate.  When a run ends normally the count is the real
total: the line ends at 100 %, and a declared total that differed (the frames estimated
before decoding) is named in the last line::

      progress: extract 4,910/4,910 frames in 2 min 03 s (39.9 frames/s; 5,000 declared)

Stages called from Python (a plain :class:`~featpipe.reporting.Reporter`) show the terminal
form when stderr is a terminal or the process is a Jupyter kernel, tqdm's rule
(:func:`interactive`), through :func:`library_board`; otherwise nothing.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from featpipe.progress import RateEstimate, WorkEstimate, WorkPlan, format_duration
from featpipe.settings import progress_interval_setting

#: Seconds between plain progress lines off a terminal, by default.
DEFAULT_INTERVAL = 30.0
#: Seconds between plain progress lines off a terminal with ``-v``, and in a log file.
VERBOSE_INTERVAL = 10.0
#: Seconds between redraws of the terminal line.
REDRAW_INTERVAL = 0.1


class Log(Protocol):
    """Where a board also records its plain lines (:mod:`featpipe.cli.logfile`)."""

    def active(self) -> bool: ...

    def record(self, text: str) -> None: ...


def format_clock(seconds: float) -> str:
    """``0:12``, ``1:02:03`` (terminal ETA)."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_rate(rate: float) -> str:
    return f"{rate:.3g}" if rate < 100 else f"{rate:,.0f}"


class StatusBoard:
    """The stderr line shared by the active displays of one process (thread-safe).

    ``tty`` selects the in-place line; ``verbosity`` (-1 = ``-q``: none, 0, 1 = ``-v``,
    2 = ``-vv``) the plain lines off a terminal; ``interval`` (default
    ``FEATPIPE_PROGRESS_INTERVAL``, else by verbosity) their spacing; ``log`` also records
    the plain lines (a ``--log-file``); ``write`` (default: stderr) and ``clock`` are
    replaceable for tests.
    """

    def __init__(self, tty: bool, verbosity: int = 0, interval: float | None = None,
                 write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, log: Log | None = None):
        self.tty = tty
        self.verbosity = verbosity
        if interval is None:
            interval = progress_interval_setting()
        self.log_interval = VERBOSE_INTERVAL if interval is None else float(interval)
        self.interval = self.log_interval if interval is not None or verbosity >= 1 \
            else DEFAULT_INTERVAL
        self.clock = clock
        self.log = log
        self._write = write or _stderr
        self._displays: list[ProgressDisplay] = []
        self._lock = threading.RLock()
        self._drawn = False  # a status line is on the terminal now
        self._last_draw = -float("inf")

    # -- displays ---------------------------------------------------------------------------
    def open(self, total: int | None, label: str, unit: str) -> ProgressDisplay:
        display = ProgressDisplay(self, total, label, unit)
        with self._lock:
            self._displays.append(display)
        return display

    def update(self, display: ProgressDisplay) -> None:
        with self._lock:
            now = self.clock()
            if self.tty:
                if now - self._last_draw >= REDRAW_INTERVAL:
                    self._redraw(now)
            elif self.verbosity >= 2 or (self.verbosity >= 0 and not display.finished()
                                         and now - display.last_line >= self.interval):
                display.last_line = now
                self._write(f"progress: {display.plain(now)}\n")
            if self.log is not None and self.log.active() and not display.finished() and \
                    now - display.last_logged >= self.log_interval:
                display.last_logged = now
                self.log.record(f"progress: {display.plain(now)}")

    def close(self, display: ProgressDisplay) -> None:
        with self._lock:
            if display not in self._displays:
                return
            now = self.clock()
            if self.log is not None:
                self.log.record(f"progress: {display.final(now)}")
            if self.tty:
                self._redraw(now)  # the final state stays on screen
                self._displays.remove(display)
                self._write("\n")
                self._drawn = False
                if self._displays:
                    self._redraw(now)
            else:
                self._displays.remove(display)
                if self.verbosity >= 1 or (self.verbosity == 0 and
                                           now - display.started >= self.interval):
                    self._write(f"progress: {display.final(now)}\n")

    # -- other text -------------------------------------------------------------------------
    def print_above(self, text: str) -> None:
        """Write a whole line (log, warning) without breaking the status line."""
        with self._lock:
            if self._drawn:
                self._write("\r\x1b[K")
                self._drawn = False
            self._write(text if text.endswith("\n") else text + "\n")
            if self.tty and self._displays:
                self._redraw(self.clock())

    def _redraw(self, now: float) -> None:
        if not self._displays:
            return
        width = shutil.get_terminal_size((100, 20)).columns
        text = " | ".join(d.line(now, width // len(self._displays)) for d in self._displays)
        self._write("\r" + text[: max(width - 1, 20)] + "\x1b[K")
        self._drawn = True
        self._last_draw = now


class ProgressDisplay:
    """One progress of a run: ``total`` units (or None), counted by :meth:`advance`;
    ``declared`` is the total it was opened with when the run ended at another count; the
    work planned per item (:meth:`plan_work`) times it (the interface of
    :class:`featpipe.reporting.Progress`, which imports this module when it shows one: no
    import back)."""

    def __enter__(self) -> ProgressDisplay:
        return self

    def __init__(self, board: StatusBoard, total: int | None, label: str, unit: str):
        self.board = board
        self.total = total
        self.declared: int | None = None
        self.label = label
        self.unit = unit
        self.started = board.clock()
        self.estimate = RateEstimate(self.started)
        self.work: WorkEstimate | None = None
        self.last_line = self.last_logged = self.started

    @property
    def done(self) -> int:
        return self.estimate.done

    def plan_work(self, plan: WorkPlan) -> None:
        """Time the run by ``plan`` (the work of each item) from now on."""
        self.work = WorkEstimate(plan, self.board.clock())

    def advance(self, n: int = 1) -> None:
        self.estimate.add(n, self.board.clock())
        self.board.update(self)

    def advance_item(self, item: str, n: int = 1) -> None:
        """``n`` more units of ``item``: counted, and their work done (:meth:`plan_work`)."""
        now = self.board.clock()
        self.estimate.add(n, now)
        if self.work is not None:
            self.work.add(n, item, now)
        self.board.update(self)

    def ended(self, item: str) -> None:
        if self.work is not None:
            self.work.end(item)

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.complete()
        self.close()

    def complete(self) -> None:
        """The run ended normally: what was counted is the real total."""
        if self.total is not None and self.done != self.total:
            self.declared, self.total = self.total, self.done

    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total

    def close(self) -> None:
        self.board.close(self)

    # -- text -------------------------------------------------------------------------------
    def rate(self, now: float) -> float | None:
        return self.estimate.rate(now)

    def eta(self, now: float) -> float | None:
        if self.work is not None:
            return self.work.eta(now)
        return self.estimate.eta(now, self.total)

    def count(self) -> str:
        return (f"{self.done:,}/{self.total:,} {self.unit}" if self.total is not None
                else f"{self.done:,} {self.unit}")

    def line(self, now: float, width: int = 100) -> str:
        """The terminal form: label, bar (when the total is known), count, rate, ETA."""
        rate, eta = self.rate(now), self.eta(now)
        tail = f"  {self.count()}"
        tail += f"  {format_rate(rate)} {self.unit}/s" if rate is not None else ""
        tail += f"  ETA {format_clock(eta)}" if eta is not None and not self.finished() else ""
        if self.total is None or self.total == 0:
            return self.label + tail
        share = min(self.done, self.total) / self.total
        bar_width = max(5, min(30, width - len(self.label) - len(tail) - 10))
        filled = int(bar_width * share)
        bar = "#" * filled + "-" * (bar_width - filled)
        return f"{self.label} [{bar}] {100 * share:3.0f}%{tail}"

    def plain(self, now: float) -> str:
        """The log-file form: ``encode 32/80 items (40%), 4.1 items/s, about 12 s left``."""
        text = f"{self.label} {self.count()}"
        if self.total:  # more units than declared (a video's frames) stay at 100 %
            text += f" ({100 * min(self.done, self.total) / self.total:.0f}%)"
        rate, eta = self.rate(now), self.eta(now)
        if rate is not None:
            text += f", {format_rate(rate)} {self.unit}/s"
        if eta is not None and not self.finished():
            text += f", about {format_duration(eta)} left"
        return text

    def final(self, now: float) -> str:
        """The last line: ``encode 80/80 items in 19 s (4.2 items/s)``, the rate averaged over
        the whole run; ``; 5,000 declared`` when the run counted another total."""
        elapsed = now - self.started
        rate = self.estimate.average(now)
        notes = [f"{format_rate(rate)} {self.unit}/s"] if rate is not None else []
        if self.declared is not None:
            notes.append(f"{self.declared:,} declared")
        text = f"{self.label} {self.count()} in {format_duration(elapsed)}"
        return text + (f" ({'; '.join(notes)})" if notes else "")


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def interactive(stream=None) -> bool:
    """Whether progress is shown to someone: ``stream`` (default stderr) is a terminal, or
    this process is a Jupyter kernel (tqdm's rule for its ``auto`` display)."""
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


_LIBRARY_BOARD: StatusBoard | None = None


def library_board(tty: bool) -> StatusBoard:
    """The board on stderr that stages called from Python draw on: the in-place line
    (``tty``), else plain lines as with ``-v`` (every 10 s and a last one).  One per process,
    made anew when idle."""
    global _LIBRARY_BOARD
    if _LIBRARY_BOARD is None or _LIBRARY_BOARD.tty != tty or not _LIBRARY_BOARD._displays:
        _LIBRARY_BOARD = StatusBoard(tty, verbosity=0 if tty else 1)
    return _LIBRARY_BOARD

