"""Where things are in a store, and what makes a folder one (docs/store.md)::

    STORE/stages/<kind>-<key>/      one folder per stage (:class:`featpipe.store.Stage`)
    STORE/names/<NAME>              a friendly name (:mod:`featpipe.store.names`)
    STORE/content-hashes.json       the content-hash cache (:mod:`featpipe.store.content`)

The checks a command makes of the store's folder before it writes (writable, not inside
another store) and the scan of its stage folders live here too.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from featpipe.errors import FeatpipeError, ParameterError, WriteError
from featpipe.fileio import TMP_NAME

#: A stage folder name, ``<kind>-<16 hex digits of its key>``: one path component, no dots.
STAGE_FOLDER = re.compile(r"^[a-z][a-z0-9-]*-[0-9a-f]{16}$")
_STAGE_FOLDER_BYTES = re.compile(STAGE_FOLDER.pattern.encode())
#: A stage folder without ``stage.json`` younger than this is being created, not broken.
CREATION_GRACE_S = 60.0
#: The content-hash cache of a store (:mod:`featpipe.store.content`), beside ``stages/`` and
#: ``names/``.
CACHE_NAME = "content-hashes.json"


def is_store(path: Path) -> bool:
    """Whether folder ``path`` holds a featpipe store: a ``stages/`` folder with a stage
    folder in it, a ``names/`` folder with a name file, or the content-hash cache."""
    def points_to_stage(name_file: Path) -> bool:
        with open(name_file, "rb") as handle:
            return bool(_STAGE_FOLDER_BYTES.match(handle.read(200).split(b"\n")[0]))

    try:
        if (path / CACHE_NAME).is_file():
            return True
        stages, names = path / "stages", path / "names"
        if stages.is_dir() and any(STAGE_FOLDER.match(p.name.split(".")[0])
                                   for p in stages.iterdir()):
            return True
        return names.is_dir() and any(p.is_file() and points_to_stage(p)
                                      for p in names.iterdir())
    except OSError:
        return False


def within(root: Path, path: Path) -> bool:
    """Whether ``path``, every link on the way resolved, is inside the store folder ``root``:
    what ``gc`` and ``verify --repair`` find by listing a folder they remove only then (a
    folder of a stage that is a link to another disk is never followed out of the store)."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def check_writable(root: Path) -> None:
    """A :class:`~featpipe.errors.WriteError` naming the store ``root`` when this process
    cannot write into its folder (a read-only file system, or no permission)."""
    folder = Path(os.path.abspath(root))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if os.access(folder, os.W_OK):
        return
    why = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else \
        "Permission denied: not writable by this user"
    raise WriteError(f"store {root} is read-only ({folder}: {why}): nothing was "
                     "written; run this command where the store can be written")


def check_not_nested(root: Path) -> None:
    """Refuse (a :class:`~featpipe.errors.ParameterError` for ``store``) a store folder
    ``root`` inside another store's folder: the outer store's ``gc`` and ``verify`` would
    take the inner store's files for their own."""
    absolute = Path(os.path.abspath(root))
    for parent in absolute.parents:
        if is_store(parent):
            raise ParameterError("store", f"{root} is inside the store {parent}; a "
                                          "store cannot hold another store: give a folder "
                                          "outside it")


def require(store) -> None:
    """A one-line error when the folder of ``store`` (a :class:`~featpipe.store.Store`) does
    not exist or is not a store."""
    if not store.root.is_dir():
        what = "is not a folder" if store.root.exists() else "does not exist"
        raise FeatpipeError(f"no store at {store.root}: the folder {what}")
    if not store.stages_dir.is_dir() and not store.names_dir.is_dir() and \
            any(store.root.iterdir()):
        raise FeatpipeError(f"{store.root} is not a featpipe store (no stages/ or names/ "
                            "folder in it)")


def scan(store) -> tuple[list, list[tuple[str, str]]]:
    """Every stage folder of ``store``: the stages that open, and ``(folder, problem)`` for
    the others (corrupt ``stage.json``, a stray folder), so one broken stage stops nothing."""
    if not store.stages_dir.is_dir():
        return [], []
    stages, problems = [], []
    for path in sorted(store.stages_dir.iterdir()):
        if TMP_NAME.search(path.name):  # a stage gc is deleting (or a killed gc left)
            continue
        if not path.is_dir() or not (path / "stage.json").exists():
            if path.is_dir() and STAGE_FOLDER.match(path.name) and \
                    time.time() - path.stat().st_mtime > CREATION_GRACE_S:
                problems.append((path.name, "stage.json missing"))
            continue
        try:
            stages.append(store.stage_by_folder(path.name))
        except FeatpipeError as err:
            problems.append((path.name, str(err)))
    return stages, problems
