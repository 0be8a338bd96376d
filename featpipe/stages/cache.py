"""Store upkeep behind ``featpipe cache``: verify every computed item, collect garbage.

- :func:`verify`: load every done item, its sidecars and the models of each stage: readable,
  numeric, finite, and the same feature shape as the stage's other items.
- :func:`gc`: remove unnamed stages that no named stage needs, and stale temporary files.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.fileio import HOST
from featpipe.io.importers import describe, signature
from featpipe.stages.base import Reporter, running_names
from featpipe.store import Stage, Store

_TMP = re.compile(r"\.tmp\.([^./]+)\.(\d+)$")


def _load(path: Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)


def verify_stage(stage: Stage) -> tuple[int, list[str]]:
    """Load every done item, its sidecars and the models; returns (items checked, problems)."""
    problems: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    packed = stage.packed()
    for item_id, entry in sorted(stage.item_states().items()):
        if entry.status != "done":
            continue
        path = stage.item_path(item_id)
        if not path.exists() and not (packed is not None and item_id in packed.ids()):
            problems.append(f"item {item_id!r}: the ledger says done but {path} is missing")
            continue
        try:
            array = _load(path) if path.exists() else stage.read_item(item_id)
            extras = list(stage.extras_of(item_id).items())
        except (OSError, ValueError, EOFError, FeatpipeError) as err:
            problems.append(f"item {item_id!r}: unreadable ({err})")
            continue
        for source, values in [("array", array), *extras]:
            if values.dtype.kind not in "biuf":
                problems.append(f"item {item_id!r}: {source} has non-numeric dtype "
                                f"{values.dtype}")
            elif values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                problems.append(f"item {item_id!r}: {source} contains NaN or Inf")
        shapes[item_id] = array.shape
    if shapes:
        counts = Counter(signature(s) for s in shapes.values())
        reference = counts.most_common(1)[0][0]
        for item_id, shape in shapes.items():
            if signature(shape) != reference:
                problems.append(f"item {item_id!r}: shape {shape} but {counts[reference]} other "
                                f"items are {describe(reference)}")
    for npz in sorted((stage.path / "models").glob("*.npz")):
        try:
            stage.load_model(npz.stem)
        except (FeatpipeError, OSError, ValueError, EOFError) as err:
            problems.append(f"model {npz.stem!r}: unreadable ({err})")
    return len(shapes), problems


def verify(store: Store, names: Sequence[str] = (), reporter: Reporter | None = None) -> int:
    """Verify the stages called ``names`` (all stages when empty); returns the problem count."""
    reporter = reporter or Reporter()
    stages = [store.resolve(n) for n in names] if names else store.all_stages()
    total, bad = 0, 0
    for stage in stages:
        checked, problems = verify_stage(stage)
        total += checked
        bad += len(problems)
        for problem in problems:
            reporter.info(f"problem: stage {stage.name}: {problem}")
        missing = len(set(stage.items.ids) - stage.done_ids())
        note = f" ({missing} of {len(stage.items)} not computed)" if missing else ""
        reporter.info(f"{'ok' if not problems else 'BAD'}: stage {stage.name}: {checked} items "
                   f"checked{note}")
    reporter.info(f"verified {total} items in {len(stages)} stages: {bad} problem(s)")
    return bad




def _needed(store: Store) -> set[str]:
    """Stage folders reachable from a name through the inputs chain."""
    keep: set[str] = set()
    todo = [*store.names().values(), *running_names(store).values()]
    while todo:
        folder = todo.pop()
        if folder in keep or not (store.stages_dir / folder / "stage.json").exists():
            continue
        keep.add(folder)
        todo.extend(store.stage_by_folder(folder).input_names)
    return keep


def _last_activity(stage_path: Path) -> float:
    """Latest mtime of the stage folder, its ledgers and its item subfolders (cheap)."""
    paths = [stage_path, stage_path / "ledger", stage_path / "items", stage_path / "models"]
    for sub in ("ledger", "items"):
        if (stage_path / sub).is_dir():
            paths.extend((stage_path / sub).iterdir())
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _is_stale_tmp(path: Path, max_age_s: float) -> bool:
    """A temporary file whose writer is gone: same host and dead pid, or older than max age."""
    match = _TMP.search(path.name)
    if match is None:
        return False
    host, pid = match.group(1), int(match.group(2))
    if host == HOST and pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return time.time() - path.stat().st_mtime > max_age_s


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gc(store: Store, dry_run: bool = False, min_age: float = 10.0,
       reporter: Reporter | None = None) -> int:
    """Remove unnamed stages that no named stage needs and stale temporary files; returns the
    bytes freed (or that would be, with ``dry_run``).

    A stage is needed when a name points to it or to a stage computed from it; one written to
    in the last ``min_age`` minutes is kept (it may be in use).  A temporary file
    (``*.tmp.<host>.<pid>``) is stale when its process is gone (same host) or it is older than
    a day.
    """
    reporter = reporter or Reporter()
    keep = _needed(store)
    verb = "would remove" if dry_run else "removed"
    freed, removed = 0, []
    now = time.time()
    for stage in store.all_stages():
        if stage.name in keep:
            continue
        if now - _last_activity(stage.path) < min_age * 60:
            reporter.info(f"kept stage {stage.name}: written to less than {min_age:g} min ago")
            continue
        size = _size(stage.path)
        if not dry_run:
            shutil.rmtree(stage.path)
        freed += size
        removed.append(stage.path)
        reporter.info(f"{verb} stage {stage.name} ({size / 1e6:.1f} MB)")
    tmp_files = 0
    if store.root.is_dir():
        for path in sorted(store.root.rglob("*.tmp.*")):
            if any(path.is_relative_to(gone) for gone in removed):
                continue
            if path.is_file() and _is_stale_tmp(path, max_age_s=86400):
                size = path.stat().st_size
                if not dry_run:
                    path.unlink(missing_ok=True)
                freed += size
                tmp_files += 1
                reporter.info(f"{verb} temporary file {path}")
    for name, folder in store.names().items():
        if not (store.stages_dir / folder / "stage.json").exists():
            reporter.warn(f"warning: name {name!r} points to missing stage {folder}")
    reporter.info(f"gc: {verb} {len(removed)} stage(s) and {tmp_files} temporary file(s), "
               f"{freed / 1e6:.1f} MB; kept {len(keep)} named or needed stage(s)")
    return freed
