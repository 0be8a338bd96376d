"""Store upkeep behind ``featpipe cache``: inspect, verify every computed item, collect garbage.

- :func:`describe_stage` / :func:`list_stages`: what a stage is (names, kind, parameters,
  inputs, creation, size, item counts or its models), for ``cache ls`` and ``cache show``.
- :func:`verify`: check every done item, its sidecars, the models and packed files of each
  stage against the checksums taken when they were written, then their values: readable,
  numeric, finite, and the same feature shape as the stage's other items; with ``repair``
  remove what is damaged so that a re-run recomputes exactly that (:func:`repair_stage`).
- :func:`gc`: remove unnamed stages that no named stage needs, what killed commands left
  (temporary files and folders, stage folders without ``stage.json``, unlisted shard files).

A broken stage (corrupt ``stage.json``, packed file, ledger line, name file) is reported as a
``problem:`` line and the others are still listed, verified or collected.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import zipfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featpipe import index as stage_index
from featpipe.batches import BATCH_DIR, batch_checksum
from featpipe.checksums import ChecksumError, DamagedItem, check, file_checksum
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.fileio import (
    HOST,
    TMP_NAME,
    check_npy_header,
    first_line,
    safe_stem,
    stale_tmp,
    writing,
)
from featpipe.io.importers import Signature, describe, signature
from featpipe.pack import repair_pack
from featpipe.packed import PACK_DIR, PACK_INDEX
from featpipe.progress import stage_progress
from featpipe.stages.base import Reporter, latest_stage, running_names
from featpipe.store import CREATION_GRACE_S, MODEL_SUMS, STAGE_FOLDER, Stage, Store


def store_problems(store: Store) -> tuple[list[Stage], list[str], list[str]]:
    """The stages that open, one text per broken stage folder, one per corrupt name file."""
    store.require()
    stages, broken = store.scan()
    name_problems: list[str] = []
    store.names(name_problems)
    return stages, [f"stage {folder}: {reason}" for folder, reason in broken], name_problems


@dataclass
class StageCheck:
    """What :func:`verify_stage` found in one stage: the items checked, one text per problem,
    and what ``--repair`` removes: items, models and packed files that are damaged (their
    bytes differ from their checksums) or unreadable; ``unchecked`` counts the items written
    before featpipe kept checksums (read and checked for their values only)."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    unchecked: int = 0
    #: done items whose files exist (damaged or not)
    present: int = 0
    #: batch files (:mod:`featpipe.batches`) whose bytes differ from their checksums
    batches: list[str] = field(default_factory=list)
    #: whether the index (:mod:`featpipe.index`) is damaged or disagrees with the ledgers
    index: bool = False


