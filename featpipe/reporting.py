"""Where a stage tells what it does: the :class:`Reporter` and :class:`Progress` interfaces.

In library use the reporter says nothing but its progress, which it shows as the command
line does when stderr is a terminal or a notebook (:mod:`featpipe.progress_line`); the
command line subclasses it (:class:`featpipe.cli.common.ClickReporter`,
:mod:`featpipe.cli.display`).  This module imports nothing, so that a command's ``--help``
can define its reporter without numpy.
"""

from __future__ import annotations


class Progress:
    """Progress of one run: ``advance(n)`` after ``n`` more units (items, frames, iterations)
    are finished. This one shows nothing.

    A run that knows the work of each item (:class:`featpipe.progress.WorkPlan`) gives it
    to :meth:`plan_work`, counts its units with the item they belong to
    (:meth:`advance_item`) and says when an item ends (:meth:`ended`): the time left is then
    that of the work left.  A subclass that counts with :meth:`advance` alone counts them
    all the same."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more units finished (items done or failed, frames decoded...)."""

    def plan_work(self, plan) -> None:
        """The run's work per item (a :class:`featpipe.progress.WorkPlan`)."""

    def advance_item(self, item: str, n: int = 1) -> None:
        """``n`` more units of ``item`` finished (its frames, or the item itself)."""
        self.advance(n)

    def ended(self, item: str) -> None:
        """``item`` is done or failed: none of its planned work is left."""

    def close(self) -> None:
        """The run ended."""


class Reporter:
    """Where a stage tells what it does, for stages called from Python: its lines are
    dropped, its progress is the command line's progress line on stderr when stderr is a
    terminal or the process a Jupyter kernel (tqdm's rule), else nothing.  ``progress=True``
    shows it on any stderr, ``False`` never; subclass it to keep the lines (docs/python-api.md).
    """

    #: show progress: None = when someone watches (a terminal, a notebook), True, False
    show_progress: bool | None = None

    def __init__(self, progress: bool | None = None):
        self.show_progress = progress

    def info(self, text: str) -> None:
        """A result line (the stage and its name, a summary): stdout on the command line."""

    def warn(self, text: str) -> None:
        """Something the user should know but that does not stop the stage: stderr."""

    def error(self, text: str) -> None:
        """An item or step that failed (stderr, also with ``-q``)."""

    def progress(self, total: int | None, label: str, unit: str = "items") -> Progress:
        """A progress display for ``total`` units (``None``: not known in advance)."""
        from featpipe.progress_line import interactive, library_board

        watched = interactive()
        if not (watched if self.show_progress is None else self.show_progress) or total == 0:
            return Progress()
        return library_board(watched).open(total, label, unit)
