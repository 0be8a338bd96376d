"""What the command line shows while a stage runs: the progress line of
:mod:`featpipe.progress_line` on stderr, at the command's verbosity, recorded in a
``--log-file`` (:mod:`featpipe.cli.logfile`); behind ``ClickReporter.progress``.  Log lines
and warnings go above it (:func:`print_above`).
"""

from __future__ import annotations

import sys

import click

from featpipe.cli import logfile
from featpipe.progress_line import StatusBoard

_BOARD: StatusBoard | None = None


def _echo(text: str) -> None:
    click.echo(text, err=True, nl=False)


def board(verbosity: int) -> StatusBoard:
    """The process's status board, for the current stderr and verbosity."""
    global _BOARD
    tty = sys.stderr.isatty() and verbosity >= 0
    if _BOARD is None or _BOARD.tty != tty or _BOARD.verbosity != verbosity \
            or not _BOARD._displays:
        _BOARD = StatusBoard(tty, verbosity, write=_echo, log=logfile)
    return _BOARD


def print_above(text: str) -> None:
    """A stderr line that keeps an active terminal status line intact."""
    if _BOARD is not None and _BOARD._displays:
        _BOARD.print_above(text)
    else:
        click.echo(text if not text.endswith("\n") else text[:-1], err=True)
