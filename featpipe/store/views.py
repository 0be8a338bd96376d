"""Views: a stage whose items are a column range of the items of one of its inputs (the last
axis), read from there, with some of their sidecars; it holds no arrays of its own.

A view's record, :data:`VIEW_FILE` (``view.json``), names the source stage folder, the two
column bounds and the sidecars kept; it is sealed to its place
(:func:`featpipe.checksums.seal_json`) and determined by the stage's key, so it is written
before ``stage.json`` (which keeps its checksum in ``files``) or added to it later
(:func:`make_view`).  It is part of the stage's own record: a damaged, missing or foreign view
record, or one whose source is gone, is a :class:`~featpipe.store.records.DamagedStage`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

from featpipe.checksums import ChecksumError, as_text, seal_json, unseal_json
from featpipe.errors import FeatpipeError
from featpipe.fileio import first_line
from featpipe.store import records
from featpipe.store.records import DamagedRecord, DamagedStage, record_owner

#: The record of a view stage: the input stage whose items it reads and the column range it
#: keeps; such a stage holds no arrays of its own.
VIEW_FILE = "view.json"


def view_bytes(folder: str, source: str, columns: slice, extras: Iterable[str]) -> bytes:
    """The content of the :data:`VIEW_FILE` of stage folder ``folder`` that reads the columns
    ``columns`` (and the sidecars ``extras``) of stage folder ``source``: sealed to its place
    (:func:`featpipe.checksums.seal_json`); determined by the stage's key, so it is also
    written before ``stage.json``, which keeps its checksum (``files``)."""
    record = {"source": source, "columns": [int(columns.start), int(columns.stop)],
              "extras": sorted(extras)}
    return seal_json(json.dumps(record, sort_keys=True).encode() + b"\n",
                     record_owner(folder, VIEW_FILE))


def make_view(stage, source, columns: slice, extras: Iterable[str]) -> None:
    """Make ``stage`` a view of ``source`` (one of its inputs): its items are the columns
    ``columns`` of ``source``'s (the last axis), with the sidecars ``extras`` of each;
    nothing is copied.  A stage that existed before (its source was not stored yet) gets the
    view's checksum added to ``stage.json`` after the view is written, so that a view record
    deleted later is damage, as for a view made with its stage; the record is determined by
    the key, so concurrent writers agree."""
    stage._check_on_disk()
    if source.name not in stage.input_names:
        raise FeatpipeError(f"stage {stage.name} cannot be a view of {source.name}, which "
                            "is not its input")
    data = view_bytes(stage.name, source.name, columns, extras)
    if (stage.meta.get("files") or {}).get(VIEW_FILE) == as_text(zlib.crc32(data)):
        return
    records.add_file(stage, VIEW_FILE, data)


def view_record(stage) -> dict | None:
    """The record in :data:`VIEW_FILE` of ``stage`` (None: not a view), checked against the
    checksum ``stage.json`` keeps of it (``files``) and against its own seal; a view record
    that is damaged, missing (``stage.json`` has its checksum) or not one of this stage is a
    :class:`DamagedStage`: part of the stage's own record."""
    path = stage.path / VIEW_FILE
    try:
        raw = stage.read_record(VIEW_FILE)
    except DamagedRecord as err:  # missing, or not the bytes stage.json keeps the sum of
        raise DamagedStage(f"{path}: damaged view record ({first_line(err)})") from None
    if raw is None:
        return None
    try:
        record, sealed = unseal_json(raw, record_owner(stage.name, VIEW_FILE), path)
    except ChecksumError as err:
        raise DamagedStage(f"{path}: damaged view record ({first_line(err)})") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise DamagedStage(f"{path}: corrupt view record ({first_line(err)})") from None
    if not sealed and stage.checksummed:
        raise DamagedStage(f"{path}: damaged view record (its checksum is missing, and "
                           "the stage was written with checksums)")
    if not (isinstance(record, dict) and record.get("source") in stage.input_names
            and isinstance(record.get("columns"), list) and len(record["columns"]) == 2
            and all(isinstance(c, int) and c >= 0 for c in record["columns"])
            and isinstance(record.get("extras"), list)):
        raise DamagedStage(f"{path}: corrupt view record (not one of this stage: an "
                           "input stage, two column bounds, the sidecars kept)")
    if not (stage.path.parent / record["source"] / "stage.json").is_file():
        raise DamagedStage(f"{path}: a view of stage {record['source']}, which is gone "
                           "(its items were read from there)")
    return record


def view_of(stage) -> tuple | None:
    """``(source stage, columns, sidecars kept)`` of a view ``stage``, else None."""
    record = view_record(stage)
    if record is None:
        return None
    start, stop = record["columns"]
    return (stage.store.stage_by_folder(record["source"]), slice(start, stop),
            tuple(str(e) for e in record["extras"]))
