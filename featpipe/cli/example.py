"""``featpipe example pipeline|clips``: the files the walkthrough and the quickstart start from,
shipped inside the package so that they work from an installed wheel as from a checkout."""

from __future__ import annotations

from importlib import resources

import click

from featpipe.cli import LazyGroup
from featpipe.cli.suggest import Choice

#: the example pipeline files by name, package data (pyproject's ``package-data``): the
#: walkthrough's, and the dense-trajectory recipe of issue 32 (docs/walkthrough.md)
PIPELINES = {"walkthrough": ("templates", "pipeline.toml"),
             "trajectories": ("templates", "trajectories.toml")}


def example_pipeline(name: str = "walkthrough") -> str:
    """The text of a shipped example pipeline file (docs/walkthrough.md)."""
    return resources.files("featpipe").joinpath(*PIPELINES[name]).read_text(encoding="utf-8")


@click.group(cls=LazyGroup)
def example():
    """Example inputs: a pipeline file, rendered video clips."""


@example.command("pipeline")
@click.argument("name", default="walkthrough", type=Choice(list(PIPELINES)))
def pipeline(name):
    """Print a pipeline file: the walkthrough's (featpipe example pipeline > pipeline.toml) or
    the dense-trajectory recipe's (featpipe example pipeline trajectories)."""
    click.echo(example_pipeline(name), nl=False)


@example.command("clips")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--per-class", default=10, show_default=True, type=click.IntRange(min=1),
              help="Clips per class (left, right, towards, away).")
@click.option("--frames", default=24, show_default=True, type=click.IntRange(min=2),
              help="Frames per clip.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the rendering.")
def clips(folder, per_class, frames, seed):
    """Render mp4 clips into FOLDER/<class>/: an object moving left, right, towards or away
    over crops of scikit-learn's sample photographs (rendered motion; left/right and
    towards/away share their frames in reverse order)."""
    from featpipe.demo.motion import render_dataset

    rendered = render_dataset(folder, per_class=per_class, frames=frames, seed=seed,
                              write_manifest=False)
    click.echo(f"{len(rendered)} clips of {frames} frames in {folder}/ "
               f"({', '.join(rendered.classes)})")
