"""What refers to a stage (``featpipe cache refs``), and removing a name (``cache rm``).

A stage is referred to by the names pointing at it, by the markers of runs that compute it and
have not completed (``names/.running/NAME``), and by the stages computed from it (their
``inputs``).  ``cache rm NAME`` removes the name (and its run marker), then its stage only
when nothing else refers to it; a stage still referred to is kept, and every reference that
keeps it is listed.  While a stage folder cannot be read no stage is removed: it may be
computed from the one to remove (a stage whose own ``stage.json`` is damaged is removed like
any other).  A stage is removed as ``cache gc`` removes one
(:func:`featpipe.stages.cache.remove_folder`): renamed, then deleted, so a killed ``rm``
leaves a ``<folder>.tmp.<host>.<pid>`` that gc collects, never a half-deleted stage.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from featpipe.errors import FeatpipeError
from featpipe.fileio import writing
from featpipe.progress import stage_progress
from featpipe.stages.base import RUNNING, Reporter, latest_stage, running_names
from featpipe.stages.cache import remove_folder
from featpipe.store import STAGE_FOLDER, DamagedStage, Stage, Store

_KEY = re.compile(r"^[0-9a-f]{6,}$")


@dataclass
class References:
    """Who refers to stage folder ``stage``: ``names``, ``running`` (names of runs computing
    it), ``dependents`` (stage folder -> its names) and ``needed_by`` (names whose inputs
    chain reaches it, itself excluded); ``unreadable``: stage folders that could not be read
    (they may be computed from it)."""

    stage: str
    kind: str
    names: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    dependents: dict[str, list[str]] = field(default_factory=dict)
    needed_by: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def keeping(self, except_name: str | None = None) -> list[str]:
        """The references that keep the stage once ``except_name`` is gone, as text."""
        found = []
        names = [n for n in self.names if n != except_name]
        running = [n for n in self.running if n != except_name]
        if names:
            found.append(f"name(s) {', '.join(names)}")
        if running:
            found.append(f"unfinished run(s) for {', '.join(running)}")
        if self.dependents:
            found.append("input of " + ", ".join(
                folder + (f" ({', '.join(names)})" if names else "")
                for folder, names in self.dependents.items()))
        if self.unreadable:
            found.append(f"unreadable stage(s) {', '.join(self.unreadable)} (they may be "
                         "computed from it)")
        return found

    def to_dict(self) -> dict:
        return asdict(self)


def find_stage(store: Store, text: str) -> Stage:
    """The stage called ``text``: a name, a stage folder (``kind-key``) or a key alone.  A
    name whose last run has not completed gives the stage that run computes, as ``featpipe
    status NAME`` does (:func:`~featpipe.stages.base.latest_stage`)."""
    store.require()
    if _KEY.match(text) and not (store.names_dir / text).is_file():
        matches = sorted(p.name for p in store.stages_dir.glob(f"*-{text}*")
                         if (p / "stage.json").exists()) if store.stages_dir.is_dir() else []
        if len(matches) == 1:
            return store.stage_by_folder(matches[0])
        if len(matches) > 1:
            raise FeatpipeError(f"key {text!r} matches {len(matches)} stages: "
                                f"{', '.join(matches)}; give more of it")
    return latest_stage(store, text)


def references(store: Store, folder: str) -> References:
    """Every reference to stage ``folder`` (see :class:`References`); a stage whose
    ``stage.json`` is damaged has the kind its folder name says."""
    try:
        kind = store.stage_by_folder(folder).kind
    except DamagedStage:
        kind = folder.rsplit("-", 1)[0]
    names = store.names()
    running = running_names(store)
    stages, broken = store.scan()
    refs = References(folder, kind,
                      names=sorted(n for n, f in names.items() if f == folder),
                      running=sorted(n for n, f in running.items() if f == folder),
                      unreadable=sorted(f for f, _ in broken if f != folder))
    inputs = {s.name: s.input_names for s in stages}
    for other in stages:
        if folder in other.input_names:
            refs.dependents[other.name] = sorted(n for n, f in names.items()
                                                 if f == other.name)
    for name, start in sorted({**running, **names}.items()):
        todo, seen = list(inputs.get(start, [])), set()
        while todo:
            current = todo.pop()
            if current == folder:
                refs.needed_by.append(name)
                break
            if current not in seen:
                seen.add(current)
                todo.extend(inputs.get(current, []))
    return refs


@dataclass
class Removal:
    """What :func:`remove` removed (or would): the name, run marker and stage folders."""

    name: str | None
    marker: bool
    removed: list[str]
    kept: dict[str, list[str]]


def remove(store: Store, target: str, dry_run: bool = False,
           reporter: Reporter | None = None) -> Removal:
    """Remove name ``target`` (and its run marker), and each stage it held when nothing else
    refers to it; ``target`` may also be a stage folder, removed when nothing refers to it.

    A run marker whose stage is being computed now (a live process or a recent ledger line)
    is an error: stop that run first.
    """
    reporter = reporter or Reporter()
    store.require()
    names = store.names()
    running = running_names(store)
    if target in names or target in running:
        name = target
        folders = list(dict.fromkeys(f for f in (names.get(name), running.get(name)) if f))
    elif STAGE_FOLDER.match(target) and (store.stages_dir / target).is_dir():
        name, folders = None, [target]  # also a stage whose stage.json is damaged
    else:
        name = None
        folders = [find_stage(store, target).name]
    try:
        marked = store.stage_by_folder(running[name]) if name in running else None
    except FeatpipeError:  # missing or damaged: no run computes it
        marked = None
    if marked is not None:
        if not marked.is_model_stage and stage_progress(marked).running():
            raise FeatpipeError(f"a run for {name!r} is computing stage {marked.name} now; "
                                "stop it (or let it finish) before removing the name")
    verb = "would remove" if dry_run else "removed"
    if not dry_run:
        store.check_writable()
    if name in names:
        if not dry_run:
            with writing(store.names_dir / name, "remove"):
                (store.names_dir / name).unlink()
        reporter.info(f"{verb} name {name} (pointed to {names[name]})")
    if name in running:
        if not dry_run:
            with writing(store.names_dir / RUNNING / name, "remove"):
                (store.names_dir / RUNNING / name).unlink()
        reporter.info(f"{verb} the unfinished run's marker for {name} (stage {running[name]})")
    removed, kept = [], {}
    for folder in folders:
        if not (store.stages_dir / folder).is_dir():
            reporter.warn(f"warning: stage {folder} is missing already")
            continue
        keeping = references(store, folder).keeping(except_name=name)
        if keeping:
            kept[folder] = keeping
            reporter.info(f"kept stage {folder}: still referred to by {'; '.join(keeping)}")
            continue
        remove_folder(store.stages_dir / folder, dry_run)
        removed.append(folder)
        reporter.info(f"{verb} stage {folder} (nothing else refers to it)")
    return Removal(name, name in running, removed, kept)
