"""``featpipe cache ls|verify|gc|pack``: inspect, verify and clean a store."""

from __future__ import annotations

import click

from featpipe.cli import LazyGroup
from featpipe.cli.common import ClickReporter, open_store, store_option
from featpipe.stages import cache as upkeep
from featpipe.store import Store

CACHE_COMMANDS = {"pack": "featpipe.cli.cache_pack:pack"}


@click.group(cls=LazyGroup, lazy_commands=CACHE_COMMANDS)
def cache():
    """Inspect (ls), check (verify) and clean (gc) a store."""


def _names_by_folder(store: Store) -> dict[str, list[str]]:
    by_folder: dict[str, list[str]] = {}
    for name, folder in store.names().items():
        by_folder.setdefault(folder, []).append(name)
    return by_folder


@cache.command("ls")
@store_option
def ls(store_path):
    """One line per stage: names, stage folder (kind-key), done/failed/total items."""
    store = open_store(store_path)
    stages = store.all_stages()
    if not stages:
        click.echo(f"store {store.root}: no stages")
        return
    names = _names_by_folder(store)
    rows = [("NAMES", "STAGE", "KIND", "DONE", "FAILED", "TOTAL", "INPUTS")]
    for stage in stages:
        rows.append((",".join(names.get(stage.name, [])) or "-", stage.name, stage.kind,
                     str(len(stage.done_ids())), str(len(stage.failed())),
                     str(len(stage.items)), ",".join(stage.input_names) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                   .rstrip())


@cache.command("verify")
@store_option
@click.argument("names", nargs=-1)
def verify(store_path, names):
    """Load every computed item (all stages, or the NAMES given): readable, numeric, finite,
    same feature shape as the stage's other items. Exits 1 naming each bad item."""
    if upkeep.verify(open_store(store_path), names, ClickReporter()):
        raise click.exceptions.Exit(1)


@cache.command("gc")
@store_option
@click.option("--dry-run", is_flag=True, help="List what would be removed, remove nothing.")
@click.option("--min-age", default=10.0, show_default=True, type=float, metavar="MINUTES",
              help="Keep unnamed stages written to in the last MINUTES (may be in use).")
def gc(store_path, dry_run, min_age):
    """Remove unnamed stages that no named stage needs, and stale temporary files.

    A stage is needed when a name points to it or to a stage computed from it. A temporary
    file (``*.tmp.<host>.<pid>``) is stale when its process is gone (same host) or it is older
    than a day.
    """
    upkeep.gc(open_store(store_path), dry_run, min_age, ClickReporter())
