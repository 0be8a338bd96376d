"""``featpipe results``: the classify results of a pipeline file or a store as one table.

    featpipe results [PIPELINE.toml] [--store S] [--sort COLUMN ...] [--reverse]
                     [-o TABLE.csv|TABLE.md ...] [--plot PARAM [--by PARAM2]]

The work is :mod:`featpipe.results`; this module parses and prints.
"""

from __future__ import annotations

import os

import click

from featpipe.cli.common import ClickReporter, open_store, warn


@click.command("results")
@click.argument("pipeline_path", metavar="[PIPELINE.toml]", required=False,
                type=click.Path(dir_okay=False))
@click.option("--store", "-s", "store_path", default=None, type=click.Path(file_okay=False),
              help="Store folder [default: the pipeline file's store, else $FEATPIPE_STORE]; "
                   "without PIPELINE.toml, every classify result in it.")
@click.option("--sort", "sort_columns", multiple=True, metavar="COLUMN",
              help="Sort by this column (repeatable: ties by the next): parameters "
                   "ascending, scores (mean, split1...) best first [default: by the "
                   "parameter columns].")
@click.option("--reverse", is_flag=True, help="Reverse the order of --sort.")
@click.option("-o", "--output", "outputs", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="Also write the table to FILE: .csv or .md (repeatable).")
@click.option("--plot", "plot_x", default=None, metavar="PARAM",
              help="Plot the mean metric against column PARAM: a PNG beside the first -o "
                   "file (TABLE.PARAM.png).")
@click.option("--by", "plot_by", default=None, metavar="PARAM2",
              help="With --plot: one line per value of column PARAM2.")
def results(pipeline_path, store_path, sort_columns, reverse, outputs, plot_x, plot_by):
    """One table of classify results: a column per parameter that differs along the results'
    chains (hrp.window, C...), the metric per split, mean ± std.

    With PIPELINE.toml: the results of its classify steps; with --store alone: every
    classify result in the store.  The table is printed as Markdown; -o writes it as CSV or
    Markdown.  Columns and order: docs/classify.md, "Tables of results".
    """
    from featpipe import results as tables
    from featpipe.errors import FeatpipeError
    from featpipe.fileio import check_output_path

    reporter = ClickReporter()
    if plot_by and not plot_x:
        raise click.UsageError("--by goes with --plot PARAM")
    if plot_x and not outputs:
        raise click.UsageError("--plot needs -o TABLE.csv (or .md): the PNG is written "
                               "beside it")
    pipeline = None
    if pipeline_path is not None:
        from featpipe.pipeline import PipelineError, load_pipeline

        try:
            pipeline = load_pipeline(pipeline_path)
        except PipelineError as err:
            raise click.UsageError(str(err)) from None
    store_path = store_path or (pipeline.store if pipeline else None) or \
        os.environ.get("FEATPIPE_STORE")
    if not store_path:
        raise click.UsageError("no store: give --store, set $FEATPIPE_STORE or give a "
                               "pipeline file whose [pipeline] names its store")
    store = open_store(store_path)
    for output in outputs:
        tables.check_output(output)
        check_output_path(output, "output", store.root)
    stages = (tables.pipeline_results(pipeline, store, reporter) if pipeline is not None
              else tables.store_results(store))
    found = tables.gather(stages, reporter)
    if not found:
        where = f"the classify steps of {pipeline_path}" if pipeline else f"store {store.root}"
        raise FeatpipeError(f"no classify results for {where} (featpipe classify, or a "
                            "classify step of featpipe run, makes them)")
    table = tables.make_table(found)
    if sort_columns or reverse:
        table = tables.sort_rows(table, sort_columns or table.parameters, reverse)
    if plot_x:
        tables.plot_series(table, plot_x, plot_by)  # a bad column before any file is written
    click.echo(tables.markdown(table), nl=False)
    for output in outputs:
        tables.write_table(table, output)
        warn(f"wrote {output}")
    if plot_x:
        path = tables.plot_path(outputs[0], plot_x)
        lines = tables.plot(table, plot_x, path, plot_by)
        warn(f"wrote {path} ({lines} line(s))")