def verify_stage(stage: Stage) -> StageCheck:
    """Check every done item (its files against their checksums, then its values), the
    models and the packed files of ``stage``; see :class:`StageCheck`."""
    found = StageCheck(problems=list(stage.ledger_problems()))
    problems = found.problems
    index_problems = stage.index_problems()
    problems.extend(index_problems)
    found.index = bool(index_problems)
    packed = stage.packed()
    if packed is not None:
        for path in packed.files:
            expected = (packed.sums or {}).get(path.name)
            try:
                check(path, file_checksum(path), expected)
            except (ChecksumError, OSError) as err:
                problems.append(f"packed file {path.name}: damaged ({first_line(err)})")
                found.shards.append(path.name)
    table = stage.item_table()
    batches: dict[str, bool] = {}  # batch file -> exists
    for name in sorted({b for _, b in table.done_items() if b is not None}):
        path = stage.path / BATCH_DIR / name
        batches[name] = path.exists()
        try:
            if batches[name]:
                check(path, file_checksum(path), batch_checksum(name))
        except (ChecksumError, OSError) as err:
            problems.append(f"batch file {name}: damaged ({first_line(err)})")
            found.batches.append(name)
    by_signature: dict[Signature, tuple[array, array]] = {}  # rows of ``ids``, first dims
    ids = sorted(item_id for item_id, _ in table.done_items())
    for row, item_id in enumerate(ids):
        state = table.get(item_id)
        path = stage.item_path(item_id)
        loose = path.exists()
        if not loose and not batches.get(state.batch) and not (
                packed is not None and item_id in packed.ids()):
            where = stage.path / BATCH_DIR / state.batch if state.batch else path
            problems.append(f"item {item_id!r}: the ledger says done but {where} is missing")
            continue
        found.present += 1
        try:
            data = stage.read_item(item_id)
            extras = list(stage.extras_of(item_id).items())
        except FeatpipeError as err:
            what = "damaged" if isinstance(err, DamagedItem) else "unreadable"
            problems.append(f"item {item_id!r}: {what} ({err.cause})")
            found.items.append(item_id)
            continue
        if loose or state.batch:
            found.unchecked += state.sums is None
            gone = sorted(set(state.sums or ()) - {".npy"} - {f"+{k}.npy" for k, _ in extras})
            if gone:
                problems.append(f"item {item_id!r}: sidecar file(s) {', '.join(gone)} missing")
                found.items.append(item_id)
        for source, values in [("array", data), *extras]:
            if values.dtype.kind not in "biuf":
                problems.append(f"item {item_id!r}: {source} has non-numeric dtype "
                                f"{values.dtype}")
            elif values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                problems.append(f"item {item_id!r}: {source} contains NaN or Inf")
        rows, firsts = by_signature.setdefault(signature(data.shape), (array("q"), array("q")))
        rows.append(row)
        firsts.append(data.shape[0] if data.ndim else 0)
        found.checked += 1
    if by_signature:
        reference = max(by_signature, key=lambda sig: len(by_signature[sig][0]))
        count = len(by_signature[reference][0])
        for sig, (rows, firsts) in by_signature.items():
            if sig == reference:
                continue
            for row, first in zip(rows, firsts, strict=True):
                problems.append(f"item {ids[row]!r}: shape {_shape(sig, first)} but {count} "
                                f"other items are {describe(reference)}")
    for npz in sorted((stage.path / "models").glob("*.npz")):
        try:
            stage.load_model(npz.stem)
        except (FeatpipeError, OSError, ValueError, EOFError) as err:
            problems.append(f"model {npz.stem!r}: unreadable ({err})")
            found.models.append(npz.stem)
    return found


def _shape(sig: Signature, first: int) -> tuple[int, ...]:
    """The shape of an item of signature ``sig`` whose first dimension is ``first``."""
    ndim, feature = sig
    return feature if ndim <= 1 else (first, *feature)


def repair_stage(stage: Stage, found: StageCheck) -> list[str]:
    """Remove what :func:`verify_stage` found damaged, so that a re-run of the stage's command
    recomputes exactly that (resume computes what is missing): a loose item's files (the main
    array first: without it the item is not done), a model's files, and from a packed file
    the damaged items (the file is rewritten with the others; an unreadable one is dropped
    whole), a batch file that is damaged or holds a damaged item (whole: its other items
    are small, :mod:`featpipe.batches`) and a damaged index.  Each item removed gets a
    ``removed`` ledger line, so ``status`` counts it as pending again.  Returns one line per
    thing removed."""
    done, removed = [], []
    batched = {i: stage.batch_of(i) for i in found.items if stage.batch_of(i) is not None
               and stage.batch_of(i).exists()}
    packed_ids = [i for i in found.items if not stage.item_path(i).exists() and
                  i not in batched]
    batch_files = sorted(set(found.batches) | {path.name for path in batched.values()})
    for item_id in found.items:
        main = stage.item_path(item_id)
        if main.exists():
            for path in [main, *main.parent.glob(f"{safe_stem(item_id)}+*.npy")]:
                with writing(path, "remove"):
                    path.unlink(missing_ok=True)
            done.append(f"removed damaged item {item_id!r}")
            removed.append(item_id)
    if batch_files:
        held: dict[str, list[str]] = {}
        for item_id, batch in stage.item_table().done_items():
            held.setdefault(batch, []).append(item_id)
        for name in batch_files:
            path = stage.path / BATCH_DIR / name
            with writing(path, "remove"):
                path.unlink(missing_ok=True)
            removed.extend(held.get(name, []))
            done.append(f"removed batch file {name} ({len(held.get(name, []))} item(s), "
                        "damaged or holding a damaged item)")
    for model in found.models:
        for suffix in (".npz", ".json", MODEL_SUMS):
            path = stage.path / "models" / f"{model}{suffix}"
            with writing(path, "remove"):
                path.unlink(missing_ok=True)
        done.append(f"removed damaged model {model!r}")
    if stage.packed() is not None and (packed_ids or found.shards):
        dropped = repair_pack(stage, set(packed_ids), set(found.shards))
        done.extend(f"dropped damaged item {i!r} from the packed files" for i in dropped)
        removed.extend(dropped)
    stage.record_removed(removed, "removed by `cache verify --repair` (damaged)")
    if found.index:
        stage_index.remove(stage.path)
        done.append("removed the index (the next run writes it again)")
    return done


