"""What a stage's ledgers say of each item, looked up: done (with the checksums and batch file
of its latest done line), failed (with its error), or removed.

The states come folded from the index (:mod:`featpipe.store.index`); the table of one stage is
read once per process and kept for the reads of its items that follow (:func:`state_of`),
looked up again when an item is not in it or a caller asks (the item may have been computed
since): the kept table is used again as long as the stage's ledgers are unchanged
(:func:`_ledgers_now`: their names, inodes, sizes and modification times), so a read per
item never folds the ledgers or reads the table per item, whatever state the index is in.
"""

from __future__ import annotations

from pathlib import Path

from featpipe.store import index as stage_index

#: per stage folder, the item states of its ledgers and what the ledgers were when they were
#: folded (:func:`_ledgers_now`), kept for this process's reads (see :func:`state_of`)
_tables: dict[str, tuple[tuple | None, stage_index.Table]] = {}


def _ledgers_now(stage_path: Path) -> tuple | None:
    """``(name, inode, size, mtime_ns)`` of each ledger of the stage (None: one cannot be
    read): equal twice, the ledgers hold the same lines, and so fold to the same table."""
    found = []
    for path in stage_index.ledger_files(stage_path):
        try:
            info = path.stat()
        except OSError:
            return None
        found.append((path.name, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(found)


def item_table(stage, fresh: bool = False) -> stage_index.Table:
    """The item states of ``stage``'s ledgers as they are now, kept for this process's later
    reads of the stage's items (the kept one while the ledgers are unchanged); with
    ``fresh``, folded from every ledger line, the index on disk not trusted (``cache
    verify``)."""
    now = _ledgers_now(stage.path)
    kept = _tables.get(str(stage.path))
    if not fresh and now is not None and kept is not None and kept[0] == now:
        return kept[1]
    table = stage.index(need_table=True, trust=not fresh).table
    _tables[str(stage.path)] = (now, table)
    return table


def state_of(stage, item_id: str, reload: bool = False) -> stage_index.ItemState | None:
    """The folded ledger state of ``item_id``: the index's table is read once per process
    and stage, looked up again when ``reload`` or the item is not in it."""
    kept = _tables.get(str(stage.path))
    state = None if kept is None or reload else kept[1].get(item_id)
    return stage.item_table().get(item_id) if state is None else state


def recorded_sums(stage, item_id: str, reload: bool = False) -> dict[str, str] | None:
    """The checksums the ledger recorded for the files of done item ``item_id`` (by
    suffix), or None (not done, or done before featpipe kept checksums)."""
    state = state_of(stage, item_id, reload)
    return state.sums if state is not None and state.status == "done" else None


def failed(stage) -> dict[str, str]:
    """Items whose latest state is failed, with their recorded error (a done line, in any
    ledger, makes an item done for good); a view's, those of its source."""
    view = stage.view()
    if view is not None:
        return {i: e for i, e in view[0].failed().items() if i in set(stage.items.ids)}
    return dict(stage.index().failed)
