"""Friendly names: ``STORE/names/<NAME>`` points to a stage folder of the same store, so that
commands take names instead of keys (``names/.running/<NAME>`` marks a run that will move the
name once it completes: :mod:`featpipe.stages.base`).

A name file holds the stage folder, then on a second line the checksum of the name and that
folder (:func:`pointer_bytes`, :func:`featpipe.checksums.name_checksum`), so a name file
copied onto another name does not pass; it is written atomically.  A name never points outside
its store's ``stages/``: anything but a stage folder name is a :class:`DamagedName`.
"""

from __future__ import annotations

import re
from pathlib import Path

from featpipe.checksums import CHECKSUM, name_checksum
from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_write_bytes, first_line, make_dirs
from featpipe.store.layout import STAGE_FOLDER
from featpipe.suggest import did_you_mean

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class DamagedName(FeatpipeError):
    """A name file (or an unfinished run's marker) that is damaged or holds no stage folder;
    ``featpipe cache verify --repair`` removes it and a re-run of the command that named the
    stage names it again."""


def pointer_bytes(name: str, folder: str) -> bytes:
    """The content of name file ``name`` pointing to stage ``folder``: the folder, then the
    checksum of both (:func:`featpipe.checksums.name_checksum`), one line each."""
    return f"{folder}\n{name_checksum(name, folder)}\n".encode()


def set_name(store, name: str, stage) -> None:
    """Point ``name`` of ``store`` at ``stage`` (atomic; an existing name is moved)."""
    if not NAME_PATTERN.match(name):
        raise FeatpipeError(
            f"invalid name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)"
        )
    make_dirs(store.names_dir)
    atomic_write_bytes(store.names_dir / name, pointer_bytes(name, stage.name))


def read_pointer(store, path: Path, name: str, what: str) -> str:
    """The stage folder a name file of ``store`` (``names/NAME``, ``names/.running/NAME``:
    ``what``) points to, checked against its checksum (:func:`pointer_bytes`); a file
    without one is read as written before featpipe kept them, unless the stage it points to
    was written with checksums.  Damage is a :class:`DamagedName`."""
    label = f"{what} {name!r}: {path}"
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as err:
        raise DamagedName(f"{label} is damaged ({first_line(err)})") from None
    except OSError as err:
        raise FeatpipeError(f"{label} is unreadable ({first_line(err)})") from None
    lines = text.split("\n")
    folder = lines[0].strip()
    if not STAGE_FOLDER.match(folder):
        raise DamagedName(f"{label} holds {folder[:200]!r}, not a stage folder of this "
                          "store (kind-key); names never point outside their store's "
                          "stages/")
    if text == pointer_bytes(name, folder).decode():
        return folder
    recorded = lines[1].strip() if len(lines) > 1 else ""
    if recorded == name_checksum(name, folder):  # the sum holds: bytes cut or added
        raise DamagedName(f"{label} is damaged (its checksum holds, but its bytes are not "
                          "those featpipe writes: cut short, or bytes added)")
    if recorded and CHECKSUM.match(recorded):
        raise DamagedName(f"{label} is damaged (checksum {name_checksum(name, folder)} of "
                          f"its name and stage differs from {recorded} recorded "
                          "when it was written)")
    if any(line.strip() for line in lines[1:]) or _checksummed(store, folder):
        raise DamagedName(f"{label} is damaged (its checksum is missing, and the stage "
                          f"{folder} it points to was written with checksums)")
    return folder  # written before featpipe kept checksums of names


def _checksummed(store, folder: str) -> bool:
    """Whether stage folder ``folder`` of ``store`` opens and was written with checksums."""
    try:
        return store.stage_by_folder(folder).checksummed
    except FeatpipeError:
        return False


def names(store, problems: list[str] | None = None) -> dict[str, str]:
    """All valid names of ``store`` and the stage folder each points to; a corrupt name file
    is left out (and described in ``problems`` when a list is given)."""
    if not store.names_dir.is_dir():
        return {}
    found = {}
    for path in sorted(store.names_dir.iterdir()):
        if not NAME_PATTERN.match(path.name) or not path.is_file():
            continue
        try:
            found[path.name] = store.read_name(path.name)
        except FeatpipeError as err:
            if problems is not None:
                problems.append(str(err))
    return found


def resolve(store, name: str):
    """The stage ``name`` of ``store`` points to; a stage folder name (``kind-key``) works
    too; a name in ``store.planned`` gives its planned stage."""
    if name in store.planned:
        return store.planned[name]
    store.require()
    if NAME_PATTERN.match(name) and (store.names_dir / name).is_file():
        folder = store.read_name(name)
        if not (store.stages_dir / folder / "stage.json").exists():
            raise FeatpipeError(f"name {name!r} points to missing stage {folder}")
        return store.stage_by_folder(folder)
    if STAGE_FOLDER.match(name) and (store.stages_dir / name / "stage.json").exists():
        return store.stage_by_folder(name)
    known = store.names()
    hint = did_you_mean(name, known)
    raise FeatpipeError(
        f"no stage named {name!r} in store {store.root}{': ' + hint if hint else ''} "
        f"(names: {', '.join(known) or 'none yet'}; see `featpipe cache ls`)"
    )
