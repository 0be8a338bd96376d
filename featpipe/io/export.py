"""A stage's items as one ``.npz``, HDF5 (``.h5``/``.hdf5``) or MATLAB (``.mat``) file.

The suffix of the output picks the format (any other suffix is refused): ``.npz`` through
``np.savez`` (no pickle, no object arrays), ``.h5``/``.hdf5`` through h5py (one dataset per
name below, strings as UTF-8), ``.mat`` through ``scipy.io.savemat`` (v5, uncompressed like
the other two; string lists as cell arrays; every numeric array that is not 2-D also gets
``<name>_shape``, its numpy shape, since MATLAB has no 1-D arrays and drops trailing dimensions
of size 1).  In ``.mat`` a ragged ``X`` (and a ragged sidecar) is a cell array instead
(VideoDarwin's layout): ``X{i}`` is the T_i x D matrix of item i, beside ``ids{i}``, and
``X_trailing`` the item shape after T (for items that are not 2-D); there are no offsets.
All three hold the same names otherwise:

- ``ids`` (n,) unicode; ``labels`` (n,) unicode, ``;``-joined for multi-label items;
  ``classes`` (c,) unicode, sorted; ``splits`` (n, n_splits) unicode: ``train``, ``test`` or
  ``''``; ``stage`` () unicode: the stage folder (``kind-key``).
- ``layout`` () unicode, ``stacked`` or ``ragged``:
  - ``stacked`` (every item has the same shape): ``X`` has shape (n, *item shape) and item i
    is ``X[i]``.
  - ``ragged`` (same trailing shape, different first dimension, e.g. sequences of different
    length): ``X`` is the concatenation of the items along axis 0 and ``offsets`` (n + 1,)
    int64 delimits them: item i is ``X[offsets[i]:offsets[i + 1]]``.
- sidecars (``timestamps``, ``positions``, ``frame_index``...): ``sidecar_<name>`` with
  ``sidecar_<name>_layout`` and, when ragged, ``sidecar_<name>_offsets``, by the same rule.
  When only some items have a sidecar, ``sidecar_<name>_present`` (n,) bool marks them and
  the others hold zero rows (ragged).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError, ParameterError
from featpipe.fileio import (
    atomic_save_npz,
    atomic_write,
    check_output_path,
    make_dirs,
    remove_stale_tmps,
)
from featpipe.store import Stage

#: Output suffix -> format.
FORMATS = {".npz": "npz", ".h5": "hdf5", ".hdf5": "hdf5", ".mat": "mat"}


def export_format(output: str | Path) -> str:
    """The format named by the suffix of ``output``; another suffix is a usage error."""
    suffix = Path(output).suffix.lower()
    if suffix not in FORMATS:
        raise ParameterError("output", f"{str(output)!r}: the suffix picks the format; use "
                             ".npz, .h5/.hdf5 or .mat")
    return FORMATS[suffix]


def export_stage(stage: Stage, output: str | Path, partial: bool = False
                 ) -> tuple[dict[str, np.ndarray], int]:
    """Write the export file of ``stage`` to ``output``; returns its arrays and the number of
    items not computed (an incomplete stage is refused unless ``partial``)."""
    fmt = export_format(output)
    check_output_path(output, "output", stage.store.root)
    ids, missing = computed_ids(stage, partial)
    arrays = export_arrays(stage, ids)
    path = Path(output)
    make_dirs(path.parent)
    remove_stale_tmps(path)
    if fmt == "npz":
        atomic_save_npz(path, arrays)
    elif fmt == "hdf5":
        atomic_write(path, lambda handle: _write_hdf5(handle, arrays))
    else:
        from featpipe.io import matlab

        atomic_write(path, lambda handle: matlab.save(handle, _matlab_arrays(arrays)))
    return arrays, missing


def computed_ids(stage: Stage, partial: bool = False) -> tuple[list[str], int]:
    """The ids of ``stage``'s computed items, in manifest order, and how many are not
    computed; an incomplete stage is an error unless ``partial``."""
    done = stage.done_ids()
    ids = [i for i in stage.items.ids if i in done]
    missing = len(stage.items) - len(ids)
    if missing and not partial:
        first = next(i for i in stage.items.ids if i not in done)
        raise FeatpipeError(f"stage {stage.name} is incomplete: {missing} of {len(stage.items)} "
                            f"items not computed (first: {first!r}); re-run it, or pass "
                            "--partial")
    return ids, missing


def _ragged_keys(arrays: dict[str, np.ndarray]):
    """(data, offsets) names of every ragged array of an export (``X`` and sidecars)."""
    for key, value in arrays.items():
        if key == "layout" or (key.startswith("sidecar_") and key.endswith("_layout")):
            if str(value) == "ragged":
                data = "X" if key == "layout" else key[:-len("_layout")]
                yield data, "offsets" if key == "layout" else f"{data}_offsets"


def _matlab_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The export for ``.mat``: ragged arrays as (n, 1) cell arrays of per-item matrices with
    ``<name>_trailing``, and ``<name>_shape`` beside each numeric array that is not 2-D."""
    out = dict(arrays)
    for data, offsets_key in _ragged_keys(arrays):
        values, offsets = out.pop(data), out.pop(offsets_key)
        cells = np.empty((len(offsets) - 1, 1), dtype=object)
        for i in range(len(offsets) - 1):
            cells[i, 0] = values[offsets[i]:offsets[i + 1]]
        out[data] = cells
        out[f"{data}_trailing"] = np.array(values.shape[1:], dtype=np.int64)
    shapes = {f"{key}_shape": np.array(value.shape, dtype=np.int64) for key, value in
              out.items() if value.dtype.kind not in "UO" and value.ndim != 2
              and not key.endswith("_trailing")}
    return {**out, **shapes}


