"""A stage's items as one ``.npz`` file (no pickle, no object arrays).

Layout of the file written by ``featpipe export``:

- ``ids`` (n,) unicode; ``labels`` (n,) unicode, ``;``-joined for multi-label items;
  ``classes`` (c,) unicode, sorted; ``splits`` (n, n_splits) unicode: ``train``, ``test`` or
  ``''``; ``stage`` () unicode: the stage folder (``kind-key``).
- ``layout`` () unicode, ``stacked`` or ``ragged``:
  - ``stacked`` (every item has the same shape): ``X`` has shape (n, *item shape) and item i
    is ``X[i]``.
  - ``ragged`` (same trailing shape, different first dimension, e.g. sequences of different
    length): ``X`` is the concatenation of the items along axis 0 and ``offsets`` (n + 1,)
    int64 delimits them: item i is ``X[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_save_npz, check_output_path, make_dirs
from featpipe.store import Stage


def export_stage(stage: Stage, output: str | Path, partial: bool = False
                 ) -> tuple[dict[str, np.ndarray], int]:
    """Write the export file of ``stage`` to ``output``; returns its arrays and the number of
    items not computed (an incomplete stage is refused unless ``partial``)."""
    check_output_path(output, "output")
    done = stage.done_ids()
    ids = [i for i in stage.items.ids if i in done]
    missing = len(stage.items) - len(ids)
    if missing and not partial:
        first = next(i for i in stage.items.ids if i not in done)
        raise FeatpipeError(f"stage {stage.name} is incomplete: {missing} of {len(stage.items)} "
                            f"items not computed (first: {first!r}); re-run it, or pass "
                            "--partial")
    arrays = export_arrays(stage, ids)
    path = Path(output)
    make_dirs(path.parent)
    atomic_save_npz(path, arrays)
    return arrays, missing


def export_arrays(stage: Stage, ids: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays of the export file for ``ids`` of ``stage`` (see the module docstring)."""
    if not ids:
        raise FeatpipeError(f"stage {stage.name} has no computed items to export")
    arrays = [stage.read_item(item_id) for item_id in ids]
    first = arrays[0]
    items = stage.items
    n_splits = items.n_splits or 1
    out = {
        "ids": np.array(ids, dtype=str),
        "labels": np.array([items[i].label for i in ids], dtype=str),
        "classes": np.array(items.classes, dtype=str),
        "splits": np.array([[items[i].split(k) for k in range(1, n_splits + 1)] for i in ids],
                           dtype=str).reshape(len(ids), n_splits),
        "stage": np.array(stage.name),
    }
    if all(a.shape == first.shape for a in arrays):
        out["layout"] = np.array("stacked")
        out["X"] = np.stack(arrays)
        return out
    for item_id, array in zip(ids, arrays, strict=True):
        if array.ndim != first.ndim or array.shape[1:] != first.shape[1:]:
            raise FeatpipeError(f"cannot export stage {stage.name}: item {item_id!r} has shape "
                                f"{array.shape} but item {ids[0]!r} has {first.shape} "
                                "(trailing dimensions must agree)")
    out["layout"] = np.array("ragged")
    out["X"] = np.concatenate(arrays, axis=0)
    out["offsets"] = np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(
        np.int64)
    return out


def load_export(path) -> tuple[list[str], list[np.ndarray], dict[str, np.ndarray]]:
    """Read an export file back: ids, one array per item, and the other arrays by name."""
    with np.load(path, allow_pickle=False) as data:
        fields = {key: data[key] for key in data.files}
    ids = [str(i) for i in fields["ids"]]
    X = fields["X"]
    if str(fields["layout"]) == "stacked":
        items = list(X)
    else:
        offsets = fields["offsets"]
        items = [X[offsets[i]:offsets[i + 1]] for i in range(len(ids))]
    return ids, items, fields
