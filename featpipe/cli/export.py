"""``featpipe export``: a stage's items, sidecars, ids, labels and splits as one ``.npz``,
HDF5 or MATLAB ``.mat`` file (the suffix of ``-o`` picks the format), or as one ``.npy`` per
item in a folder (``--per-item``, :mod:`featpipe.io.per_item`)."""

from __future__ import annotations

import click

from featpipe.cli.common import open_store, store_option


@click.command("export")
@store_option
@click.argument("name")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="File to write: .npz, .h5/.hdf5 or .mat (the suffix picks the format).")
@click.option("--per-item", "per_item", default=None, type=click.Path(), metavar="DIR",
              help="Instead: one .npy per item in DIR, named by its id (escaped), its "
                   "sidecars beside it and DIR/index.csv (id, file, label, splits, shape).")
@click.option("--partial", is_flag=True,
              help="Export the computed items of an incomplete stage (default: refuse).")
def export(store_path, name, output, per_item, partial):
    """Write stage NAME to one file: ids, X (stacked, or ragged with offsets), sidecars
    (timestamps, positions...), labels, splits; or, with --per-item DIR, one .npy per item.

    A folder of OUTPUT that does not exist is created, and a note says so.  Layout:
    docs/data.md, "Import and export"; no pickle or object arrays.  Read it with
    ``featpipe.io.export.load_export`` (any format), ``np.load(path, allow_pickle=False)``,
    h5py or MATLAB's ``load``.  --per-item: a plain id is its file name (``/`` makes
    folders: ``Run/1.npy``), other characters are %xx and ids that differ only in case are
    written with upper-case letters as !x, so any id works on any disk (docs/data.md); DIR
    must be new, empty or an earlier export.
    """
    from pathlib import Path

    if (output is None) == (per_item is None):
        raise click.UsageError("give one of -o FILE and --per-item DIR")
    stage = open_store(store_path).resolve(name)
    if per_item is not None:
        from featpipe.io.per_item import INDEX, export_per_item

        done = export_per_item(stage, per_item, partial)
        click.echo(f"wrote {done.folder}: {done.n_items} items, one .npy each"
                   + (f", sidecars {', '.join(done.sidecars)}" if done.sidecars else "")
                   + f"; index {done.folder / INDEX}"
                   + (f"; {done.missing} items not computed" if done.missing else "")
                   + (f"; removed {done.removed} files of the earlier export"
                      if done.removed else ""))
        return
    from featpipe.io.export import export_stage

    folder = Path(output).absolute().parent
    new_folder = not folder.exists()
    arrays, missing = export_stage(stage, output, partial)
    if new_folder:  # a mistyped folder must not go unseen
        click.echo(f"note: created folder {folder} for {output}", err=True)
    n, shape = len(arrays["ids"]), arrays["X"].shape
    sidecars = sorted(k[len("sidecar_"):-len("_layout")] for k in arrays
                      if k.startswith("sidecar_") and k.endswith("_layout"))
    click.echo(f"wrote {output}: {n} items, layout {arrays['layout']}, X {shape} "
               f"{arrays['X'].dtype}" + (f", sidecars {', '.join(sidecars)}" if sidecars else "")
               + (f", {missing} items not computed" if missing else ""))
