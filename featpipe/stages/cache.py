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

from featpipe.checksums import ChecksumError, DamagedItem, check, file_checksum
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.fileio import (
    HOST,
    TMP_NAME,
    atomic_write_bytes,
    check_npy_header,
    first_line,
    safe_stem,
    stale_tmp,
    writing,
)
from featpipe.io.importers import Signature, describe, signature
from featpipe.progress import stage_progress
from featpipe.stages.base import RUNNING, Reporter, latest_stage, running_names
from featpipe.store import (
    CREATION_GRACE_S,
    MODEL_SUMS,
    NAME_PATTERN,
    REPAIR_STAGE,
    STAGE_FOLDER,
    VIEW_FILE,
    DamagedName,
    DamagedStage,
    Stage,
    Store,
    content,
    is_store,
)
from featpipe.store import index as stage_index
from featpipe.store.batches import BATCH_DIR, BATCH_NAME, batch_checksum
from featpipe.store.content import CACHE_NAME, cache_bytes, load_cache
from featpipe.store.file_kinds import is_known, kind_of
from featpipe.store.layout import within
from featpipe.store.pack import remove_pack, repair_pack
from featpipe.store.packed import PACK_DIR, PACK_INDEX, shard_files


def store_problems(store: Store) -> tuple[list[Stage], list[str], list[str]]:
    """The stages that open, one text per broken stage folder, one per damaged name file or
    unfinished run's marker."""
    store.require()
    stages, broken = store.scan()
    name_problems: list[str] = []
    store.names(name_problems)
    running_names(store, name_problems)
    return stages, [f"stage {folder}: {reason}" for folder, reason in broken], name_problems


