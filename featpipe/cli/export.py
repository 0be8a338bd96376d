"""``featpipe export``: a stage's items, ids, labels and splits as one ``.npz``."""

from __future__ import annotations

import click

from featpipe.cli.common import open_store, store_option
from featpipe.io.export import export_stage


@click.command("export")
@store_option
@click.argument("name")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The .npz file to write.")
@click.option("--partial", is_flag=True,
              help="Export the computed items of an incomplete stage (default: refuse).")
def export(store_path, name, output, partial):
    """Write stage NAME to an .npz: ids, X (stacked, or ragged with offsets), labels, splits.

    Layout: README section "Export"; no pickle or object arrays, load with
    ``np.load(path, allow_pickle=False)`` or ``featpipe.io.export.load_export``.
    """
    arrays, missing = export_stage(open_store(store_path).resolve(name), output, partial)
    n, shape = len(arrays["ids"]), arrays["X"].shape
    click.echo(f"wrote {output}: {n} items, layout {arrays['layout']}, X {shape} "
               f"{arrays['X'].dtype}" + (f", {missing} items not computed" if missing else ""))
