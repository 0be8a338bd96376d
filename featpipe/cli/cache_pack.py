"""``featpipe cache pack``: pack a finished stage's items into one HDF5 file per shard."""

from __future__ import annotations

import click

from featpipe.cli.common import check_jobs, open_store, store_option
from featpipe.cli.options import table_entry


def table_source() -> dict[str, int]:
    """The default number of items per HDF5 file, for the help (``options.json``)."""
    from featpipe.store.pack import ITEMS_PER_FILE

    return {"items_per_file": ITEMS_PER_FILE}


@click.command("pack")
@store_option
@click.argument("name")
@click.option("--shards", default=None, type=click.IntRange(min=1),
              help="Number of HDF5 files (default: one per "
                   f"{table_entry('cache pack')['items_per_file']} items).")
@click.option("--keep-files", is_flag=True,
              help="Keep the loose .npy files after packing (default: remove them).")
@click.option("--jobs", "-j", default=1, show_default=True, type=int, callback=check_jobs,
              help="Processes writing different HDF5 files at once (capped at the cores; "
                   "-1: one per core).")
def pack(store_path, name, shards, keep_files, jobs):
    """Pack the items of finished stage NAME into HDF5 files (readers use them transparently).

    Every packed item is read back and compared bit for bit before any loose file is removed.
    """
    from featpipe.store.pack import pack_stage

    stage = open_store(store_path).resolve(name)
    click.echo(f"stage {stage.name}")
    summary = pack_stage(stage, shards=shards, keep_files=keep_files, jobs=jobs)
    click.echo(summary.line())
