"""Where a stage tells what it does: the :class:`Reporter` and :class:`Progress` interfaces.

Both are silent here (library use); the command line subclasses them
(:class:`featpipe.cli.common.ClickReporter`, :mod:`featpipe.cli.display`).  This module
imports nothing, so that a command's ``--help`` can define its reporter without numpy.
"""

from __future__ import annotations


class Progress:
    """Progress of one run: ``advance(n)`` after ``n`` more units (items, frames, iterations)
    are finished. This one shows nothing."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more units finished (items done or failed, frames decoded...)."""

    def close(self) -> None:
        """The run ended."""


class Reporter:
    """Where a stage tells what it does. This base reporter is silent (library use)."""

    def info(self, text: str) -> None:
        """A result line (the stage and its name, a summary): stdout on the command line."""

    def warn(self, text: str) -> None:
        """Something the user should know but that does not stop the stage: stderr."""

    def error(self, text: str) -> None:
        """An item or step that failed (stderr, also with ``-q``)."""

    def progress(self, total: int | None, label: str, unit: str = "items") -> Progress:
        """A progress display for ``total`` units (``None``: not known in advance)."""
        return Progress()