@dataclass
class StageCheck:
    """What :func:`verify_stage` found in one stage: the items checked, one text per problem,
    and what ``--repair`` removes: items, models, packed files and batch files that are
    damaged (their bytes differ from their checksums) or unreadable, damaged record files
    (``records``), ledger files with damaged lines (``ledgers``), item files no ledger line
    accounts for (``strays``), a damaged pack index (``pack_index``), the packed files of a
    lost one (``lost_pack``), a damaged index (``index``: a cache of the ledgers);
    ``missing`` counts the done items whose file is gone (a re-run recomputes them);
    ``unchecked`` counts the items written before featpipe kept checksums (read and checked
    for their values only)."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    ledgers: list[str] = field(default_factory=list)
    strays: list[Path] = field(default_factory=list)
    lost_pack: list[Path] = field(default_factory=list)
    pack_index: bool = False
    missing: int = 0
    unchecked: int = 0
    #: done items whose files exist (damaged or not)
    present: int = 0
    #: batch files (:mod:`featpipe.store.batches`) whose bytes differ from their checksums
    batches: list[str] = field(default_factory=list)
    #: whether the index (:mod:`featpipe.store.index`) is damaged or disagrees with the ledgers
    index: bool = False
    #: files that are not featpipe's to remove (:func:`foreign_files`), with why
    foreign: list[tuple[Path, str]] = field(default_factory=list)

    def repairable(self) -> int:
        """How many of the problems ``--repair`` removes (or leaves to a re-run)."""
        return (len(self.items) + len(self.models) + len(self.shards) + len(self.records)
                + len(self.ledgers) + len(self.strays) + bool(self.lost_pack) + self.pack_index
                + self.missing + len(self.batches) + self.index)


#: What each kind of problem's line says will recompute it.
RERUN = "a re-run of the stage's command recomputes it"
#: A value as it was computed (its checksum matches, or the stage has none).
FORCE = "a re-run of the stage's command with --force recomputes it"
REMOVE = "`--repair` removes it and " + RERUN


def verify_stage(stage: Stage) -> StageCheck:
    """Check every record of ``stage`` (``items.csv``, ``read-hashes.json`` against the
    checksums ``stage.json`` keeps; ledger lines against their seals), its index against its
    ledgers, every done item (its files, loose or in a batch file, against their checksums,
    then its values), the item files no ledger line accounts for, the models, the batch files
    and the packed files; see :class:`StageCheck`.  The ledgers are read whole, the index on
    disk is not trusted."""
    found = StageCheck()
    problems = found.problems
    for name in sorted(stage.meta.get("files") or {}):
        if name == VIEW_FILE:  # part of the stage's own record: checked when it opens
            continue
        try:
            stage.read_record(name)
        except FeatpipeError as err:
            problems.append(f"record {name}: {err.cause.split(': ', 1)[-1]}")
            found.records.append(name)
    if "items.csv" in found.records:  # without its item list its items cannot be checked
        return found
    for problem in stage.ledger_problems(fresh=True):
        problems.append(f"{problem} (`--repair` rewrites the ledger without it; {RERUN})")
        found.ledgers.append(problem.split()[1])
    index_problems = stage.index_problems()
    problems.extend(f"{problem}; `--repair` removes it (a cache of the ledgers: the next run "
                    "writes it again)" for problem in index_problems)
    found.index = bool(index_problems)
    try:
        packed = stage.packed()
        if packed is not None:
            packed.ids()
    except FeatpipeError as err:
        problems.append(f"packed files: {err}")
        found.pack_index = True
        packed = None
    if packed is not None:
        for path in packed.files:
            expected = (packed.sums or {}).get(path.name)
            try:
                check(path, file_checksum(path), expected)
            except (ChecksumError, OSError) as err:
                problems.append(f"packed file {path.name}: damaged ({first_line(err)}); "
                                "`--repair` rewrites it without what is damaged and "
                                f"{RERUN.replace(' it', ' that')}")
                found.shards.append(path.name)
    table = stage.item_table(fresh=True)
    batches: dict[str, bool] = {}  # batch file -> exists
    for name in sorted({b for _, b in table.done_items() if b is not None}):
        path = stage.path / BATCH_DIR / name
        batches[name] = path.exists()
        try:
            if batches[name]:
                check(path, file_checksum(path), batch_checksum(name))
        except (ChecksumError, OSError) as err:
            problems.append(f"batch file {name}: damaged ({first_line(err)}); `--repair` "
                            f"removes it and {RERUN.replace(' it', ' its items')}")
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
            problems.append(f"item {item_id!r}: the ledger says done but {where} is missing; "
                            f"{RERUN}")
            found.missing += 1
            continue
        found.present += 1
        try:
            data = stage.read_item(item_id)
            extras = list(stage.extras_of(item_id).items())
        except FeatpipeError as err:
            what = "damaged" if isinstance(err, DamagedItem) else "unreadable"
            cause = err.cause.split("; `featpipe cache verify")[0]
            problems.append(f"item {item_id!r}: {what} ({cause}); {REMOVE}")
            found.items.append(item_id)
            continue
        if loose or state.batch:
            found.unchecked += state.sums is None
            gone = sorted(set(state.sums or ()) - {".npy"} - {f"+{k}.npy" for k, _ in extras})
            if gone:
                problems.append(f"item {item_id!r}: sidecar file(s) {', '.join(gone)} "
                                f"missing; {REMOVE}")
                found.items.append(item_id)
        for source, values in [("array", data), *extras]:
            if values.dtype.kind not in "biuf":
                problems.append(f"item {item_id!r}: {source} has non-numeric dtype "
                                f"{values.dtype}; {FORCE}")
            elif values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                problems.append(f"item {item_id!r}: {source} contains NaN or Inf; {FORCE}")
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
                                f"other items are {describe(reference)}; {FORCE}")

    found.foreign = foreign_files(stage)
    if not stage.running_processes():  # a live run commits its files before their lines
        for path in stray_item_files(stage, table.items()):
            problems.append(f"file {path.relative_to(stage.path)}: no ledger line says its "
                            "item is done (a run killed while committing it, or a damaged "
                            f"ledger); {REMOVE}")
            found.strays.append(path)
        done = set(ids)
        for item_id in sorted(packed.ids() - done) if packed is not None else ():
            problems.append(f"packed item {item_id!r}: no ledger line says it is done (a "
                            f"damaged ledger); {REMOVE}")
            found.items.append(item_id)
        lost = shard_files(stage.path / PACK_DIR) if packed is None and \
            found.missing and not found.pack_index else []
        if lost:  # the files of a pack whose index is gone: their items are lost to reads
            problems.append(f"packed/{PACK_INDEX}: missing, while {len(lost)} packed file(s) "
                            f"are there and {found.missing} done item(s) have no file; "
                            f"`--repair` removes the packed files and {RERUN.replace(' it', '')} "
                            "their items")
            found.lost_pack = lost
    for model in stage.model_names():
        try:
            stage.load_model(model)
        except (FeatpipeError, OSError, ValueError, EOFError) as err:
            problems.append(f"model {model!r}: unreadable ({err})")
            found.models.append(model)
    return found


def _shape(sig: Signature, first: int) -> tuple[int, ...]:
    """The shape of an item of signature ``sig`` whose first dimension is ``first``."""
    ndim, feature = sig
    return feature if ndim <= 1 else (first, *feature)


def stray_item_files(stage: Stage, states) -> list[Path]:
    """The item files under ``items/`` (names featpipe writes, inside the store) that belong
    to no done item of ``stage`` (temporary files of live writers aside): an item committed
    by a killed run before its ledger line, a file left when a ledger was damaged or deleted,
    one put there by hand.  ``states``: the ``(id, state)`` of every item the ledgers name
    (:meth:`featpipe.store.index.Table.items`)."""
    folder = stage.path / "items"
    if not folder.is_dir():
        return []
    expected, unsummed = set(), set()  # file names; stems whose sidecars no line lists
    for item_id, entry in states:
        if entry.status == "done" and entry.batch is None:
            stem = safe_stem(item_id)
            expected.update(stem + suffix for suffix in entry.sums or (".npy",))
            if entry.sums is None:  # written before checksums: any sidecar of it
                unsummed.add(stem)
    root = stage.store.root
    return sorted(path for path in folder.rglob("*")
                  if path.is_file() and path.name not in expected
                  and path.name.split("+")[0].removesuffix(".npy") not in unsummed
                  and _item_file(root, path) and within(root, path))


def _item_file(root: Path, path: Path) -> bool:
    kind = kind_of(path.relative_to(root).as_posix())
    return kind is not None and kind.name in ("item array", "item sidecar")


def foreign_files(stage: Stage, folders: Sequence[str] = (BATCH_DIR, PACK_DIR, "items")
                  ) -> list[tuple[Path, str]]:
    """The files in the folders of ``stage`` that ``gc`` and ``verify --repair`` clean by
    listing them (batch files, packed files, item files) that are not theirs to remove: a
    name featpipe does not write (:func:`featpipe.store.file_kinds.is_known`), or a file
    reached through a link out of the store (:func:`featpipe.store.layout.within`); each
    with why.  They are left alone, and named."""
    root = stage.store.root
    found = []
    for name in folders:
        top = stage.path / name
        if not top.is_dir():
            continue
        for folder, dirs, files in os.walk(top):  # a link to a folder is listed, not entered
            for entry in [*files, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
                path = Path(folder) / entry
                if not is_known(path.relative_to(root).as_posix()):
                    found.append((path, "not a file featpipe writes"))
                elif not within(root, path):
                    found.append((path, "outside the store (through a link)"))
    return found


def foreign_note(path: Path, why: str) -> str:
    """The line that names a file :func:`foreign_files` found (where it really is)."""
    return f"{os.path.realpath(path)}: {why}; left alone"


def repair_stage(stage: Stage, found: StageCheck) -> list[str]:
    """Remove what :func:`verify_stage` found damaged, so that a re-run of the stage's command
    recomputes exactly that (resume computes what is missing): a record file (the re-run
    writes it again), the damaged lines of a ledger (the file is rewritten without them,
    while no process computes the stage), item files no ledger line accounts for, a loose
    item's files (the main array first: without it the item is not done), a damaged
    model's files and those of the other models of its stage (one fit made them), a batch
    file that is damaged or holds a damaged item (whole: its other items are small,
    :mod:`featpipe.store.batches`), from a packed file the damaged items (the file is rewritten
    with the others; an unreadable one is dropped whole), the whole pack when its index is
    damaged, and a damaged index (a cache of the ledgers).  Each item removed gets a
    ``removed`` ledger line, so ``status`` counts it as pending again.  Returns one line per
    thing removed."""
    done, removed = [], []
    for name in found.records:
        path = stage.path / name
        with writing(path, "remove"):
            path.unlink(missing_ok=True)
        done.append(f"removed damaged {name} (a re-run of the stage's command writes it again)")
    if found.ledgers:
        if stage.running_processes():
            raise FeatpipeError(f"stage {stage.name} is being computed now; its damaged ledger "
                                "lines are repaired once no process computes it")
        for name in sorted(set(found.ledgers)):
            done.append(_rewrite_ledger(stage, name))
    for path in found.strays:
        with writing(path, "remove"):
            path.unlink(missing_ok=True)
        done.append(f"removed {path.relative_to(stage.path)} (no ledger line accounts for it)")
    for path in found.lost_pack:
        with writing(path, "remove"):
            path.unlink(missing_ok=True)
        done.append(f"removed {path.relative_to(stage.path)} (its pack index is lost)")
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
    if found.models:  # one fit wrote them all: its re-run fits them all again
        for model in [*found.models, *(m for m in stage.model_names()
                                        if m not in found.models)]:
            for suffix in (MODEL_SUMS, ".npz", ".json"):  # the commit point first
                path = stage.path / "models" / f"{model}{suffix}"
                with writing(path, "remove"):
                    path.unlink(missing_ok=True)
            done.append(f"removed damaged model {model!r}" if model in found.models else
                        f"removed model {model!r} (fitted with the damaged one: the re-run "
                        "fits the stage's models again)")
    if found.pack_index:
        dropped = remove_pack(stage)
        done.append(f"removed the damaged pack ({len(dropped)} packed item(s) to recompute)")
        removed.extend(dropped)
    elif stage.packed() is not None and (packed_ids or found.shards):
        dropped = repair_pack(stage, set(packed_ids), set(found.shards))
        done.extend(f"dropped damaged item {i!r} from the packed files" for i in dropped)
        done.extend(f"rewrote packed file {name} without what is damaged"
                    for name in found.shards)
        removed.extend(dropped)
    if found.missing:
        done.append(f"{found.missing} done item(s) whose file is missing: recomputed by a "
                    "re-run")
    stage.record_removed(removed, "removed by `cache verify --repair` (damaged)")
    if found.index:
        stage_index.remove(stage.path)
        done.append("removed the index (the next run writes it again)")
    return done


def _rewrite_ledger(stage: Stage, name: str) -> str:
    """Rewrite ledger file ``name`` of ``stage`` without its damaged lines (atomically; the
    lines that pass are kept byte for byte)."""
    path = stage.path / "ledger" / name
    keep, dropped = [], 0
    bad = {int(p.split()[3].rstrip(":")) for p in stage.ledger_problems()
           if p.split()[1] == name}
    with writing(path, "rewrite"):
        lines = path.read_bytes().split(b"\n") if 0 not in bad else []
    for lineno, line in enumerate(lines, start=1):
        if lineno in bad:
            dropped += 1
        elif line.strip():
            keep.append(line + b"\n")
    atomic_write_bytes(path, b"".join(keep))
    return f"rewrote ledger {name} without its {dropped} damaged line(s)"


@dataclass
class StoreCheck:
    """What :func:`verify` found outside the stages: stage folders whose ``stage.json`` is
    damaged or missing (``--repair`` removes them, and the names pointing at them), damaged
    name files and run markers (removed), a damaged content-hash cache (hashed again)."""

    problems: list[str] = field(default_factory=list)
    broken: int = 0
    stages: list[str] = field(default_factory=list)
    pointers: list[Path] = field(default_factory=list)
    cache: bool = False
    #: files whose content-hash cache entry holds a wrong SHA-256 under a valid seal, and the
    #: entries hashed again by verify (what ``--repair`` writes the cache with)
    wrong_hashes: list[str] = field(default_factory=list)
    rehashed: dict[str, list] = field(default_factory=dict)


def check_store(store: Store, rehash: bool = False) -> tuple[list[Stage], StoreCheck]:
    """The stages that open, and what :class:`StoreCheck` describes; the content-hash cache's
    seal is checked, and a sample of the files it vouches for hashed again (every one with
    ``rehash``: :func:`featpipe.store.content.recheck_cache`)."""
    stages, broken, _ = store_problems(store)
    found = StoreCheck(broken=len(broken))
    for line in broken:
        folder = line.split()[1].rstrip(":")
        found.problems.append(f"{line}" + ("" if REPAIR_STAGE in line else
                                           f"; {REPAIR_STAGE}"))
        try:
            Stage(store.stages_dir / folder)
        except DamagedStage:
            found.stages.append(folder)
        except FeatpipeError as err:
            if "stage.json missing" in str(err):
                found.stages.append(folder)
    for folder, what in ((store.names_dir, "name"), (store.names_dir / RUNNING,
                                                     "unfinished run of")):
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not path.is_file() or not NAME_PATTERN.match(path.name):
                continue
            try:
                folder = store.read_pointer(path, path.name, what)
            except DamagedName as err:
                found.problems.append(f"{err}; `--repair` removes it and a re-run of the "
                                      "command that named it names it again")
                found.pointers.append(path)
                continue
            except FeatpipeError as err:
                found.problems.append(str(err))
                continue
            if not (store.stages_dir / folder).is_dir():
                found.problems.append(f"{what} {path.name!r} points to missing stage {folder}; "
                                      "`--repair` removes it and a re-run of the command that "
                                      "named it names it again")
                found.pointers.append(path)
            elif not (store.stages_dir / folder / "stage.json").exists() and \
                    folder not in found.stages:  # named once complete: not being created
                found.problems.append(f"stage {folder}: stage.json missing, and {what} "
                                      f"{path.name!r} points to it; {REPAIR_STAGE}")
                found.stages.append(folder)
                found.broken += 1
    cache = store.root / CACHE_NAME
    try:
        entries = load_cache(cache, strict=True)
    except (OSError, ValueError) as err:
        found.problems.append(f"{CACHE_NAME}: damaged ({first_line(err)}); `--repair` hashes "
                              "its files again")
        found.cache = True
        return stages, found
    rehashed, wrong = content.recheck_cache(entries, None if rehash else content.VERIFY_SAMPLE)
    for path in wrong:
        found.problems.append(f"{CACHE_NAME}: the entry of {path} holds SHA-256 "
                              f"{entries[path][4][:12]}... but its bytes hash to "
                              f"{rehashed[path][4][:12]}... under the same stat record; "
                              "`--repair` rewrites the cache with the entries hashed again "
                              "(the other files are hashed again when next used)")
    if wrong:
        found.wrong_hashes, found.rehashed = wrong, rehashed
    return stages, found


def repair_store(store: Store, found: StoreCheck) -> list[str]:
    """Remove what :func:`check_store` found: each damaged stage folder (renamed, then
    deleted: :func:`remove_folder`) with the names and run markers pointing at it, each
    damaged name file or marker, and rebuild a damaged content-hash cache from the files
    whose stat record is still the cached one (hashed again)."""
    done = []
    pointers = [(store.names_dir / name, target) for name, target in store.names().items()]
    pointers += [(store.names_dir / RUNNING / name, target)
                 for name, target in running_names(store).items()]
    for folder in found.stages:
        for path, target in pointers:
            if target == folder:
                remove_file(path)
                done.append(f"removed {path.relative_to(store.root)} (it pointed to {folder})")
        remove_folder(store.stages_dir / folder)
        done.append(f"removed stage {folder}: its stage.json is damaged (a re-run of its "
                    "command computes it again)")
    for path in found.pointers:
        remove_file(path)
        done.append(f"removed damaged {path.relative_to(store.root)}")
    if found.cache:
        done.append(rebuild_cache(store))
    elif found.wrong_hashes:  # the cache lied: keep only what verify hashed again
        atomic_write_bytes(store.root / CACHE_NAME, cache_bytes(found.rehashed))
        done.append(f"rewrote {CACHE_NAME} with the {len(found.rehashed)} file(s) hashed "
                    f"again ({len(found.wrong_hashes)} wrong SHA-256 corrected); the others "
                    "are hashed again when next used")
    return done


def rebuild_cache(store: Store) -> str:
    """Hash again every file of a damaged content-hash cache whose stat record is still the
    one cached (a file changed or gone is left out: hashed when next used)."""
    path = store.root / CACHE_NAME
    try:
        text = path.read_bytes().decode(errors="replace")
        entries = json.loads(text[:text.rfind('"crc32"')].rstrip(", ") + "}") \
            if '"crc32"' in text else json.loads(text)
    except ValueError:
        entries = {}
    kept, _ = content.recheck_cache(entries if isinstance(entries, dict) else {})
    atomic_write_bytes(path, cache_bytes(kept))
    return f"hashed {len(kept)} file(s) of {CACHE_NAME} again"


def with_sources(stages: Sequence[Stage]) -> list[Stage]:
    """``stages``, each once, each view after the stage it reads (a view's items are its
    source's: they are checked, and repaired, there)."""
    found: list[Stage] = []

    def add(stage: Stage) -> None:
        if stage in found:
            return
        try:
            view = stage.view()
        except FeatpipeError:  # its own record: verifying it names the problem
            view = None
        if view is not None:
            add(view[0])
        found.append(stage)

    for stage in stages:
        add(stage)
    return found


def verify(store: Store, names: Sequence[str] = (), reporter: Reporter | None = None,
           repair: bool = False, rehash: bool = False) -> int:
    """Verify the stages called ``names`` and the stages the views among them read (all
    stages, the names, run markers and the content-hash cache when empty: a sample of the
    files it vouches for hashed again, every one with ``rehash``); returns the problem count
    (with ``repair``, of the problems :func:`repair_stage` and :func:`repair_store` could not
    remove).

    A stage that cannot be opened or read counts as a problem; the others are still verified.
    """
    reporter = reporter or Reporter()
    if repair:
        store.check_writable()
    if names:
        stages, outside = [], StoreCheck()
        for name in names:
            try:
                stages.append(store.resolve(name))
            except DamagedStage as err:  # the named stage's own record: repair removes it
                folder = store.read_name(name) if NAME_PATTERN.match(name) and \
                    (store.names_dir / name).is_file() else name
                outside.problems.append(f"stage {folder}: {err}")
                outside.stages.append(folder)
                outside.broken += 1
        stages = with_sources(stages)
    else:
        stages, outside = check_store(store, rehash)
    for problem in outside.problems:
        reporter.info(f"problem: {problem}")
    total, bad, repaired, unchecked = 0, len(outside.problems), 0, 0
    for stage in stages:
        try:
            found = verify_stage(stage)
        except FeatpipeError as err:
            found = StageCheck(problems=[f"unreadable ({err})"])
        try:
            if "items.csv" in found.records:
                missing = 0  # a damaged item list: its problem says so
            elif stage.view() is None:
                missing = max(stage.n_items - found.present, 0)
            else:  # a view's items are its source's
                missing = len(set(stage.items.ids) - stage.done_ids())
        except FeatpipeError:
            missing = 0  # a damaged item list or pack index: its problem says so
        note = f" ({missing} of {stage.n_items} not computed)" if missing else ""
        total += found.checked
        unchecked += found.unchecked if not stage.checksummed else 0
        bad += len(found.problems)
        for problem in found.problems:
            reporter.info(f"problem: stage {stage.name}: {problem}")
        for path, why in found.foreign:
            reporter.info(f"note: stage {stage.name}: {foreign_note(path, why)}")
        reporter.info(f"{'ok' if not found.problems else 'BAD'}: stage {stage.name}: "
                      f"{found.checked} items checked{note}")
        if repair and found.repairable():
            for line in repair_stage(stage, found):
                reporter.info(f"repaired: stage {stage.name}: {line}")
            repaired += found.repairable()
            reporter.info(f"repaired: stage {stage.name}: re-run the command that computed it "
                          "to recompute exactly what was removed")
        if repair and not found.index and stage_index.rebuild_stale(stage.path,
                                                                    stage.parse_line):
            reporter.info(f"repaired: stage {stage.name}: rebuilt the index (its ledgers "
                          "were copied, moved or rewritten)")
    if repair:
        for line in repair_store(store, outside):
            reporter.info(f"repaired: {line}")
        repaired += len(outside.stages) + len(outside.pointers) + outside.cache + \
            len(outside.wrong_hashes)
    n_stages = len(stages) + outside.broken
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
                         "failed": len(progress.failed), "pending": progress.pending,
                         "ledgers": len(progress.ledgers)}
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


