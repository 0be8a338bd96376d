"""A stage's records: ``stage.json`` (what the stage is) and the record files its key
determines (``items.csv``, ``read-hashes.json``, ``view.json``), whose checksums ``stage.json``
keeps (``files``).

``stage.json`` holds the kind, key, canonical parameters, input stage folders, dtype, item
count, format version, package versions, creation time and host, the checksum rules the
stage is written with (``checksums``, :data:`featpipe.checksums.CHECKSUM_FORMAT`) and
``files``; it is sealed to its place (:func:`featpipe.checksums.seal_json`, owner
:func:`record_owner`).  It is created race-free (a temporary file hard-linked into place,
which fails when another process got there first), after the record files it sums.  A damaged
``stage.json`` is a :class:`DamagedStage` (``cache verify --repair`` removes the stage), a
damaged or missing record file a :class:`DamagedRecord` (``--repair`` removes it, the re-run
writes it again: :func:`restore_records`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import zlib
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

import numpy as np

from featpipe import FORMAT_VERSION, __version__
from featpipe.checksums import (
    CHECKSUM_FORMAT,
    ChecksumError,
    as_text,
    check,
    seal_json,
    unseal_json,
)
from featpipe.errors import FeatpipeError
from featpipe.fileio import HOST, atomic_write_bytes, make_dirs, os_reason, writing
from featpipe.manifest import Manifest
from featpipe.store.layout import STAGE_FOLDER

log = logging.getLogger(__name__)

_VERSIONED_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "opencv-python-headless")
#: What a damaged stage record's error says to do.
REPAIR_STAGE = ("`featpipe cache verify --repair` removes the stage (and the names pointing at "
                "it); then run the command that computed it again")


class DamagedStage(FeatpipeError):
    """A stage whose ``stage.json`` is damaged or corrupt: it cannot be opened, and what it
    computed cannot be trusted; ``featpipe cache verify --repair`` removes it."""

    def __init__(self, message: str):
        super().__init__(f"{message}; {REPAIR_STAGE}")


class DamagedRecord(FeatpipeError):
    """A record file of a stage (``items.csv``, ``read-hashes.json``) that differs from the
    checksum ``stage.json`` keeps of it, or is missing: ``featpipe cache verify --repair``
    removes it and a re-run of the stage's command writes it again."""


def record_owner(folder: str, name: str) -> str:
    """What a stage's record file ``name`` (``stage.json``, ``packed/pack.json``) is sealed to:
    its place in the store, so that a record copied to another stage does not pass."""
    return f"stages/{folder}/{name}"


def _package_versions() -> dict[str, str]:
    versions = {"featpipe": __version__}
    for name in _VERSIONED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


# -- stage.json -------------------------------------------------------------------------------

