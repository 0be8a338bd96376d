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


#: what ``--small`` changes in a pipeline: the same steps with settings for featpipe's
#: rendered clips in about a minute (each text must be in the file; all its copies change)
SMALL = {"trajectories": (
    ("sample_descriptors = 100", "sample_descriptors = 200"),
    ("n_components = 256", "n_components = 4"),
    ("sample = 256000", "sample = 8000"),
    ("sample_total = 256000", "sample_total = 8000"),
    ("jobs = 8", "jobs = 2"),
    ('params = { weights = "vgg16-397923af.pth" }', 'params = { weights = "random:0" }'),
    ("sampling = { fps = 5 }", "sampling = { frames = 2 }"),
)}
SMALL_HEADER = """\
# The small variant (featpipe example pipeline trajectories --small): the recipe below with
# K = 4, 200 sampled trajectories per clip, seeded random VGG-16 weights and 2 frames a clip
# for the CNN stream, for featpipe's rendered clips (a minute on 2 cores):
#   featpipe example clips clips --per-class 4 --frames 20
#   featpipe manifest build clips -o ucf.csv --test-fraction 0.5 --seed 0
#   featpipe example pipeline trajectories --small > small.toml
#   featpipe run small.toml
"""


def example_pipeline(name: str = "walkthrough", small: bool = False) -> str:
    """The text of a shipped example pipeline file (docs/walkthrough.md); ``small``: its
    variant for rendered clips (:data:`SMALL`)."""
    text = resources.files("featpipe").joinpath(*PIPELINES[name]).read_text(encoding="utf-8")
    if not small:
        return text
    for old, new in SMALL[name]:
        if old not in text:
            raise RuntimeError(f"the {name} pipeline has no {old!r} for its small variant")
        text = text.replace(old, new)
    return SMALL_HEADER + text


@click.group(cls=LazyGroup)
def example():
    """Example inputs: a pipeline file, rendered video clips."""


@example.command("pipeline")
@click.argument("name", default="walkthrough", type=Choice(list(PIPELINES)))
@click.option("--small", is_flag=True, help="The recipe's variant for featpipe's rendered "
              "clips (trajectories only): the same steps, small settings, a minute to run.")
def pipeline(name, small):
    """Print a pipeline file: the walkthrough's (featpipe example pipeline > pipeline.toml) or
    the dense-trajectory recipe's (featpipe example pipeline trajectories [--small])."""
    if small and name not in SMALL:
        raise click.UsageError(f"--small: the {name} pipeline is small already")
    click.echo(example_pipeline(name, small), nl=False)


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