def verify(store: Store, names: Sequence[str] = (), reporter: Reporter | None = None,
           repair: bool = False) -> int:
    """Verify the stages called ``names`` (all stages when empty); returns the problem count
    (with ``repair``, of the problems :func:`repair_stage` could not remove).

    A stage that cannot be opened or read counts as a problem; the others are still verified.
    """
    reporter = reporter or Reporter()
    if names:
        stages, store_level, broken = [store.resolve(n) for n in names], [], []
    else:
        stages, broken, name_problems = store_problems(store)
        store_level = broken + name_problems
    for problem in store_level:
        reporter.info(f"problem: {problem}")
    total, bad, repaired, unchecked = 0, len(store_level), 0, 0
    for stage in stages:
        try:
            found = verify_stage(stage)
            missing = stage.n_items - found.present
            note = f" ({missing} of {stage.n_items} not computed)" if missing else ""
        except FeatpipeError as err:
            found, note = StageCheck(problems=[f"unreadable ({err})"]), ""
        total += found.checked
        unchecked += found.unchecked
        bad += len(found.problems)
        for problem in found.problems:
            reporter.info(f"problem: stage {stage.name}: {problem}")
        reporter.info(f"{'ok' if not found.problems else 'BAD'}: stage {stage.name}: "
                      f"{found.checked} items checked{note}")
        if repair and (found.items or found.models or found.shards or found.batches or
                       found.index):
            lines = repair_stage(stage, found)
            for line in lines:
                reporter.info(f"repaired: stage {stage.name}: {line}")
            repaired += len(found.items) + len(found.models) + len(found.shards) + \
                len(found.batches) + found.index
            reporter.info(f"repaired: stage {stage.name}: re-run the command that computed it "
                          "to recompute exactly what was removed")
    n_stages = len(stages) + len(broken)
    reporter.info(f"verified {total} items in {n_stages} stages: {bad} problem(s)"
                  + (f", {repaired} repaired" if repair else ""))
    if unchecked:
        reporter.info(f"note: {unchecked} item(s) were written before featpipe kept checksums: "
                      "checked for their values only (re-run with --force to add checksums)")
    return max(bad - repaired, 0) if repair else bad


# -- inspection -------------------------------------------------------------------------------

def names_by_folder(store: Store) -> dict[str, list[str]]:
    """The names pointing at each stage folder."""
    by_folder: dict[str, list[str]] = {}
    for name, folder in store.names().items():
        by_folder.setdefault(folder, []).append(name)
    return by_folder


def runs_by_folder(store: Store) -> dict[str, list[str]]:
    """The names whose unfinished run computes each stage folder (``names/.running``)."""
    by_folder: dict[str, list[str]] = {}
    for name, folder in running_names(store).items():
        by_folder.setdefault(folder, []).append(name)
    return by_folder


def model_arrays(stage: Stage, name: str) -> dict[str, dict]:
    """Shape and dtype of each array of model ``name``, read from the ``.npz`` headers (no
    array is loaded)."""
    path = stage.path / "models" / f"{name}.npz"
    found = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as handle:
                    shape, dtype = check_npy_header(handle, info.file_size)
                found[info.filename[:-4]] = {"shape": list(shape), "dtype": str(dtype)}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise FeatpipeError(f"model {name!r} of stage {stage.name}: {path} is unreadable "
                            f"({err})") from None
    return found


