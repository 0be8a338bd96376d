"""``featpipe export``: a stage's items, sidecars, ids, labels and splits as one ``.npz``,
HDF5 or MATLAB ``.mat`` file (the suffix of ``-o`` picks the format)."""

from __future__ import annotations

import click

from featpipe.cli.common import open_store, store_option


@click.command("export")
@store_option
@click.argument("name")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="File to write: .npz, .h5/.hdf5 or .mat (the suffix picks the format).")
@click.option("--partial", is_flag=True,
              help="Export the computed items of an incomplete stage (default: refuse).")
def export(store_path, name, output, partial):
    """Write stage NAME to one file: ids, X (stacked, or ragged with offsets), sidecars
    (timestamps, positions...), labels, splits.

    A folder of OUTPUT that does not exist is created, and a note says so.  Layout:
    docs/data.md, "Import and export"; no pickle or object arrays.  Read it with
    ``featpipe.io.export.load_export`` (any format), ``np.load(path, allow_pickle=False)``,
    h5py or MATLAB's ``load``.
    """
    from pathlib import Path

    from featpipe.io.export import export_stage

    folder = Path(output).absolute().parent
    new_folder = not folder.exists()
    arrays, missing = export_stage(open_store(store_path).resolve(name), output, partial)
    if new_folder:  # a mistyped folder must not go unseen
        click.echo(f"note: created folder {folder} for {output}", err=True)
    n, shape = len(arrays["ids"]), arrays["X"].shape
    sidecars = sorted(k[len("sidecar_"):-len("_layout")] for k in arrays
                      if k.startswith("sidecar_") and k.endswith("_layout"))
    click.echo(f"wrote {output}: {n} items, layout {arrays['layout']}, X {shape} "
               f"{arrays['X'].dtype}" + (f", sidecars {', '.join(sidecars)}" if sidecars else "")
               + (f", {missing} items not computed" if missing else ""))
