"""``featpipe import``: per-item features made elsewhere (.npy or .mat folder, .npz, HDF5,
MATLAB .mat, aeon .ts).

The work is :func:`featpipe.stages.imports.import_features`.
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    finish,
    item_parallel_options,
    open_store,
    run_options,
    store_option,
)
from featpipe.cli.suggest import Choice


@click.command("import")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False),
              help="Manifest CSV of the items (optional when every --from is a .ts file).")
@click.option("--from", "sources", multiple=True, required=True, type=click.Path(),
              help="Folder of .npy or .mat files, or an .npz, .h5/.hdf5, .mat or .ts file "
                   "(repeatable).")
@store_option
@click.option("--name", required=True, help="Name for the imported stage (e.g. fc6).")
@click.option("--dtype", type=Choice(["float32", "float16"]), default="float32",
              show_default=True, help="Stored floating dtype.")
@click.option("--write-manifest", type=click.Path(dir_okay=False),
              help="Also write the manifest used (useful for .ts imports).")
@click.option("--transpose", is_flag=True,
              help="Swap the axes of every 2-D array: files with one frame per column "
                   "(D x T, e.g. VLFeat descriptors). Default: one frame per row (T x D), "
                   "as MATLAB shows the matrix and VideoDarwin reads it.")
@click.option("--mat-variable", default=None, metavar="NAME",
              help="Variable to read from per-item .mat files (default: their only numeric "
                   "variable).")
@click.option("--item-kind", type=Choice(["sequence", "descriptors", "vector"]), default=None,
              help="What an item is: a sequence in time order (T x D), a set of local "
                   "descriptors (with a frame_index sidecar), or one vector; the steps that "
                   "read the stage check it. Default: guessed from the shapes, not checked.")
@item_parallel_options
def import_command(manifest_path, sources, store_path, name, dtype, write_manifest, transpose,
                   mat_variable, item_kind, **kwargs):
    """Import per-item feature arrays into a stage; every array is checked (numeric,
    non-empty, finite, same feature shape as the others) before it is written.

    \b
    .mat files: v5 through scipy.io, v7.3 through h5py; a matrix is read as MATLAB shows it
    (rows = frames), whichever the version; --transpose for one frame per column.
    """
    from featpipe.stages.imports import import_features

    finish(import_features(open_store(store_path), sources, manifest_path, name=name, dtype=dtype,
                           write_manifest=write_manifest, transpose=transpose,
                           mat_variable=mat_variable, item_kind=item_kind,
                           options=run_options(kwargs),
                           reporter=ClickReporter()))