def describe_stage(stage: Stage, names: Sequence[str] = (), sizes: bool = True,
                   models: bool = False, runs: Sequence[str] = ()) -> dict:
    """What ``cache ls``/``cache show`` print about a stage, as JSON-ready data.

    ``runs`` (``unfinished_runs``) are the names whose unfinished run computes the stage
    (``featpipe status NAME`` follows them here).
    Item stages have ``items`` (total, done, failed); fit stages have ``models`` (their
    names, or with ``models=True`` each model's arrays and metadata).  ``size_bytes`` sums
    the files of the stage folder.
    """
    meta = stage.meta
    info = {"stage": stage.name, "names": list(names), "unfinished_runs": list(runs),
            "kind": stage.kind, "key": stage.key,
            "created": meta.get("created"), "host": meta.get("host"),
            "dtype": meta.get("dtype", "float32"), "versions": meta.get("versions", {}),
            "inputs": stage.input_names, "params": stage.params}
    if sizes:
        info["size_bytes"], info["files"] = _size_and_files(stage.path)
    if stage.is_model_stage:
        info["items"] = None
        if models:
            info["models"] = {}
            for model in stage.model_names():
                _, model_meta = stage.load_model(model)
                written = (stage.path / "models" / f"{model}.npz").stat().st_mtime
                info["models"][model] = {"arrays": model_arrays(stage, model),
                                         "meta": model_meta, "written": written}
        else:
            info["models"] = stage.model_names()
    else:
        progress = stage_progress(stage)
        info["items"] = {"total": progress.total, "done": progress.done,
                         "failed": len(progress.failed), "pending": progress.pending}
        info["packed"] = stage.packed() is not None
    return info


def list_stages(store: Store) -> tuple[list[dict], list[str]]:
    """:func:`describe_stage` of every stage, and the problems of those that cannot be read."""
    stages, broken, name_problems = store_problems(store)
    problems = broken + name_problems
    names, runs = names_by_folder(store), runs_by_folder(store)
    rows = []
    for stage in stages:
        try:
            rows.append(describe_stage(stage, names.get(stage.name, []),
                                       runs=runs.get(stage.name, [])))
        except FeatpipeError as err:
            problems.append(f"stage {stage.name}: {err}")
    return rows, problems


def input_chain(stage: Stage, names: dict[str, list[str]]) -> list[dict]:
    """The stages ``stage`` was computed from, recursively: ``{stage, kind, names, inputs}``
    (a missing or broken input is listed with its ``problem``)."""
    def walk(folder: str, seen: frozenset[str]) -> dict:
        node = {"stage": folder, "names": names.get(folder, [])}
        if folder in seen:
            return {**node, "problem": "cycle in the inputs chain"}
        try:
            parent = stage.store.stage_by_folder(folder)
        except FeatpipeError as err:
            return {**node, "problem": str(err)}
        return {**node, "kind": parent.kind, "params": parent.params,
                "inputs": [walk(f, seen | {folder}) for f in parent.input_names]}

    return [walk(folder, frozenset({stage.name})) for folder in stage.input_names]


def show(store: Store, name: str) -> dict:
    """Everything about stage ``name`` (``cache show``): :func:`describe_stage` with models in
    full, the inputs chain, and for item stages the timings and the first item's shape."""
    stage = latest_stage(store, name)
    names = names_by_folder(store)
    info = describe_stage(stage, names.get(stage.name, []), models=True,
                          runs=runs_by_folder(store).get(stage.name, []))
    info["input_chain"] = input_chain(stage, names)
    if not stage.is_model_stage:
        progress = stage_progress(stage)
        firsts = [p.first for p in progress.ledgers if p.first is not None]
        lasts = [p.last for p in progress.ledgers if p.last is not None]
        info["timings"] = {
            "compute_seconds": sum(p.seconds for p in progress.ledgers),
            "first_line": min(firsts, default=None), "last_line": max(lasts, default=None),
            "processes": len(progress.ledgers),
            "items_per_second": progress.rate}
        done = sorted(stage.done_ids() & set(stage.items.ids))
        if done:
            first = stage.read_item(done[0], mmap=not info["packed"])
            info["item_example"] = {"id": done[0], "shape": list(first.shape),
                                    "dtype": str(first.dtype),
                                    "extras": sorted(stage.extras_of(done[0]))}
    return info