def fused_passes(rows: Sequence[dict]) -> list[dict]:
    """The fused passes seen in ``rows`` (:func:`list_stages`): a stage a pass computed
    without writing it is an item stage with no name, no ledger line and no run of its own,
    read by a stage that holds items (directly or through others like it); each pass is
    ``{stage: its extraction, inside: those stages, written: the stages it wrote}``, and each
    row of a stage inside a pass gets ``in_pass`` (its extraction's folder)."""
    by_folder = {row["stage"]: row for row in rows}
    readers: dict[str, list[str]] = {}
    for row in rows:
        for folder in row["inputs"]:
            readers.setdefault(folder, []).append(row["stage"])

    def unwritten(row: dict) -> bool:
        items = row.get("items")
        return bool(items) and not (items["done"] or items["failed"] or items["ledgers"]
                                    or row["names"] or row["unfinished_runs"])

    def holds_items(folder: str) -> bool:
        return bool((by_folder[folder].get("items") or {}).get("done"))

    inside: set[str] = set()
    changed = True
    while changed:
        changed = False
        for folder, row in by_folder.items():
            if folder not in inside and unwritten(row) and any(
                    reader in inside or holds_items(reader)
                    for reader in readers.get(folder, ())):
                inside.add(folder)
                changed = True
    passes: dict[str, dict] = {}
    for folder in sorted(inside):
        top = folder
        while by_folder[top]["inputs"] and by_folder[top]["inputs"][0] in inside:
            top = by_folder[top]["inputs"][0]
        first = by_folder[top]["inputs"][:1]
        root = top if by_folder[top]["kind"] == "extract" or not first or \
            first[0] not in by_folder else first[0]
        entry = passes.setdefault(root, {"stage": root, "inside": [], "written": []})
        entry["inside"].append(folder)
        by_folder[folder]["in_pass"] = root
        for reader in readers.get(folder, ()):
            if reader not in inside and reader not in entry["written"] and holds_items(reader):
                entry["written"].append(reader)
    return sorted(passes.values(), key=lambda p: p["stage"])


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


