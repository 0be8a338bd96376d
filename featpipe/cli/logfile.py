"""``--log-file PATH``: the full record of a run in a file, whatever ``-q``/``-v`` show.

The file (appended to; its folder is made) gets, with date and time on every line:

- a header: the command line, host, process id and featpipe version;
- every featpipe log record at every level (DEBUG included), and other libraries' warnings;
- the lines the command reports (stage, summary, scores, ``warning:``, ``failed:``);
- a ``progress:`` line every ``FEATPIPE_PROGRESS_INTERVAL`` seconds (10) and the last one;
- the ``error:`` line or the traceback of a crash, and ``exit status N after T``.

So a SLURM task's output is not the only copy: ``--log-file logs/task-$SLURM_ARRAY_TASK_ID.log``.
The lines the command reports go to the file through the logger :data:`OUTPUT`, which the
stderr handler skips (they are on stdout/stderr already).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from featpipe import __version__
from featpipe.errors import FeatpipeError

#: The logger of the reported lines: written to the log file only.
OUTPUT = "featpipe.output"

_handler: logging.FileHandler | None = None
_started = time.monotonic()
#: the file and the folders this run made (a refused --log-file leaves nothing behind)
_created: list[Path] = []


def open_log(path: str | os.PathLike, command: str) -> None:
    """Start writing the record of this run to ``path`` (appended; its folder is made)."""
    global _handler, _started, _created
    path = Path(path).absolute()
    if _handler is not None and Path(_handler.baseFilename) == path:
        return
    close_log()
    try:
        _created = [p for p in (path, *path.parents) if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    except OSError as err:
        raise FeatpipeError(f"--log-file {path}: cannot write it ({err.strerror or err})") \
            from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    _handler, _started = handler, time.monotonic()
    logging.getLogger("featpipe").setLevel(logging.DEBUG)
    from featpipe.fileio import HOST  # (fileio brings numpy: not at `featpipe --help`)

    record(f"{command} (host {HOST}, pid {os.getpid()}, featpipe {__version__})")


def active() -> bool:
    return _handler is not None


def log_path() -> Path | None:
    """The ``--log-file`` of this run, if any."""
    return None if _handler is None else Path(_handler.baseFilename)


def discard() -> None:
    """Close the log of a refused ``--log-file``, removing the file and folders this run
    made for it."""
    close_log()
    for path in _created:
        try:
            path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
        except OSError:  # a folder something else has written into since
            break


def record(text: str, level: int = logging.INFO) -> None:
    """A reported line (``stage ...``, ``summary: ...``, ``error: ...``) into the log file."""
    if _handler is not None:
        logging.getLogger(OUTPUT).log(level, text.rstrip("\n"))


def record_crash() -> None:
    """The traceback of the exception being handled."""
    if _handler is not None:
        logging.getLogger(OUTPUT).exception("crashed")


def close_log(code: int | None = None) -> None:
    """Write ``exit status N after T`` (when ``code`` is given) and close the file."""
    global _handler
    if _handler is None:
        return
    if code is not None:
        from featpipe.progress import format_duration

        record(f"exit status {code} after {format_duration(time.monotonic() - _started)}")
    logging.getLogger().removeHandler(_handler)
    _handler.close()
    _handler = None
