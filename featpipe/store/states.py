"""What a stage's ledgers say of each item, looked up: done (with the checksums and batch file
of its latest done line), failed (with its error), or removed.

The states come folded from the index (:mod:`featpipe.store.index`); the table of one stage is
read once per process and kept for the reads of its items that follow (:func:`state_of`),
read again when an item is not in it or a caller asks (the item may have been computed since).
"""

from __future__ import annotations

from featpipe.store import index as stage_index

#: the item states of the index, per stage folder, read once per process (see
#: :func:`state_of`)
_tables: dict[str, stage_index.Table] = {}


def item_table(stage, fresh: bool = False) -> stage_index.Table:
    """The item states of ``stage``'s ledgers as they are now, kept for this process's later
    reads of the stage's items; with ``fresh``, folded from every ledger line, the index on
    disk not trusted (``cache verify``)."""
    table = stage.index(need_table=True, trust=not fresh).table
    _tables[str(stage.path)] = table
    return table


def state_of(stage, item_id: str, reload: bool = False) -> stage_index.ItemState | None:
    """The folded ledger state of ``item_id``: the index's table is read once per process
    and stage, again when ``reload`` or the item is not in it."""
    table = _tables.get(str(stage.path))
    state = None if table is None or reload else table.get(item_id)
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