def _write_hdf5(handle, arrays: dict[str, np.ndarray]) -> None:
    import h5py

    with h5py.File(handle, "w") as out:
        for key, value in arrays.items():
            if value.dtype.kind == "U":
                out.create_dataset(key, data=value.astype(object),
                                   dtype=h5py.string_dtype("utf-8"))
            else:
                out.create_dataset(key, data=value)


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
    for item_id, array in zip(ids, arrays, strict=True):
        if array.ndim != first.ndim or array.shape[1:] != first.shape[1:]:
            raise FeatpipeError(f"cannot export stage {stage.name}: item {item_id!r} has shape "
                                f"{array.shape} but item {ids[0]!r} has {first.shape} "
                                "(trailing dimensions must agree)")
    out.update(_stack("X", arrays, "layout", "offsets"))
    extras = [stage.extras_of(item_id) for item_id in ids]
    for name in sorted({name for found in extras for name in found}):
        prefix = f"sidecar_{name}"
        present = np.array([name in found for found in extras])
        values = [np.asarray(found[name]) if name in found else None for found in extras]
        like = next(v for v in values if v is not None)
        values = [v if v is not None else np.zeros((0, *like.shape[1:]), like.dtype)
                  for v in values]
        if any(v.ndim != like.ndim or v.shape[1:] != like.shape[1:] for v in values):
            raise FeatpipeError(f"cannot export stage {stage.name}: sidecar {name!r} has "
                                "different trailing shapes across items")
        out.update(_stack(prefix, values, f"{prefix}_layout", f"{prefix}_offsets",
                          ragged=not present.all()))
        if not present.all():
            out[f"{prefix}_present"] = present
    return out


def _stack(key: str, arrays: list[np.ndarray], layout_key: str, offsets_key: str,
           ragged: bool = False) -> dict[str, np.ndarray]:
    """``stacked`` when every array has one shape (and not ``ragged``), else concatenated
    along axis 0 with offsets."""
    first = arrays[0]
    if not ragged and all(a.shape == first.shape for a in arrays):
        return {layout_key: np.array("stacked"), key: np.stack(arrays)}
    if first.ndim == 0:
        arrays = [a.reshape(1) for a in arrays]
    return {layout_key: np.array("ragged"), key: np.concatenate(arrays, axis=0),
            offsets_key: np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]
                                        ).astype(np.int64)}


def load_export(path) -> tuple[list[str], list[np.ndarray], dict[str, np.ndarray]]:
    """Read an export file (any of the three formats) back: ids, one array per item, and
    every array by name (``sidecars`` maps each sidecar to its per-item arrays, ``None``
    where an item has none)."""
    fmt = export_format(path)
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as data:
            fields = {key: data[key] for key in data.files}
    elif fmt == "hdf5":
        import h5py

        with h5py.File(path, "r") as data:
            fields = {key: (np.array(node.asstr()[()], dtype=str)
                            if h5py.check_string_dtype(node.dtype) else node[()])
                      for key, node in data.items()}
    else:
        from featpipe.io import matlab

        fields = matlab.load(path)
        for key in ("ids", "labels", "classes"):  # MATLAB has no 1-D arrays
            fields[key] = fields[key].reshape(-1)
        for key in [k for k in fields if k.endswith("_shape")]:
            fields[key[:-len("_shape")]] = fields[key[:-len("_shape")]].reshape(
                fields.pop(key).reshape(-1))
        for key in [k for k in fields if k.endswith("_trailing")]:
            trailing = tuple(int(n) for n in fields.pop(key).reshape(-1))
            data = key[:-len("_trailing")]
            fields[data] = [np.asarray(cell).reshape(-1, *trailing) if trailing
                            else np.asarray(cell).reshape(-1) for cell in fields[data].ravel()]
    ids = [str(i) for i in np.asarray(fields["ids"]).reshape(-1)]
    items = _unstack(fields, "X", "layout", "offsets", len(ids))
    sidecars = {}
    for key in [k for k in fields if k.endswith("_layout") and k.startswith("sidecar_")]:
        prefix = key[:-len("_layout")]
        values = _unstack(fields, prefix, key, f"{prefix}_offsets", len(ids))
        present = fields.get(f"{prefix}_present")
        sidecars[prefix[len("sidecar_"):]] = [
            v if present is None or present[i] else None for i, v in enumerate(values)]
    fields["sidecars"] = sidecars
    return ids, items, fields


def _unstack(fields, key: str, layout_key: str, offsets_key: str, n: int) -> list[np.ndarray]:
    X = fields[key]
    if isinstance(X, list):  # a cell array of a .mat file: one array per item already
        return X
    if str(np.asarray(fields[layout_key]).reshape(-1)[0]) == "stacked":
        return list(X.reshape(n, *X.shape[1:])) if X.ndim else [X]
    offsets = np.asarray(fields[offsets_key]).reshape(-1)
    return [X[offsets[i]:offsets[i + 1]] for i in range(n)]