class HoldsStore(FeatpipeError):
    """A folder to remove holds a featpipe store of its own: it is never removed."""


def holds_store(folder: Path) -> Path | None:
    """The first folder under ``folder`` (itself included; links not followed) that holds a
    featpipe store (:func:`featpipe.store.is_store`), or None."""
    for root, dirs, files in os.walk(folder):
        if ("stages" in dirs or "names" in dirs or CACHE_NAME in files) and \
                is_store(Path(root)):
            return Path(root)
    return None


def remove_folder(path: Path, dry_run: bool = False) -> None:
    """The store's one way to delete a folder (``cache gc``, ``cache rm``, ``cache verify
    --repair``): rename it to a temporary name of this process (atomic: a stage is there or
    gone, never half there), then delete it; a command killed meanwhile leaves
    ``<folder>.tmp.<host>.<pid>``, which the next gc finds (:func:`_leftovers`).  A folder
    that holds a store of its own is never deleted (:class:`HoldsStore`, also raised by a
    ``dry_run``, which removes nothing); a stage folder that is a symbolic link loses the
    link, never what it points to."""
    inner = None if path.is_symlink() else holds_store(path)
    if inner is not None:
        raise HoldsStore(f"{path} holds a featpipe store of its own ({inner}): not removed; "
                         "move that store out of this one")
    if dry_run:
        return
    with writing(path, "remove"):
        if not TMP_NAME.search(path.name):
            trash = path.with_name(f"{path.name}.tmp.{HOST}.{os.getpid()}")
            os.replace(path, trash)
            path = trash
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path)