def _needed(store: Store, stages: Sequence[Stage]) -> tuple[set[str], list[str]]:
    """Stage folders reachable through the inputs chain from a name, from the marker of an
    unfinished named run, or from a stage a live process computes (named or not: its
    inputs are read while it runs), and the named or needed stages whose inputs cannot be
    read (gc then removes no stage: it cannot tell which of the others they need)."""
    keep: set[str] = set()
    unreadable: list[str] = []
    todo = [*store.names().values(), *running_names(store).values(),
            *(stage.name for stage in stages if stage.running_processes())]
    while todo:
        folder = todo.pop()
        if folder in keep or not (store.stages_dir / folder / "stage.json").exists():
            continue
        keep.add(folder)
        try:
            todo.extend(store.stage_by_folder(folder).input_names)
        except FeatpipeError as err:
            unreadable.append(f"stage {folder}: {err}")
    return keep, unreadable


def _last_activity(stage_path: Path) -> float:
    """Latest mtime of the stage folder, its ledgers and its item subfolders (cheap)."""
    paths = [stage_path, stage_path / "ledger", stage_path / "items", stage_path / "models"]
    for sub in ("ledger", "items"):
        if (stage_path / sub).is_dir():
            paths.extend((stage_path / sub).iterdir())
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _remove_folder(path: Path) -> None:
    """Rename the folder to a temporary name of this process (atomic: a stage is there or
    gone), then delete it; a gc killed meanwhile leaves ``<folder>.tmp.<host>.<pid>``, which
    the next gc finds (:func:`_leftovers`)."""
    with writing(path, "remove"):
        if not TMP_NAME.search(path.name):
            trash = path.with_name(f"{path.name}.tmp.{HOST}.{os.getpid()}")
            os.replace(path, trash)
            path = trash
        shutil.rmtree(path)


def _remove_file(path: Path) -> None:
    with writing(path, "remove"):
        path.unlink(missing_ok=True)


def _leftovers(store: Store, stages: Sequence[Stage], min_age: float
               ) -> list[tuple[Path, str]]:
    """What killed commands left in the store: folders a killed gc was deleting
    (``stages/<folder>.tmp.<host>.<pid>``), stage folders without ``stage.json`` (a killed
    creation or an older gc) untouched for ``min_age`` minutes, and the shard files of a
    killed ``cache pack`` that its index does not list (while no pack holds the stage's
    lock, and written ``min_age`` minutes ago: a file system without locks is not trusted
    to say)."""
    found: list[tuple[Path, str]] = []
    if store.stages_dir.is_dir():
        for path in sorted(store.stages_dir.iterdir()):
            if not path.is_dir():
                continue
            if TMP_NAME.search(path.name) and stale_tmp(path):
                found.append((path, "folder of a killed gc"))
            elif STAGE_FOLDER.match(path.name) and not (path / "stage.json").exists() and \
                    time.time() - _last_activity(path) > max(CREATION_GRACE_S, min_age * 60):
                found.append((path, "stage folder without stage.json"))
    for stage in stages:
        found += [(path, "shard file of a killed pack") for path in _unlisted_shards(stage)
                  if time.time() - path.stat().st_mtime > min_age * 60]
        found += [(path, what) for path, what in _unnamed_files(stage)
                  if time.time() - path.stat().st_mtime > max(CREATION_GRACE_S, min_age * 60)]
    return found


def _unnamed_files(stage: Stage) -> list[tuple[Path, str]]:
    """Batch files no ledger line names (a process killed between writing one and its
    lines, :mod:`featpipe.batches`) and index tables ``index.json`` does not name (an index
    write killed before its record)."""
    found = []
    folder = stage.path / BATCH_DIR
    batch_files = sorted(folder.glob("*.npz")) if folder.is_dir() else []
    if batch_files:
        named = {batch for _, batch in stage.item_table().done_items()}
        found += [(path, "batch file of a killed run") for path in batch_files
                  if path.name not in named]
    try:
        record = stage_index.read_record(stage.path) or {}
    except (OSError, ValueError):
        return found  # a damaged index: verify reports it, nothing is guessed
    found += [(path, "index table of a killed run")
              for path in sorted(stage.path.glob(f"{stage_index.TABLE_PREFIX}*.npz"))
              if path.name != record.get("table")]
    return found


