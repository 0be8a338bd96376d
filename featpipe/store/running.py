"""Who computes a stage now: one marker per process (``running/<host>-<pid>``, held with
``fcntl.flock``, which the kernel drops when the process dies, so a killed run leaves no stale
claim), and the stage's locks (``locks/<label>``: one run of a stage and shard at a time, one
packer, one index writer).  ``cache gc`` keeps a stage while a process computes it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from featpipe.fileio import HOST, make_dirs, process_gone, writing

#: Sub-folder of a stage holding one empty file per process computing it (``<host>-<pid>``).
RUNNING_DIR = "running"
#: marker path -> the open file whose ``fcntl.flock`` says this process computes the stage
_held: dict[str, object] = {}


def mark_running(stage) -> None:
    """Record this process as computing ``stage`` (its marker, held with ``fcntl.flock``),
    until :func:`unmark_running`; the markers this host's dead processes left are removed."""
    stage._check_on_disk()
    folder = stage.path / RUNNING_DIR
    make_dirs(folder)
    for stale in folder.iterdir():
        if marker_alive(stale) is False:
            with contextlib.suppress(OSError):
                stale.unlink()
    marker = folder / f"{HOST}-{os.getpid()}"
    if str(marker) in _held and marker.exists():
        return  # marked (and locked) already by this process
    with writing(marker):
        handle = open(marker, "a+b")  # noqa: SIM115 - held until unmark_running
    with contextlib.suppress(OSError):
        import fcntl

        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    previous = _held.pop(str(marker), None)
    if previous is not None:
        previous.close()
    _held[str(marker)] = handle


def unmark_running(stage) -> None:
    marker = stage.path / RUNNING_DIR / f"{HOST}-{os.getpid()}"
    with contextlib.suppress(OSError):
        marker.unlink()
    handle = _held.pop(str(marker), None)
    if handle is not None:
        handle.close()


def running_processes(stage, max_age_s: float = 86400.0) -> list[str]:
    """``host-pid`` of the processes computing ``stage`` now: a marker of this host whose lock
    is held (its process lives), or one of another host touched in the last ``max_age_s``
    seconds (its process cannot be checked from here); a marker left by a killed process is
    stale."""
    folder = stage.path / RUNNING_DIR
    if not folder.is_dir():
        return []
    live = []
    for marker in sorted(folder.iterdir()):
        try:
            age = time.time() - marker.stat().st_mtime
        except OSError:
            continue
        alive = marker_alive(marker)
        if alive or (alive is None and age < max_age_s):
            live.append(marker.name)
    return live


def marker_alive(marker: Path) -> bool | None:
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
        return str(marker) in _held
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


@contextlib.contextmanager
def exclusive(stage, label: str, waiting: Callable[[], None]) -> Iterator[None]:
    """Hold ``stage``'s lock ``locks/<label>`` (``fcntl.flock``) while the block runs: a
    second identical run (same stage, same shard) waits for the first, calling ``waiting()``
    first (which may raise instead, to refuse), then finds its items done.  The kernel drops
    the lock when its process dies, so a killed run leaves no stale lock.  Where the file
    system has no locks (some network file systems) the block runs unlocked."""
    import fcntl

    stage._check_on_disk()
    stage.store.check_writable()
    make_dirs(stage.path / "locks")
    with writing(stage.path / "locks" / label):
        handle = open(stage.path / "locks" / label, "a+b")  # noqa: SIM115 - held below
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