def remove_file(path: Path) -> None:
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
            if not path.is_dir() and not path.is_symlink():
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
    lines, :mod:`featpipe.store.batches`) and index tables ``index.json`` does not name (an index
    write killed before its record)."""
    found = []
    folder = stage.path / BATCH_DIR
    batch_files = sorted(p for p in folder.iterdir() if BATCH_NAME.match(p.name) and
                         p.is_file() and within(stage.store.root, p)) if folder.is_dir() else []
    if batch_files:
        named = {batch for _, batch in stage.item_table().done_items()}
        found += [(path, "batch file of a killed run") for path in batch_files
                  if path.name not in named]
    try:
        record = stage_index.read_record(stage.path) or {}
    except (OSError, ValueError):
        return found  # a damaged index: verify reports it, nothing is guessed
    found += [(path, "index table of a killed run")
              for path in stage_index.table_files(stage.path)
              if path.name != record.get("table") and within(stage.store.root, path)]
    return found


def _unlisted_shards(stage: Stage) -> list[Path]:
    """Shard files of ``stage`` its pack index does not list (none while a pack runs)."""
    folder = stage.path / PACK_DIR
    shards = [path for path in shard_files(folder) if within(stage.store.root, path)]
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
    if not dry_run:
        store.check_writable()
    keep, unreadable = _needed(store, stages)
    for problem in broken + name_problems + unreadable:
        reporter.warn(f"problem: {problem}")
    blocked = name_problems + unreadable
    if blocked:
        reporter.warn("gc removes no stage while a name or a needed stage cannot be read (it "
                      "cannot tell which stages they keep); `featpipe cache verify --repair` "
                      "removes what is damaged")
    verb = "would remove" if dry_run else "removed"
    freed, removed, held = 0, [], []
    now = time.time()
    for stage in stages:
        if stage.name in keep or blocked:
            continue
        if now - _last_activity(stage.path) < min_age * 60:
            reporter.info(f"kept stage {stage.name}: written to less than {min_age:g} min ago")
            continue
        size = _size_and_files(stage.path)[0]
        try:
            remove_folder(stage.path, dry_run)
        except HoldsStore as err:
            reporter.warn(f"problem: {err}")
            held.append(str(err))
            continue
        freed += size
        removed.append(stage.path)
        reporter.info(f"{verb} stage {stage.name} ({size / 1e6:.1f} MB)")
    leftovers = [] if blocked else _leftovers(
        store, [s for s in stages if s.path not in removed], min_age)
    for path, what in list(leftovers):
        size = _size_and_files(path)[0] if path.is_dir() else path.lstat().st_size
        try:
            if path.is_dir() or path.is_symlink():
                remove_folder(path, dry_run)
            elif not dry_run:
                remove_file(path)
        except HoldsStore as err:
            reporter.warn(f"problem: {err}")
            held.append(str(err))
            leftovers.remove((path, what))
            continue
        freed += size
        reporter.info(f"{verb} {what} {path}")
    tmp_files = 0
    if store.root.is_dir():
        for path in sorted(store.root.rglob("*.tmp.*")):
            if any(path.is_relative_to(gone) for gone in [*removed, *dict(leftovers)]) or \
                    not within(store.root, path):
                continue
            if path.is_file() and stale_tmp(path):
                size = path.stat().st_size
                if not dry_run:
                    remove_file(path)
                freed += size
                tmp_files += 1
                reporter.info(f"{verb} temporary file {path}")
    for stage in stages:
        if stage.path not in removed:
            for path, why in foreign_files(stage, (BATCH_DIR, PACK_DIR)):
                reporter.warn(f"note: {foreign_note(path, why)}")
    for name, folder in store.names().items():
        if not (store.stages_dir / folder / "stage.json").exists():
            reporter.warn(f"warning: name {name!r} points to missing stage {folder}")
    reporter.info(f"gc: {verb} {len(removed)} stage(s), {len(leftovers)} leftover(s) of killed "
                  f"commands and {tmp_files} temporary file(s), {freed / 1e6:.1f} MB; kept "
                  f"{len(keep)} named or needed stage(s)")
    return GcResult(removed, freed, broken + name_problems + unreadable + held)
