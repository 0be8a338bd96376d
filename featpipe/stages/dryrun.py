"""What a dry run knows of stages before they exist, so that every stage of a plan is sized.

A dry run (``featpipe run --dry-run``, or ``--dry-run`` of one command) computes each stage's
key and plans each later step on the stages planned for the earlier ones
(:attr:`featpipe.store.Store.planned`).  Sizing them needs what the items will look like:

* an extraction knows each item's sampled frames from its container (frame count and rate)
  and the layout of what it stores; it records them on its planned stage as
  :class:`PlannedItems`, with a synthetic item of any length shaped as the stage will hold it;
* an ``encode`` step runs its real encoder on synthetic items of 2 and 3 frames of its input
  (planned, or the first item of a computed input): bytes at rest are affine in the frames
  (a vector per item, or a row per frame), so two lengths give each item's size exactly;
* a fit (``fit gmm``, ``fit pca``, ``fit standardize``) fits a stand-in of the model on
  synthetic rows of the input's width, with the real parameters (K, PCA dimensions, groups)
  and one iteration: its arrays have the real model's shapes and sizes, and the steps after
  it are built on it (:meth:`featpipe.store.Stage.save_model` of a planned stage keeps it in
  memory; nothing is written).

Keys of stages planned on a stand-in model are the real ones (a key holds the model stage's
key, which the fit's parameters and inputs fix); only the values differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from featpipe.store.item_files import NPY_HEADER_BYTES

#: rows of synthetic input a stand-in model is fitted on (at least 2 per component)
STAND_IN_ROWS = 512

#: whether the dry runs of this context are the check a real run makes first (a quick plan:
#: a sample of each extraction's items probed, nothing calibrated, nothing listed)
_QUICK: ContextVar[bool] = ContextVar("featpipe_quick_plan", default=False)


@contextlib.contextmanager
def quick_plan(active: bool = True):
    """Plan quickly inside the block (:data:`_QUICK`): the check before a real run."""
    token = _QUICK.set(active)
    try:
        yield
    finally:
        _QUICK.reset(token)


def planning_quickly() -> bool:
    """Whether a dry run is the quick check of a real run (:func:`quick_plan`)."""
    return _QUICK.get()


@dataclass
class PlannedItems:
    """A planned stage's items: ``example(T)`` gives a synthetic item of ``T`` sampled frames
    as the stage will hold it (array and sidecars); ``frames`` each item's sampled frames and
    ``rows`` its rows (local features, samples: several per frame), from the containers."""

    example: Callable[[int], tuple[np.ndarray, dict]]
    frames: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def width(self) -> int:
        """Values per row of the stage's items."""
        return int(self.example(2)[0].shape[-1])


def item_bytes(array: np.ndarray, sidecars: Mapping[str, np.ndarray]) -> int:
    """Bytes at rest of an item: its array and sidecars, each an ``.npy`` with its header."""
    return sum(np.asarray(a).nbytes + NPY_HEADER_BYTES for a in [array, *sidecars.values()])


def affine_bytes(example: Callable[[int], tuple[np.ndarray, dict]]) -> tuple[int, int]:
    """``(fixed, per frame)`` bytes of an item from examples of 2 and 3 frames
    (:func:`affine`)."""
    return affine(*(item_bytes(*example(frames)) for frames in (2, 3)))


def affine(two: int, three: int) -> tuple[int, int]:
    """``(fixed, per frame)`` of a size that is affine in the frames, ``fixed + per_frame ×
    T``, from its values at T = 2 and T = 3: the size at no frame and the step."""
    per_frame = three - two
    return two - 2 * per_frame, per_frame


def encoded_example(encoder, example, item_id: str = "dry-run"):
    """``example`` (a function of T) passed through ``encoder`` (an ``encode`` method's
    :class:`~featpipe.encode.registry.ItemEncoder`) as the encode stage stores it."""
    from featpipe.chain import as_stored
    from featpipe.parallel import ItemOutput

    def encoded(frames: int):
        array, extras = example(frames)
        value = encoder.encode_batch([array], [extras])[0]
        if not isinstance(value, ItemOutput):
            value = ItemOutput(value)
        return as_stored(item_id, value.array, np.float32), {
            k: np.asarray(v) for k, v in value.extras.items()}

    return encoded


