"""The store's two classes, :class:`Store` (a folder of stages and the names pointing at them)
and :class:`Stage` (one stage folder): what the rest of featpipe uses.  Each method hands its
work to the module of the store that owns the concept (``featpipe/store/__init__.py`` lists
them); the classes hold no file format of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from featpipe.checksums import CHECKSUM_FORMAT
from featpipe.errors import FeatpipeError
from featpipe.manifest import Manifest
from featpipe.store import batches, keys, layout, ledger, models, names, running, states, views
from featpipe.store import index as stage_index
from featpipe.store import items as stage_items
from featpipe.store import records as stage_records
from featpipe.store.batches import BATCH_DIR, BatchWriter, commits_in_batches
from featpipe.store.layout import STAGE_FOLDER
from featpipe.store.packed import PackedItems


class Stage:
    """One stage folder: its records, items, ledgers, index, view, models and the processes
    computing it."""

    def __init__(self, path: str | os.PathLike, meta: Mapping | None = None,
                 items: Manifest | None = None):
        """Open the stage folder ``path`` (:func:`featpipe.store.records.read_meta`); with
        ``meta`` (and ``items``) a *planned* stage that is not on disk (a dry run computes its
        key and its plan without creating it)."""
        self.path = Path(path)
        self.exists = meta is None
        self._items: Manifest | None = items
        #: a planned stage's stand-in models (a dry run's, :meth:`save_model`), by name
        self.stand_in_models: dict[str, tuple[dict, dict]] = {}
        #: what a dry run knows of a planned stage's items (featpipe.stages.dryrun)
        self.planned_items = None
        self._view: tuple[Stage, slice, tuple[str, ...]] | None = None
        self.meta = dict(stage_records.read_meta(self.path) if meta is None else meta)
        if self.exists:  # a view's record is part of the stage's own: damage is found here
            views.view_record(self)

    # -- identity ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def name(self) -> str:
        """The folder name ``<kind>-<key>``, which identifies the stage inside its store."""
        return self.path.name

    @property
    def params(self) -> dict:
        return self.meta["params"]

    @property
    def checksummed(self) -> bool:
        """Whether the stage was written with checksums of every file
        (:data:`featpipe.checksums.CHECKSUM_FORMAT`): then a missing checksum is damage."""
        return isinstance(self.meta.get("checksums"), int) and \
            self.meta["checksums"] >= CHECKSUM_FORMAT

    @property
    def input_names(self) -> list[str]:
        """Folder names (``kind-key``) of the stages this one was computed from."""
        return list(self.meta.get("inputs", []))

    @property
    def store(self) -> Store:
        return Store(self.path.parent.parent)

    def inputs(self) -> list[Stage]:
        return [self.store.stage_by_folder(name) for name in self.input_names]

    def __repr__(self) -> str:
        return f"Stage({self.name!r})"

    def _check_on_disk(self) -> None:
        if not self.exists:
            raise FeatpipeError(f"stage {self.name} is only planned (a dry run); nothing is "
                                "written to it")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stage) and other.path.resolve() == self.path.resolve()

    def __hash__(self) -> int:
        return hash(str(self.path.resolve()))

    # -- records (featpipe.store.records) ---------------------------------------------------
    @property
    def items(self) -> Manifest:
        """The manifest rows (ids, labels, splits) this stage covers; empty for model stages."""
        if self._items is None:
            self._items = stage_records.item_list(self)
        return self._items

    def read_record(self, name: str) -> bytes | None:
        """The bytes of record file ``name``, checked against ``stage.json``
        (:func:`featpipe.store.records.read_record`)."""
        return stage_records.read_record(self, name)

    def restore_records(self, records: Mapping[str, bytes | Callable[[], bytes]]) -> None:
        """Write again the record files of ``records`` that are missing or damaged:
        :func:`featpipe.store.records.restore_records`."""
        stage_records.restore_records(self, records)

    @property
    def n_items(self) -> int:
        """How many items the stage covers (``stage.json`` says, without reading items.csv)."""
        n_items = self.meta.get("n_items")
        return n_items if isinstance(n_items, int) and n_items >= 0 else len(self.items)

    @property
    def is_model_stage(self) -> bool:
        """A fit stage: it covers no items and holds models (once fitted)."""
        return not self.n_items

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta.get("dtype", "float32"))

    # -- items (featpipe.store.items) -------------------------------------------------------
    def item_path(self, item_id: str, extra: str | None = None) -> Path:
        return stage_items.item_path(self.path, item_id, extra)

    def write_item(self, item_id: str, array: np.ndarray,
                   extras: Mapping[str, np.ndarray] | None = None, seconds: float = 0.0
                   ) -> Path:
        """Write one item atomically, then its done line
        (:func:`featpipe.store.items.write_item`)."""
        return stage_items.write_item(self, item_id, array, extras, seconds)

    def done_ids(self) -> set[str]:
        """Items whose ledger says done and whose file exists (resume trusts both)."""
        return stage_items.done_ids(self)

    def truncated_ids(self, ids: Iterable[str]) -> set[str]:
        """Of ``ids``, the items whose loose file is shorter than its header declares."""
        return stage_items.truncated_ids(self, ids)

    def is_complete(self) -> bool:
        return set(self.items.ids) <= self.done_ids()

    def read_item(self, item_id: str, mmap: bool = False) -> np.ndarray:
        """One item's array, checked, wherever it is: :func:`featpipe.store.items.read_item`."""
        return stage_items.read_item(self, item_id, mmap)

    def read_extra(self, item_id: str, extra: str) -> np.ndarray | None:
        """Load a sidecar (``timestamps``, ``positions``...) or ``None`` when there is none."""
        return stage_items.read_extra(self, item_id, extra)

    def extras_of(self, item_id: str) -> dict[str, np.ndarray]:
        """All sidecars of one item, by name."""
        return stage_items.extras_of(self, item_id)

    def packed(self):
        """The :class:`featpipe.store.packed.PackedItems` of this stage, or ``None``."""
        return PackedItems.open(self.path, self.checksummed)

    def batch_writer(self) -> BatchWriter | None:
        """A writer committing a chunk of small items together (:mod:`featpipe.store.batches`),
        or None when this stage writes each item to its own file."""
        self._check_on_disk()
        if not commits_in_batches(self.n_items):
            return None
        folder = self.path / ledger.LEDGER_DIR
        return BatchWriter(self.path / BATCH_DIR, self.dtype, ledger.line,
                           lambda lines: ledger.LedgerWriter.append_lines(folder, lines))

    def batch_of(self, item_id: str, reload: bool = False) -> Path | None:
        """The batch file the ledger says holds done item ``item_id`` (it may be gone)."""
        return batches.batch_of(self, item_id, reload)

    # -- ledgers (featpipe.store.ledger) ----------------------------------------------------
    def record(self, item_id: str, status: str, seconds: float = 0.0, error: str | None = None,
               sums: Mapping[str, str] | None = None):
        """Append one ledger line for ``item_id``: :func:`featpipe.store.ledger.record`."""
        ledger.record(self, item_id, status, seconds, error, sums)

    def record_removed(self, ids: Iterable[str], why: str) -> None:
        """Record that the files of ``ids`` were removed (``verify --repair``)."""
        ledger.record_removed(self, ids, why)

    def ledger(self) -> Iterator[ledger.LedgerEntry]:
        """All ledger lines of all processes; a line cut short by a killed process is skipped."""
        for _, entry in self.ledger_with_source():
            yield entry

    def ledger_with_source(self) -> Iterator[tuple[str, ledger.LedgerEntry]]:
        """Like :meth:`ledger`, each line with the name of its ledger file (one per process);
        malformed lines are skipped (:meth:`ledger_problems` lists them)."""
        for name, _, entry in ledger.ledger_lines(self):
            if isinstance(entry, ledger.LedgerEntry):
                yield name, entry

    def ledger_problems(self, fresh: bool = False) -> list[str]:
        """Malformed or damaged ledger lines: :func:`featpipe.store.ledger.problems`."""
        return ledger.problems(self, fresh)

    def parse_line(self, value, line: bytes, ledger_file: str | None = None
                   ) -> ledger.LedgerEntry | str:
        """A ledger line as an entry, or the reason it is none
        (:func:`featpipe.store.ledger.parse_line`)."""
        return ledger.parse_line(self, value, line, ledger_file)

    def item_states(self) -> dict[str, ledger.LedgerEntry]:
        """Latest ledger entry per item, every line read (:meth:`index` is the cheap way)."""
        return ledger.item_states(self)

    def failed(self) -> dict[str, str]:
        """Items whose latest state is failed, with their recorded error
        (:func:`featpipe.store.states.failed`)."""
        return states.failed(self)

    # -- index (featpipe.store.index, featpipe.store.states) --------------------------------
    def index(self, need_table: bool = False, trust: bool = True) -> stage_index.Index:
        """The stage's ledgers folded (:func:`featpipe.store.index.load`): counts and failed
        items in O(ledgers) when the index on disk is current, the table of item states with
        ``need_table``; without ``trust``, every ledger folded again (``cache verify``)."""
        return stage_index.load(self.path, self.parse_line, need_table, trust=trust)

    def index_problems(self) -> list[str]:
        """What is wrong with the index on disk (:func:`featpipe.store.index.problems`)."""
        return stage_index.problems(self.path, self.parse_line)

    def compact_index(self) -> bool:
        """Write the index when the ledgers hold lines it lacks (runs call this)."""
        return self.exists and stage_index.compact(self.path, self.parse_line)

    def item_table(self, fresh: bool = False) -> stage_index.Table:
        """The item states of the ledgers now: :func:`featpipe.store.states.item_table`."""
        return states.item_table(self, fresh)

    def recorded_sums(self, item_id: str, reload: bool = False) -> dict[str, str] | None:
        """The checksums the ledger recorded for the files of done item ``item_id``."""
        return states.recorded_sums(self, item_id, reload)

    # -- views (featpipe.store.views) -------------------------------------------------------
    def make_view(self, source: Stage, columns: slice, extras: Iterable[str]) -> None:
        """Make this stage a view of the columns ``columns`` of ``source``
        (:func:`featpipe.store.views.make_view`)."""
        views.make_view(self, source, columns, extras)

    def view(self) -> tuple[Stage, slice, tuple[str, ...]] | None:
        """``(source stage, columns, sidecars kept)`` of a view stage, else None."""
        if self._view is None and self.exists:
            self._view = views.view_of(self)
        return self._view

    # -- processes computing it (featpipe.store.running) ------------------------------------
    def mark_running(self) -> None:
        """Record this process as computing the stage until :meth:`unmark_running`
        (:func:`featpipe.store.running.mark_running`)."""
        running.mark_running(self)

    def unmark_running(self) -> None:
        running.unmark_running(self)

    def running_processes(self, max_age_s: float = 86400.0) -> list[str]:
        """``host-pid`` of the processes computing this stage now."""
        return running.running_processes(self, max_age_s)

    def exclusive(self, label: str, waiting: Callable[[], None]
                  ) -> AbstractContextManager[None]:
        """Hold this stage's lock ``locks/<label>``: :func:`featpipe.store.running.exclusive`."""
        return running.exclusive(self, label, waiting)

    # -- models (featpipe.store.models) -----------------------------------------------------
    @classmethod
    def at(cls, path: str | os.PathLike) -> Stage:
        """The stage in folder ``path``; in a dry run, the planned stage there that holds
        stand-in models (:meth:`save_model`), so that later steps plan on them."""
        return models.stand_in(path) or cls(path)

    def save_model(self, name: str, model, meta: Mapping | None = None) -> None:
        """Save a fitted model (a planned stage keeps a stand-in):
        :func:`featpipe.store.models.save_model`."""
        models.save_model(self, name, model, meta)

    def model_sums(self, name: str) -> dict[str, str] | None:
        """The checksums of model ``name``'s files by suffix, or None (saved before them)."""
        return models.model_sums(self, name)

    def load_model(self, name: str, cls=None):
        """``(arrays, meta)`` of model ``name``, or ``cls.from_arrays(arrays, meta)``."""
        return models.load_model(self, name, cls)

    def model_names(self) -> list[str]:
        """Names of the models this stage holds (a planned stage's: its stand-ins)."""
        return models.model_names(self)

    def has_model(self, name: str) -> bool:
        """Whether model ``name`` is saved whole (its checksums, written last, included)."""
        return models.has_model(self, name)


