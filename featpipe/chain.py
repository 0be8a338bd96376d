"""Steps that run inside the pass that makes their input: ``featpipe encode`` steps applied to
each item as soon as its extraction is done (``featpipe extract --temporal``, and the chains that
``featpipe run`` fuses), so the stages between the decode and the result never reach the
disk unless they are kept.

A plan is a graph and the store a cache of some of its nodes (Spark pipelines narrow
dependencies, Dask fuses linear chains, Halide computes a producer inside its consumer): a
step here is the same computation as ``featpipe encode`` on the stage before it, and has its
key. Each step's stage is planned as ``featpipe encode`` plans it
(:func:`featpipe.stages.encoding.plan_encode`, on the stage planned for the step before), its
stage folder and record are created (they say what the node is; only a kept step's items are
written), and each step reads its input as the store gives it back (:func:`as_stored`: the
stage's dtype, the layout ``np.load`` returns, the sidecars as written). So a fused result and
its step-by-step twin are equal to the bit, and a later step-by-step run reuses a fused stage,
and the other way round.

An item's extraction output (for the Table 6 recipe, one 101,376-value Fisher vector a frame:
405 kB) is held in memory up to :func:`spill_bytes` and beyond that written to temporary files
beside the item (:class:`BufferedRows`), read back memory-mapped for the steps, and removed;
what the steps themselves need beyond that budget (rank pooling's vectors of a long video)
goes to a temporary file of the store too (:func:`featpipe.backend.spill_array`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from featpipe.errors import (
    FeatpipeError,
    ItemError,
    ParameterError,
    WriteError,
    describe_error,
)
from featpipe.fileio import checked_result
from featpipe.store.item_files import ItemFiles, PendingItem


def spill_bytes() -> int:
    """Bytes of an item's extraction output kept in memory before it spills to a file: the
    process's memory budget (``FEATPIPE_MEMORY``, default 256 MiB:
    :func:`featpipe.backend.memory_budget`), 660 frames of the recipe's per-frame Fisher
    vectors (405 kB each)."""
    from featpipe.backend import memory_budget

    return memory_budget()


@dataclass(frozen=True)
class Then:
    """One ``featpipe encode`` step asked to run inside an extraction's pass.

    ``key`` labels the step among the others; ``input`` is the key of the step it reads
    (None: the extraction's items); ``method`` and ``params`` as for ``featpipe encode``; the
    step's stage is written when ``keep`` is true or it has a ``name`` (its store name).
    """

    key: str
    method: str
    params: Mapping = field(default_factory=dict)
    input: str | None = None
    name: str | None = None
    keep: bool = False

    @property
    def kept(self) -> bool:
        return self.keep or self.name is not None


@dataclass(frozen=True)
class ChainStep:
    """A planned step (picklable: it travels to the decoding workers): the step's label, its
    method and canonical parameters, its model stages' folders, the index of the step it reads
    (-1: the extraction's items), its stage's folder and dtype, and whether it is written."""

    label: str
    method: str
    params: Mapping
    model_paths: Mapping[str, str]
    source: int
    stage_path: str
    dtype: str
    keep: bool


def order_steps(steps: Sequence[Then]) -> list[Then]:
    """``steps`` with each after the step it reads (a usage error for an unknown input, a
    repeated key or a cycle)."""
    by_key: dict[str, Then] = {}
    for step in steps:
        if step.key in by_key:
            raise ParameterError("then", f"two steps are labelled {step.key!r}")
        by_key[step.key] = step
    ordered: list[Then] = []
    placed: set[str] = set()
    while len(ordered) < len(steps):
        ready = [s for s in steps if s.key not in placed and
                 (s.input is None or s.input in placed)]
        if not ready:
            left = [s for s in steps if s.key not in placed]
            unknown = [s for s in left if s.input not in by_key]
            if unknown:
                raise ParameterError("then", f"step {unknown[0].key!r} reads {unknown[0].input!r}, "
                                     "which is no step of the chain")
            raise ParameterError("then", f"steps {', '.join(s.key for s in left)} form a cycle")
        for step in ready:
            ordered.append(step)
            placed.add(step.key)
    return ordered


def as_stored(item_id: str, array, dtype) -> np.ndarray:
    """``array`` as a stage of ``dtype`` stores it and ``Stage.read_item`` gives it back:
    checked and cast (:func:`featpipe.fileio.checked_result`), in the memory layout ``np.save``
    then ``np.load`` give (C order, or Fortran order for a Fortran-ordered array)."""
    array = checked_result(item_id, array, np.dtype(dtype))
    if array.flags.c_contiguous or array.flags.f_contiguous:
        return array
    return np.ascontiguousarray(array)


class ChainRunner:
    """The steps of a chain in one process: each step's encoder is built once (as
    ``featpipe encode`` builds it: :func:`featpipe.encode.registry.load_method`)."""

    def __init__(self, steps: Sequence[ChainStep]):
        self.steps = list(steps)
        self._encoders: dict[int, object] = {}

    def __getstate__(self):
        return {"steps": self.steps, "_encoders": {}}

    def _encoder(self, index: int):
        if index not in self._encoders:
            from featpipe.encode.registry import load_method
            from featpipe.store import Stage

            step = self.steps[index]
            models = {k: Stage.at(p) for k, p in step.model_paths.items()}
            self._encoders[index] = load_method(step.method).build(dict(step.params), models)
        return self._encoders[index]

    def needed(self, wanted: set[int]) -> list[int]:
        """The steps to run for the kept steps ``wanted``: those and every step they read."""
        needed: set[int] = set()
        for index in wanted:
            while index >= 0 and index not in needed:
                needed.add(index)
                index = self.steps[index].source
        return sorted(needed)

    def run(self, item_id: str, array: np.ndarray, extras: Mapping[str, np.ndarray],
            wanted: set[int]) -> list[tuple[str, PendingItem]]:
        """Run the steps the kept steps ``wanted`` need on one item (``array`` and ``extras``
        as its extraction stage holds them); returns ``(stage folder, item to commit)`` for
        each of ``wanted``.  A step that fails raises an :class:`ItemError` naming it."""
        from featpipe.parallel import ItemOutput

        results: dict[int, tuple[np.ndarray, dict]] = {-1: (array, dict(extras))}
        out = []
        for index in self.needed(wanted):
            step = self.steps[index]
            source, source_extras = results[step.source]
            try:
                value = self._encoder(index).encode_batch([source], [source_extras])[0]
            except (ParameterError, WriteError):
                raise  # the step's parameters or the store's disk, not the item
            except FeatpipeError as err:
                raise ItemError(item_id, f"step {step.label} ({step.method}): "
                                f"{getattr(err, 'cause', str(err))}") from None
            except Exception as err:
                raise ItemError(item_id, f"step {step.label} ({step.method}): "
                                f"{describe_error(err)}") from None
            if not isinstance(value, ItemOutput):
                value = ItemOutput(value)
            stored = as_stored(item_id, value.array, step.dtype)
            sidecars = {k: np.asarray(v) for k, v in value.extras.items()}
            results[index] = (stored, sidecars)
            if index in wanted:
                out.append((step.stage_path, PendingItem(item_id, sidecars=sidecars,
                                                         array=stored)))
        return out


@dataclass
class ChainedPending:
    """An item's outputs of one pass, committed together: the extraction's own item (when
    its stage is written) and each kept step's, each to its stage (in order; a kill between
    two leaves the later ones to the rerun)."""

    item_id: str
    own: PendingItem | None
    steps: list[tuple[str, PendingItem]]

    def commit(self, stage, seconds: float = 0.0) -> None:
        from featpipe.store import Stage

        if self.own is not None:
            self.own.commit(stage, seconds=seconds)
        for path, pending in self.steps:
            pending.commit(Stage(path), seconds=seconds)

    def discard(self) -> None:
        if self.own is not None:
            self.own.discard()


class BufferedRows:
    """An :class:`~featpipe.items.ItemSink` for an item whose extraction output feeds a chain:
    rows checked and cast as ``stage`` stores them, held in memory up to ``budget`` bytes,
    then appended to the item's temporary files (:class:`~featpipe.store.item_files.ItemFiles`,
    beside the item's place in ``stage``); ``budget=0`` writes them from the first row (the
    stage is kept).  :meth:`close` gives the whole output as the store would give it back (rows
    memory-mapped from their file once spilled)."""

    def __init__(self, stage, item_id: str, budget: int):
        self.files = ItemFiles(stage, item_id)
        self.item_id = item_id
        self.dtype = stage.dtype
        self.budget = budget
        self.rows: list[np.ndarray] = []
        self.row_sidecars: dict[str, list[np.ndarray]] = {}
        self.bytes = 0
        self.spilled = budget <= 0

    def append(self, rows, **row_sidecars) -> None:
        if self.spilled:
            self.files.append(rows, **row_sidecars)
            return
        rows = checked_result(self.item_id, rows, self.dtype)
        self.rows.append(rows)
        for name, values in row_sidecars.items():
            self.row_sidecars.setdefault(name, []).append(np.asarray(values))
        self.bytes += rows.nbytes
        if self.bytes > self.budget:
            self.spilled = True
            for i, block in enumerate(self.rows):
                self.files.append(block, **{k: v[i] for k, v in self.row_sidecars.items()})
            self.rows, self.row_sidecars = [], {}

    def write(self, array, **sidecars) -> None:
        self.files.write(array, **sidecars)

    def set(self, **sidecars) -> None:
        self.files.set(**sidecars)

    def close(self) -> tuple[PendingItem | None, np.ndarray, dict[str, np.ndarray]]:
        """``(the item to commit or discard: None when its rows stayed in memory, its array,
        its sidecars)``."""
        if self.files.array is not None:  # one result for the whole item
            array = as_stored(self.item_id, self.files.array, self.dtype)
            sidecars = {k: np.asarray(v) for k, v in self.files.sidecars.items()}
            return PendingItem(self.item_id, sidecars=sidecars, array=array), array, sidecars
        if not self.spilled:
            if not self.rows:
                raise ItemError(self.item_id, "no frames were produced")
            sidecars = {k: np.concatenate(v) for k, v in self.row_sidecars.items()}
            return None, np.concatenate(self.rows), {**sidecars, **self.files.sidecars}
        pending = self.files.close()
        loaded = {name: np.load(path, mmap_mode="r", allow_pickle=False)
                  for name, path in pending.files.items()}
        sidecars = {k: np.asarray(v) for k, v in loaded.items() if k}
        return pending, loaded[""], {**sidecars, **pending.sidecars}

    def abort(self) -> None:
        self.files.abort()



#: the ``--temporal-groups`` entry for the whole per-frame output
ALL_GROUPS = "all"


def pooling_steps(method: str, params: Mapping, groups: Sequence[str], gmm: str | None,
                  name: str | None) -> list[Then]:
    """The steps of ``extract --temporal METHOD --temporal-groups G,...``: for a descriptor group
    ``g`` of the ``--encode fisher`` GMM (``fit gmm --groups``), ``fisher-group --group g``
    then ``METHOD``; for ``all``, ``METHOD`` on the whole per-frame output.  Each pooled
    output is kept and named ``NAME-g`` (``NAME`` when ``all`` is the only group)."""
    groups = list(dict.fromkeys(groups)) or [ALL_GROUPS]
    steps = []
    for group in groups:
        label = name if groups == [ALL_GROUPS] and name else \
            f"{name}-{group}" if name else f"{method}-{group}"
        if group == ALL_GROUPS:
            steps.append(Then(label, method, dict(params), name=label if name else None,
                              keep=True))
            continue
        if gmm is None:
            raise ParameterError("temporal_groups", f"group {group!r} needs per-frame Fisher "
                                 "vectors of descriptor groups (--encode fisher --gmm G "
                                 "--per-frame, G fitted with fit gmm --groups); use 'all'")
        steps.append(Then(f"{label}.fv", "fisher-group", {"gmm": gmm, "group": group}))
        steps.append(Then(label, method, dict(params), input=f"{label}.fv",
                          name=label if name else None, keep=True))
    return steps


def parse_value(text: str):
    """A ``KEY=VALUE`` option's value: an int, a float, true/false, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)
