"""``featpipe status``: progress of a stage from its ledgers (works while the stage runs)."""

from __future__ import annotations

import datetime as _dt

import click

from featpipe.cli.common import open_store, store_option
from featpipe.progress import stage_progress
from featpipe.stages.base import latest_stage


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return _dt.datetime.fromtimestamp(stamp, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.3g} items/s"


@click.command("status")
@store_option
@click.argument("name")
@click.option("--show-failed", default=20, show_default=True, type=click.IntRange(min=0),
              help="How many failed items to list with their reasons.")
@click.option("--show-ledgers", default=20, show_default=True, type=click.IntRange(min=0),
              help="How many per-process ledgers to list (the most recently active first).")
@click.option("--check", is_flag=True,
              help="Exit with status 1 unless every item of the stage is done.")
def status(store_path, name, show_failed, show_ledgers, check):
    """Show how far stage NAME is: done, failed and pending items, rate, per-process ledgers."""
    stage = latest_stage(open_store(store_path), name)
    progress = stage_progress(stage)
    click.echo(f"stage {stage.name} ({stage.kind})")
    share = 100.0 * progress.done / progress.total if progress.total else 100.0
    click.echo(f"items: {progress.total} total, {progress.done} done, "
               f"{len(progress.failed)} failed, {progress.pending} pending ({share:.1f}% done)")
    rate = progress.rate
    eta = ""
    if rate and progress.pending:
        eta = f", about {progress.pending / rate:.0f} s left at this rate"
    click.echo(f"rate: {_rate(rate)}{eta}")
    if progress.recomputed:
        click.echo(f"recomputed: {len(progress.recomputed)} item(s) have more than one done "
                   f"line (e.g. {progress.recomputed[0]!r}; --force or an interrupted write)")
    if progress.ledgers:
        click.echo(f"ledgers: {len(progress.ledgers)} (one per worker process)")
        recent = sorted(progress.ledgers, key=lambda p: p.last or 0.0, reverse=True)
        for ledger in recent[:show_ledgers]:
            click.echo(f"  {ledger.name}: {ledger.done} done, {ledger.failed} failed, "
                       f"{_rate(ledger.rate)}, {_when(ledger.first)} .. {_when(ledger.last)} UTC")
        if len(recent) > show_ledgers:
            click.echo(f"  ... and {len(recent) - show_ledgers} more")
    for item_id, reason in sorted(progress.failed.items())[:show_failed]:
        click.echo(f"failed: {item_id}: {reason}")
    if len(progress.failed) > show_failed:
        click.echo(f"failed: ... and {len(progress.failed) - show_failed} more")
    state = "complete" if progress.complete else "incomplete"
    click.echo(f"status: {state}: {progress.done} done, {len(progress.failed)} failed, "
               f"{progress.pending} pending")
    if check and not progress.complete:
        raise click.exceptions.Exit(1)
