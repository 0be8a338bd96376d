"""Ctrl-C (SIGINT) and SLURM preemption (SIGTERM) during a stage: stop cleanly, keep the work.

Inside :func:`interruptible` both signals raise :class:`Interrupt` in the main thread (a
``BaseException``, like ``KeyboardInterrupt``, so ``except Exception`` handlers let it pass and
the stage's ``finally`` blocks stop workers and remove unfinished files).  Inside
:func:`critical` (an item being committed: files renamed into place, ledger line appended)
the signal is held back and raised as soon as the block ends, so an item is either fully done
or not at all.  The command line turns :class:`Interrupted` into one line and exit status
128 + signal number: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from featpipe.errors import FeatpipeError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupt(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """A SIGINT or SIGTERM arrived (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(FeatpipeError):
    """A stage stopped by a signal; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, done: int, left: int):
        super().__init__(f"interrupted: {done} items done, {left} left; re-run the same "
                         "command to finish")
        self.signum = signum
        self.exit_code = 128 + signum


class _State:
    depth = 0  # nesting of critical blocks
    pending: int | None = None


def _handler(signum, frame) -> None:
    if _State.depth:
        _State.pending = signum
        return
    raise Interrupt(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupt` while the block runs (main thread only;
    elsewhere the block runs with the signals as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _State.pending = None


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back until the block has run; then raise it."""
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if not _State.depth and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            raise Interrupt(signum)