def _unlisted_shards(stage: Stage) -> list[Path]:
    """Shard files of ``stage`` its pack index does not list (none while a pack runs)."""
    folder = stage.path / PACK_DIR
    shards = sorted(folder.glob("shard-*.h5")) if folder.is_dir() else []
    if not shards:
        return []

    def busy() -> None:
        raise _Busy

    try:
        with stage.exclusive("pack", busy):
            try:
                listed = set(json.loads((folder / PACK_INDEX).read_text())["files"])
            except FileNotFoundError:
                listed = set()
            except (OSError, ValueError, KeyError, TypeError):
                return []  # a damaged index: verify reports it, nothing is guessed
            return [path for path in shards if path.name not in listed]
    except _Busy:
        return []


class _Busy(Exception):
    """A pack holds the stage's pack lock."""


def _size_and_files(path: Path) -> tuple[int, int]:
    """Bytes and number of files under ``path`` (files removed meanwhile are skipped)."""
    total, count = 0, 0
    for root, _, files in os.walk(path):
        for file in files:
            try:
                total += os.lstat(os.path.join(root, file)).st_size
                count += 1
            except FileNotFoundError:
                continue
    return total, count


@dataclass
class GcResult:
    """What :func:`gc` removed (or would): stage folders, bytes, and the problems it met."""

    removed: list[Path]
    freed: int
    problems: list[str]


def gc(store: Store, dry_run: bool = False, min_age: float = 10.0,
       reporter: Reporter | None = None) -> GcResult:
    """Remove unnamed stages that no named stage needs, what killed commands left
    (:func:`_leftovers`) and stale temporary files.

    A stage is needed when a name, the marker of an unfinished named run
    (``names/.running/NAME``, also after its process was killed) or a live process computing
    a stage (its ``running/`` marker, named run or not) points to it or to a stage computed
    from it; a stage written to in the last ``min_age`` minutes is kept too (it may be in
    use).  A temporary file (``*.tmp.<host>.<pid>``) is stale when its process is gone (same
    host) or it is older than a day.  While a name or a needed stage cannot be read, no
    stage is removed.
    """
    if not math.isfinite(min_age) or min_age < 0:
        raise ParameterError("min_age", f"must be a number of minutes >= 0, got {min_age}")
    reporter = reporter or Reporter()
    stages, broken, name_problems = store_problems(store)
    keep, unreadable = _needed(store, stages)
    for problem in broken + name_problems + unreadable:
        reporter.warn(f"problem: {problem}")
    blocked = name_problems + unreadable
    if blocked:
        reporter.warn("gc removes no stage while a name or a needed stage cannot be read (it "
                      "cannot tell which stages they keep); fix or remove it first")
    verb = "would remove" if dry_run else "removed"
    freed, removed = 0, []
    now = time.time()
    for stage in stages:
        if stage.name in keep or blocked:
            continue
        if now - _last_activity(stage.path) < min_age * 60:
            reporter.info(f"kept stage {stage.name}: written to less than {min_age:g} min ago")
            continue
        size = _size_and_files(stage.path)[0]
        if not dry_run:
            _remove_folder(stage.path)
        freed += size
        removed.append(stage.path)
        reporter.info(f"{verb} stage {stage.name} ({size / 1e6:.1f} MB)")
    leftovers = [] if blocked else _leftovers(
        store, [s for s in stages if s.path not in removed], min_age)
    for path, what in leftovers:
        size = _size_and_files(path)[0] if path.is_dir() else path.stat().st_size
        if dry_run:
            pass
        elif path.is_dir():
            _remove_folder(path)
        else:
            _remove_file(path)
        freed += size
        reporter.info(f"{verb} {what} {path}")
    tmp_files = 0
    if store.root.is_dir():
        for path in sorted(store.root.rglob("*.tmp.*")):
            if any(path.is_relative_to(gone) for gone in [*removed, *dict(leftovers)]):
                continue
            if path.is_file() and stale_tmp(path):
                size = path.stat().st_size
                if not dry_run:
                    _remove_file(path)
                freed += size
                tmp_files += 1
                reporter.info(f"{verb} temporary file {path}")
    for name, folder in store.names().items():
        if not (store.stages_dir / folder / "stage.json").exists():
            reporter.warn(f"warning: name {name!r} points to missing stage {folder}")
    reporter.info(f"gc: {verb} {len(removed)} stage(s), {len(leftovers)} leftover(s) of killed "
                  f"commands and {tmp_files} temporary file(s), {freed / 1e6:.1f} MB; kept "
                  f"{len(keep)} named or needed stage(s)")
    return GcResult(removed, freed, broken + name_problems + unreadable)