class Store:
    """A folder of stages plus friendly names pointing at them (:mod:`featpipe.store.layout`)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        #: names a dry run of several steps plans (``featpipe run --dry-run``): each resolves
        #: to the stage planned for it, not to what the name points to on disk now
        self.planned: dict[str, Stage] = {}

    @property
    def stages_dir(self) -> Path:
        return self.root / "stages"

    @property
    def names_dir(self) -> Path:
        return self.root / "names"

    def stage(self, kind: str, params: Mapping, inputs: Iterable[Stage] = (),
              items: Manifest | None = None, dtype: str = "float32", create: bool = True,
              records: Mapping[str, bytes] | None = None) -> Stage:
        """Open the stage for (kind, params, inputs), creating it exclusively if it is new.

        ``items`` are the manifest rows the stage covers (default: those of its first input),
        written as ``items.csv``; ``records`` are other files of the stage that its key
        determines (``read-hashes.json``).  Both are written before ``stage.json``, which keeps
        their checksums (:mod:`featpipe.store.records`); an existing stage gets back those of
        them removed (``verify --repair``) or damaged since (:meth:`Stage.restore_records`).
        With ``create=False`` (a dry run) a new stage is only planned: its key and items,
        nothing on disk.  The key: :func:`featpipe.store.keys.stage_key`.
        """
        keys.check_kind(kind)
        inputs = list(inputs)
        params = keys.canonical_params(params)
        key = keys.stage_key(kind, keys.key_params(params, dtype), [s.key for s in inputs])
        path = self.stages_dir / f"{kind}-{key}"
        if items is None and inputs:
            items = inputs[0].items
        records = dict(records or {})
        if (path / "stage.json").exists():
            stage = Stage(path)
            if create:  # a record removed or damaged since is written again
                if items is not None:
                    records["items.csv"] = lambda: items.to_csv(None).encode()
                stage.restore_records(records)
            return stage
        if items is not None:
            records["items.csv"] = items.to_csv(None).encode()
        meta = stage_records.new_meta(kind, key, params, [s.name for s in inputs], dtype,
                                      len(items) if items is not None else 0, records)
        if not create:
            return Stage(path, meta=meta, items=items if items is not None else Manifest([]))
        self.check_not_nested()
        self.check_writable()
        stage_records.create(path, meta, records)
        return Stage(path)

    def stage_by_folder(self, folder: str) -> Stage:
        """The stage in folder ``stages/<folder>``; anything but a ``kind-key`` name (a path
        with ``/`` or ``..``) is refused, so no stage outside this store is ever opened."""
        if not isinstance(folder, str) or not STAGE_FOLDER.match(folder):
            raise FeatpipeError(f"{folder!r} is not a stage folder name (kind-key) of store "
                                f"{self.root}")
        return Stage(self.stages_dir / folder)

    def check_writable(self) -> None:
        """A :class:`~featpipe.errors.WriteError` naming the store when this process cannot
        write into its folder, before a command that must write starts."""
        layout.check_writable(self.root)

    def check_not_nested(self) -> None:
        """Refuse a store folder inside another store's folder
        (:func:`featpipe.store.layout.check_not_nested`)."""
        layout.check_not_nested(self.root)

    def require(self) -> Store:
        """This store, or a one-line error when its folder does not exist or is not a store."""
        layout.require(self)
        return self

    def scan(self) -> tuple[list[Stage], list[tuple[str, str]]]:
        """Every stage folder: the stages that open, and ``(folder, problem)`` for the others."""
        return layout.scan(self)

    def all_stages(self) -> list[Stage]:
        """The stages that open (see :meth:`scan` for the broken ones)."""
        return self.scan()[0]

    # -- names (featpipe.store.names) -------------------------------------------------------
    def set_name(self, name: str, stage: Stage) -> None:
        """Point ``name`` at ``stage`` (atomic; an existing name is moved)."""
        names.set_name(self, name, stage)

    def read_name(self, name: str) -> str:
        """The stage folder ``name`` points to; anything but a stage folder name of this
        store is an error, never followed."""
        return self.read_pointer(self.names_dir / name, name, "name")

    def read_pointer(self, path: Path, name: str, what: str) -> str:
        """The stage folder a name file (``what``: name, unfinished run) points to, checked
        (:func:`featpipe.store.names.read_pointer`)."""
        return names.read_pointer(self, path, name, what)

    def names(self, problems: list[str] | None = None) -> dict[str, str]:
        """All valid names and the stage folder each points to (``problems``: the others)."""
        return names.names(self, problems)

    def resolve(self, name: str) -> Stage:
        """The stage a name (or a stage folder name) points to
        (:func:`featpipe.store.names.resolve`)."""
        return names.resolve(self, name)
