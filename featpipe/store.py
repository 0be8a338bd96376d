"""The artifact store: stages, keys, atomic item writes, ledgers, resume, names and models.

Layout (DESIGN.md section 3)::

    STORE/stages/<kind>-<key>/stage.json        kind, params, input keys, versions, host, created
                             /items.csv         the manifest rows this stage covers
                             /items/<2 hex>/<safe id>.npy          one array per item
                             /items/<2 hex>/<safe id>+<extra>.npy  sidecars (timestamps...)
                             /ledger/<host>-<pid>.jsonl            id, status, seconds, error
                             /models/<name>.npz + <name>.json      fitted objects
    STORE/names/<NAME>                          text: the stage folder a friendly name points to

A stage's key hashes its kind, its parameters, the keys of its inputs and
:data:`featpipe.FORMAT_VERSION`, so the same work always lands in the same folder and a changed
parameter lands in a new one.  Item writes are atomic (temporary file in the same folder, flush,
fsync, ``os.replace``); an item counts as done only when a ledger line says so *and* its file
exists, so a process killed at any moment loses at most the items it was computing.
No pickle anywhere: arrays are ``.npy``/``.npz`` read with ``allow_pickle=False``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from featpipe import FORMAT_VERSION, __version__
from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import (
    HOST,
    atomic_save_npy,
    atomic_save_npz,
    atomic_write_bytes,
    id_digest,
    safe_stem,
)
from featpipe.manifest import Manifest

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_VERSIONED_PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "opencv-python-headless")


def stage_key(kind: str, params: Mapping, input_keys: Iterable[str]) -> str:
    """Hash of kind, parameters (canonical JSON), input keys and the artifact-format version."""
    payload = {
        "kind": kind,
        "params": params,
        "inputs": list(input_keys),
        "format": FORMAT_VERSION,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _package_versions() -> dict[str, str]:
    versions = {"featpipe": __version__}
    for name in _VERSIONED_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


@dataclass(frozen=True)
class LedgerEntry:
    """One line of a ledger: what happened to one item in one process."""

    id: str
    status: str  # "done" or "failed"
    seconds: float
    error: str | None
    time: float


class _LedgerWriter:
    """Appends JSON lines to ``ledger/<host>-<pid>.jsonl``; one file per process, never shared."""

    _open: dict[tuple[str, int], object] = {}

    @classmethod
    def append(cls, ledger_dir: Path, entry: dict) -> None:
        pid = os.getpid()
        key = (str(ledger_dir), pid)
        handle = cls._open.get(key)
        if handle is None:
            ledger_dir.mkdir(parents=True, exist_ok=True)
            handle = open(ledger_dir / f"{HOST}-{pid}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            cls._open[key] = handle
        handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


class Stage:
    """One stage folder: its metadata, its items, its ledger and its models."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / "stage.json"
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FeatpipeError(f"no stage at {self.path} (stage.json missing)") from None
        except json.JSONDecodeError as err:
            raise FeatpipeError(f"{meta_path}: corrupt stage metadata ({err})") from None
        self._items: Manifest | None = None

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

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stage) and other.path.resolve() == self.path.resolve()

    def __hash__(self) -> int:
        return hash(str(self.path.resolve()))

    # -- items ------------------------------------------------------------------------------
    @property
    def items(self) -> Manifest:
        """The manifest rows (ids, labels, splits) this stage covers; empty for model stages."""
        if self._items is None:
            path = self.path / "items.csv"
            self._items = Manifest.read(path) if path.exists() else Manifest([], root=self.path)
        return self._items

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta.get("dtype", "float32"))

    def item_path(self, item_id: str, extra: str | None = None) -> Path:
        stem = safe_stem(item_id)
        suffix = f"+{extra}.npy" if extra else ".npy"
        return self.path / "items" / id_digest(item_id)[:2] / f"{stem}{suffix}"

    def write_item(
        self,
        item_id: str,
        array: np.ndarray,
        extras: Mapping[str, np.ndarray] | None = None,
        seconds: float = 0.0,
    ) -> Path:
        """Write one item atomically and record it as done in this process's ledger.

        Floating arrays are cast to the stage dtype (float32 unless the stage says otherwise).
        A non-finite value is refused: a silently wrong number must never reach the disk.
        Sidecars in ``extras`` (timestamps, positions) are written first, the main array last,
        so the main file is the commit point.
        """
        array = np.asarray(array)
        if array.dtype.kind not in "biuf":
            raise ItemError(item_id, f"result has non-numeric dtype {array.dtype}")
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)):
                raise ItemError(item_id, "result contains NaN or Inf; nothing was written")
            with np.errstate(over="ignore"):
                array = array.astype(self.dtype, copy=False)
            if not np.all(np.isfinite(array)):
                raise ItemError(item_id, f"result overflows {self.dtype}; nothing was written")
        target = self.item_path(item_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        for extra, values in (extras or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", extra):
                raise ValueError(f"sidecar name {extra!r} must match [a-z][a-z0-9_]*")
            atomic_save_npy(self.item_path(item_id, extra), np.asarray(values))
        atomic_save_npy(target, array)
        self.record(item_id, "done", seconds=seconds)
        return target

    def record(self, item_id: str, status: str, seconds: float = 0.0, error: str | None = None):
        """Append one ledger line for ``item_id`` (``done`` or ``failed``)."""
        if status not in ("done", "failed"):
            raise ValueError(f"ledger status must be 'done' or 'failed', got {status!r}")
        entry = {"id": item_id, "status": status, "seconds": round(float(seconds), 6),
                 "error": error, "time": time.time()}
        _LedgerWriter.append(self.path / "ledger", entry)

    def ledger(self) -> Iterator[LedgerEntry]:
        """All ledger lines of all processes; a line cut short by a killed process is skipped."""
        for _, entry in self.ledger_with_source():
            yield entry

    def ledger_with_source(self) -> Iterator[tuple[str, LedgerEntry]]:
        """Like :meth:`ledger`, each line with the name of its ledger file (one per process)."""
        ledger_dir = self.path / "ledger"
        if not ledger_dir.is_dir():
            return
        for path in sorted(ledger_dir.glob("*.jsonl")):
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        raw = json.loads(line)
                        yield path.name, LedgerEntry(
                            raw["id"], raw["status"], raw.get("seconds", 0.0),
                            raw.get("error"), raw.get("time", 0.0))
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue

    def item_states(self) -> dict[str, LedgerEntry]:
        """Latest ledger entry per item, a ``done`` entry winning over any ``failed`` one."""
        states: dict[str, LedgerEntry] = {}
        for entry in sorted(self.ledger(), key=lambda e: e.time):
            previous = states.get(entry.id)
            if previous is not None and previous.status == "done" and entry.status == "failed":
                continue
            states[entry.id] = entry
        return states

    def done_ids(self) -> set[str]:
        """Items whose ledger says done and whose file exists (resume trusts both).

        An item packed by ``featpipe cache pack`` counts as existing.
        """
        packed = self.packed()
        packed_ids = packed.ids() if packed is not None else frozenset()
        return {
            item_id
            for item_id, entry in self.item_states().items()
            if entry.status == "done"
            and (item_id in packed_ids or self.item_path(item_id).exists())
        }

    def packed(self):
        """The :class:`featpipe.pack.PackedItems` of this stage, or ``None`` if not packed."""
        from featpipe.pack import PackedItems

        return PackedItems.open(self.path)

    def failed(self) -> dict[str, str]:
        """Items whose latest state is failed, with their recorded error."""
        done = self.done_ids()
        return {
            item_id: entry.error or "failed"
            for item_id, entry in self.item_states().items()
            if entry.status == "failed" and item_id not in done
        }

    def is_complete(self) -> bool:
        return set(self.items.ids) <= self.done_ids()

    def read_item(self, item_id: str, mmap: bool = False) -> np.ndarray:
        """Load one item's array (``allow_pickle=False``); packed items are read from HDF5."""
        path = self.item_path(item_id)
        try:
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except FileNotFoundError:
            packed = self.packed()
            array = packed.read(item_id) if packed is not None else None
            if array is not None:
                return array
            raise ItemError(item_id, f"not computed in stage {self.name}") from None
        except (ValueError, EOFError, OSError) as err:
            raise ItemError(item_id, f"unreadable array {path}: {err}") from None

    def read_extra(self, item_id: str, extra: str) -> np.ndarray | None:
        """Load a sidecar (``timestamps``, ``positions``...) or ``None`` when there is none."""
        path = self.item_path(item_id, extra)
        if not path.exists():
            packed = None if self.item_path(item_id).exists() else self.packed()
            return packed.extras(item_id).get(extra) if packed is not None else None
        return np.load(path, allow_pickle=False)

    def extras_of(self, item_id: str) -> dict[str, np.ndarray]:
        """All sidecars of one item, by name."""
        prefix = safe_stem(item_id) + "+"
        folder = self.item_path(item_id).parent
        packed = None if self.item_path(item_id).exists() else self.packed()
        found = packed.extras(item_id) if packed is not None else {}
        if folder.is_dir():
            for path in folder.glob(f"{prefix}*.npy"):
                found[path.name[len(prefix):-4]] = np.load(path, allow_pickle=False)
        return found

    # -- models -----------------------------------------------------------------------------
    def save_model(self, name: str, model, meta: Mapping | None = None) -> None:
        """Save a fitted model as ``models/<name>.npz`` (arrays) + ``models/<name>.json``.

        ``model`` follows :mod:`featpipe.models` (``to_arrays() -> (arrays, meta)``, and
        ``meta`` is added to its metadata) or is a dict of arrays.
        """
        arrays, own = model.to_arrays() if hasattr(model, "to_arrays") else (model, {})
        meta = {**own, **(meta or {})}
        folder = self.path / "models"
        folder.mkdir(parents=True, exist_ok=True)
        atomic_save_npz(folder / f"{name}.npz", arrays)
        text = json.dumps(dict(meta), indent=2, sort_keys=True, default=_json_default)
        atomic_write_bytes(folder / f"{name}.json", text.encode("utf-8"))

    def load_model(self, name: str, cls=None):
        """``(arrays, meta)`` of model ``name``, or ``cls.from_arrays(arrays, meta)``."""
        folder = self.path / "models"
        try:
            with np.load(folder / f"{name}.npz", allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            meta = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FeatpipeError(f"stage {self.name} has no model {name!r} (not fitted yet?)") \
                from None
        return (arrays, meta) if cls is None else cls.from_arrays(arrays, meta)

    def has_model(self, name: str) -> bool:
        folder = self.path / "models"
        return (folder / f"{name}.npz").exists() and (folder / f"{name}.json").exists()


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class Store:
    """A folder of stages plus friendly names pointing at them."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def stages_dir(self) -> Path:
        return self.root / "stages"

    @property
    def names_dir(self) -> Path:
        return self.root / "names"

    def stage(
        self,
        kind: str,
        params: Mapping,
        inputs: Iterable[Stage] = (),
        items: Manifest | None = None,
        dtype: str = "float32",
    ) -> Stage:
        """Open the stage for (kind, params, inputs), creating it exclusively if it is new.

        ``items`` are the manifest rows the stage covers (default: those of its first input).
        Creation is race-free: ``stage.json`` is written to a temporary file and hard-linked
        into place, which fails if another process got there first.
        """
        if not re.fullmatch(r"[a-z][a-z0-9-]*", kind):
            raise ValueError(f"stage kind {kind!r} must match [a-z][a-z0-9-]*")
        inputs = list(inputs)
        params = json.loads(json.dumps(dict(params), default=_json_default))
        key_params = dict(params, dtype=dtype) if dtype != "float32" else params
        key = stage_key(kind, key_params, [s.key for s in inputs])
        path = self.stages_dir / f"{kind}-{key}"
        if (path / "stage.json").exists():
            return Stage(path)
        if items is None and inputs:
            items = inputs[0].items
        path.mkdir(parents=True, exist_ok=True)
        if items is not None:
            items.write(path / "items.csv", relative_to=None)
        meta = {
            "kind": kind,
            "key": key,
            "params": params,
            "inputs": [s.name for s in inputs],
            "dtype": dtype,
            "n_items": len(items) if items is not None else 0,
            "format": FORMAT_VERSION,
            "versions": _package_versions(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "host": HOST,
        }
        tmp = path / f"stage.json.tmp.{HOST}.{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        try:
            os.link(tmp, path / "stage.json")
        except FileExistsError:
            pass  # another process created it first; its metadata is identical by key
        finally:
            tmp.unlink(missing_ok=True)
        return Stage(path)

    def stage_by_folder(self, folder: str) -> Stage:
        return Stage(self.stages_dir / folder)

    def all_stages(self) -> list[Stage]:
        if not self.stages_dir.is_dir():
            return []
        return [Stage(p) for p in sorted(self.stages_dir.iterdir()) if (p / "stage.json").exists()]

    # -- names ------------------------------------------------------------------------------
    def set_name(self, name: str, stage: Stage) -> None:
        """Point ``name`` at ``stage`` (atomic; an existing name is moved)."""
        if not NAME_PATTERN.match(name):
            raise FeatpipeError(
                f"invalid name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)"
            )
        self.names_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.names_dir / name, (stage.name + "\n").encode("utf-8"))

    def names(self) -> dict[str, str]:
        """All names and the stage folder each points to."""
        if not self.names_dir.is_dir():
            return {}
        return {
            p.name: p.read_text(encoding="utf-8").strip()
            for p in sorted(self.names_dir.iterdir())
            if NAME_PATTERN.match(p.name)
        }

    def resolve(self, name: str) -> Stage:
        """The stage a name points to; a stage folder name (``kind-key``) works too."""
        if NAME_PATTERN.match(name) and (self.names_dir / name).is_file():
            folder = (self.names_dir / name).read_text(encoding="utf-8").strip()
            if not (self.stages_dir / folder / "stage.json").exists():
                raise FeatpipeError(f"name {name!r} points to missing stage {folder}")
            return self.stage_by_folder(folder)
        if NAME_PATTERN.match(name) and (self.stages_dir / name / "stage.json").exists():
            return self.stage_by_folder(name)
        known = ", ".join(self.names()) or "none yet"
        raise FeatpipeError(
            f"no stage named {name!r} in store {self.root} (names: {known}; "
            "see `featpipe cache ls`)"
        )