def read_meta(path: Path) -> dict:
    """The metadata in ``stage.json`` of stage folder ``path`` (its seal removed), checked:
    a missing one is a :class:`FeatpipeError`, a corrupt or damaged one a
    :class:`DamagedStage`."""
    meta_path = path / "stage.json"
    try:
        raw = meta_path.read_bytes()
        meta = json.loads(raw.decode())
    except FileNotFoundError:
        raise FeatpipeError(f"no stage at {path} (stage.json missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedStage(f"{meta_path}: corrupt stage metadata ({err})") from None
    except OSError as err:
        raise FeatpipeError(f"{meta_path}: unreadable ({err.strerror})") from None
    problem = _meta_problem(meta, path.name)
    if problem:
        raise DamagedStage(f"{meta_path}: corrupt stage metadata ({problem})")
    try:
        _, sealed = unseal_json(raw, record_owner(path.name, "stage.json"), meta_path)
    except ChecksumError as err:
        raise DamagedStage(f"{meta_path}: damaged stage metadata ({err})") from None
    if not sealed and "checksums" in meta:
        raise DamagedStage(f"{meta_path}: damaged stage metadata (its checksum is "
                           "missing, and it was written with checksums)")
    meta.pop("crc32", None)
    return meta


def _meta_problem(meta, folder: str) -> str | None:
    """Why ``stage.json`` content is not a stage's metadata, or ``None``."""
    if not isinstance(meta, dict):
        return f"not a JSON object but {type(meta).__name__}"
    for key, kind in (("kind", str), ("key", str), ("params", dict), ("inputs", list)):
        if not isinstance(meta.get(key), kind):
            return f"{key!r} missing or not a {kind.__name__}"
    if not all(isinstance(name, str) and STAGE_FOLDER.match(name) for name in meta["inputs"]):
        return "'inputs' must list stage folders (kind-key)"
    if f"{meta['kind']}-{meta['key']}" != folder:
        return f"it describes {meta['kind']}-{meta['key']}, not the folder {folder}"
    try:
        if np.dtype(meta.get("dtype", "float32")).kind != "f":
            raise TypeError
    except TypeError:
        return f"'dtype' must be a floating dtype, got {meta.get('dtype')!r}"
    return None


def new_meta(kind: str, key: str, params: dict, inputs: list[str], dtype: str, n_items: int,
             records: Mapping[str, bytes]) -> dict:
    """The metadata of a new stage, with the checksums of its record files ``records``."""
    return {
        "kind": kind,
        "key": key,
        "params": params,
        "inputs": inputs,
        "dtype": dtype,
        "n_items": n_items,
        "format": FORMAT_VERSION,
        "versions": _package_versions(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": HOST,
        "checksums": CHECKSUM_FORMAT,
        "files": {name: as_text(zlib.crc32(data)) for name, data in records.items()},
    }


def meta_bytes(folder: str, meta: Mapping) -> bytes:
    """The bytes of ``stage.json`` of stage folder ``folder``: indented, sorted, sealed."""
    text = json.dumps(meta, indent=2, sort_keys=True).encode() + b"\n"
    return seal_json(text, record_owner(folder, "stage.json"))


def create(path: Path, meta: Mapping, records: Mapping[str, bytes]) -> None:
    """Make stage folder ``path``: its record files, then ``stage.json`` hard-linked into
    place (another process that got there first wins: its metadata is identical by key)."""
    make_dirs(path)
    for name, data in records.items():
        atomic_write_bytes(path / name, data)
    tmp = path / f"stage.json.tmp.{HOST}.{os.getpid()}"
    try:
        with writing(path / "stage.json"):
            tmp.write_bytes(meta_bytes(path.name, meta))
            try:
                os.link(tmp, path / "stage.json")
            except FileExistsError:
                pass  # another process created it first; its metadata is identical by key
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def add_file(stage, name: str, data: bytes) -> None:
    """Write record file ``name`` of an existing ``stage``, then ``stage.json`` again with
    its checksum in ``files`` (a view made after its stage: :mod:`featpipe.store.views`)."""
    files = stage.meta.get("files") or {}
    atomic_write_bytes(stage.path / name, data)
    meta = dict(stage.meta, files=dict(files, **{name: as_text(zlib.crc32(data))}))
    atomic_write_bytes(stage.path / "stage.json", meta_bytes(stage.name, meta))
    stage.meta = meta


# -- record files -----------------------------------------------------------------------------

def read_record(stage, name: str) -> bytes | None:
    """The bytes of record file ``name`` of ``stage``, checked against the checksum
    ``stage.json`` keeps of it; None when there is neither the file nor a checksum of it.  A
    damaged or missing record is a :class:`DamagedRecord`."""
    path = stage.path / name
    expected = (stage.meta.get("files") or {}).get(name)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if expected is None:
            return None
        raise DamagedRecord(f"stage {stage.name}: {path} is missing; a re-run of the "
                            "stage's command writes it again") from None
    except OSError as err:
        raise FeatpipeError(f"stage {stage.name}: {path} is unreadable "
                            f"({os_reason(err)})") from None
    try:
        check(path, as_text(zlib.crc32(raw)), expected)
    except ChecksumError as err:
        raise DamagedRecord(f"stage {stage.name}: damaged: {err}; `featpipe cache verify "
                            "--repair` removes it and a re-run of the stage's command "
                            "writes it again") from None
    return raw


def restore_records(stage, records: Mapping[str, bytes | Callable[[], bytes]]) -> None:
    """Write again the record files of ``records`` (their bytes, or a function making them)
    that are missing (``verify --repair`` removed them) or damaged (their checksum is not the
    one ``stage.json`` keeps: a re-run notices, for the price of a CRC of the file), when the
    bytes this run has are those ``stage.json`` keeps the checksum of; a record of other
    bytes is an error (an ``items.csv`` whose item paths moved)."""
    expected = stage.meta.get("files") or {}
    for name, data in records.items():
        path = stage.path / name
        if name not in expected:
            continue
        try:
            held = as_text(zlib.crc32(path.read_bytes()))
        except FileNotFoundError:
            held = None
        except OSError as err:
            raise FeatpipeError(f"stage {stage.name}: {path} is unreadable "
                                f"({os_reason(err)})") from None
        if held == expected[name]:
            continue
        data = data() if callable(data) else data
        if as_text(zlib.crc32(data)) != expected[name]:
            raise FeatpipeError(f"stage {stage.name}: {path} is "
                                f"{'missing' if held is None else 'damaged'} and this run "
                                "would write other bytes than it held (item paths that "
                                f"moved?); remove the stage (`featpipe cache rm {stage.name}`) "
                                "and run the command again")
        if held is not None:
            log.warning("stage %s: %s was damaged (checksum %s, not %s): written again",
                        stage.name, path, held, expected[name])
        atomic_write_bytes(path, data)


def item_list(stage) -> Manifest:
    """The manifest rows of ``stage``'s ``items.csv`` (none: an empty manifest)."""
    path = stage.path / "items.csv"
    raw = stage.read_record("items.csv")
    if raw is None:
        return Manifest([], root=stage.path)
    try:
        text = raw.decode()
    except UnicodeDecodeError as err:
        raise FeatpipeError(f"manifest {path} is not UTF-8 ({err.reason})") from None
    items, problems = Manifest.parse(text, stage.path, str(path))
    if problems:
        raise FeatpipeError(f"manifest {path}, {problems[0]}")
    return items