def computed_example(source, item_id: str):
    """A computed stage's item ``item_id`` as an example of any length: its first ``T`` rows
    (repeated when it has fewer), with the per-row sidecars cut alike."""
    array = np.asarray(source.read_item(item_id))
    extras = source.extras_of(item_id)
    if array.ndim != 2 or not len(array):
        return lambda frames: (array, extras), {}

    def example(frames: int):
        take = np.arange(frames) % len(array)
        rows = {k: np.asarray(v)[take] for k, v in extras.items()
                if np.ndim(v) and len(v) == len(array) and k != "frame_index"}
        if "frame_index" in extras:
            rows["frame_index"] = np.arange(frames, dtype=np.asarray(
                extras["frame_index"]).dtype)
        return array[take], {**extras, **rows}

    return example, {"rows": len(array)}


def source_lengths(source, ids: Sequence[str]) -> dict[str, int]:
    """Rows of each item of ``ids`` in ``source``: planned (from the containers) or computed
    (from each item's ``.npy`` header, nothing loaded)."""
    if source.planned_items is not None:
        planned = source.planned_items
        return {i: planned.rows.get(i, planned.frames.get(i, 0)) for i in ids}
    found = {}
    for item_id in ids:
        try:
            array = source.read_item(item_id, mmap=True)
            found[item_id] = int(array.shape[0]) if array.ndim else 1
        except Exception:  # noqa: BLE001 - not computed yet: counted as the others' mean
            continue
    return found


def total_bytes(fixed: int, per_frame: int, frames: Mapping[str, int], ids: Sequence[str]
                ) -> int:
    """Bytes at rest of items ``ids`` of ``fixed + per_frame × frames`` each; an item of
    unknown length counts as the mean of the others."""
    known = [frames[i] for i in ids if i in frames]
    mean = sum(known) / len(known) if known else 0
    return round(sum(fixed + per_frame * frames.get(i, mean) for i in ids))


def stand_in_rows(width: int, n_components: int = 1, seed: int = 0) -> np.ndarray:
    """Synthetic rows (float32, seeded) to fit a stand-in model of ``width`` values on."""
    rows = max(STAND_IN_ROWS, 4 * n_components)
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


def input_width(source, ids: Sequence[str]) -> int:
    """Values per row of ``source``'s items: planned, or read from its first computed item."""
    if source.planned_items is not None:
        return source.planned_items.width()
    for item_id in ids:
        try:
            return int(source.read_item(item_id, mmap=True).shape[-1])
        except Exception:  # noqa: BLE001 - the next computed item
            continue
    raise ValueError(f"stage {source.name} has no computed item to read its width from")


def sampled_rows(source, ids: Sequence[str], sample: int | None) -> int | None:
    """The rows :func:`featpipe.stages.fitting.sample_descriptors` will draw from ``ids``:
    up to ⌈sample / items⌉ per item, at most ``sample`` in all (None: unknown)."""
    lengths = source_lengths(source, ids)
    if not lengths:
        return None
    per_item = None if sample is None else -(-int(sample) // max(len(ids), 1))
    rows = sum(n if per_item is None else min(n, per_item) for n in lengths.values())
    rows = round(rows * len(ids) / len(lengths))
    return rows if sample is None else min(rows, int(sample))


def model_bytes(stage) -> int:
    """Bytes at rest of a (planned) fit stage's models: arrays, metadata and checksums."""
    import json

    total = 0
    for name in stage.model_names():
        arrays, meta = stage.load_model(name)
        total += sum(np.asarray(a).nbytes + NPY_HEADER_BYTES for a in arrays.values())
        total += len(json.dumps(meta, default=str)) + 64
    return total
