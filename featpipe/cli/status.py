"""``featpipe status``: progress of a stage from its ledgers (works while the stage runs), or
of the whole store (every named stage and every stage a run computes) without a name."""

from __future__ import annotations

import json
import time

import click

from featpipe.cli.common import open_store, store_option


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.3g} items/s"


def _number(value: float) -> str:
    """``400``, ``12,345``, ``0.25`` (work units)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _model_status(stage, as_json: bool, check: bool) -> None:
    """A fit stage has no items: its state is whether its models are written."""
    from featpipe.progress import format_time
    from featpipe.stages.cache import describe_stage

    info = describe_stage(stage, sizes=False, models=True)
    fitted = bool(info["models"])
    if as_json:
        click.echo(json.dumps({"stage": stage.name, "kind": stage.kind, "complete": fitted,
                               "models": info["models"]}, indent=1, default=str))
    else:
        click.echo(f"stage {stage.name} ({stage.kind}): a fitted-model stage, no items")
        for model, detail in info["models"].items():
            arrays = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in detail["arrays"].items())
            click.echo(f"model {model}: written {format_time(detail['written'])} UTC; {arrays}")
        click.echo(f"status: {'complete: model fitted' if fitted else 'incomplete: no model'}")
    if check and not fitted:
        raise click.exceptions.Exit(1)


#: The columns of the whole store's table (the counts are right-aligned).
STORE_COLUMNS = ("NAMES", "STATE", "DONE", "FAILED", "PENDING", "TOTAL", "TIME LEFT", "STAGE")


def _store_row(entry, now: float) -> tuple[str, ...]:
    """One stage of the whole store's table: its names (``NAME(unfinished)`` for a run that
    has not completed, as ``cache ls`` writes it), state, counts, time left and folder."""
    from featpipe.progress import format_duration

    names = ",".join(entry.names + [f"{n}(unfinished)" for n in entry.runs
                                    if n not in entry.names]) or "-"
    progress = entry.progress
    if progress is None:  # a fitted-model stage
        return (names, entry.state, "model" if entry.models else "-", "-", "-", "-", "-",
                entry.stage.name)
    eta = progress.eta_seconds(now)
    return (names, entry.state, str(progress.done), str(len(progress.failed)),
            str(progress.pending), str(progress.total),
            "-" if eta is None else format_duration(eta), entry.stage.name)


def _store_status(store, as_json: bool, check: bool) -> None:
    """Every named stage and every stage a run computes: state, counts, time left
    (:func:`featpipe.progress.store_status`)."""
    from featpipe.progress import STATES, store_status
    from featpipe.stages.base import running_names

    problems: list[str] = []
    entries = store_status(store, running_names(store, problems), problems)
    now = time.time()
    counts = {state: sum(e.state == state for e in entries) for state in STATES}
    if as_json:
        click.echo(json.dumps({"store": str(store.root), "counts": counts,
                               "stages": [e.to_dict(now) for e in entries],
                               "problems": problems}, indent=1))
    else:
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        click.echo(f"store {store.root}: {len(entries)} stage(s)"
                   + (f" ({summary})" if summary else " named or being computed"))
        rows = [STORE_COLUMNS, *(_store_row(e, now) for e in entries)] if entries else []
        widths = [max((len(row[k]) for row in rows), default=0)
                  for k in range(len(STORE_COLUMNS))]
        for row in rows:
            click.echo("  ".join(cell.rjust(w) if 2 <= k <= 5 else cell.ljust(w)
                                 for k, (cell, w) in enumerate(zip(row, widths, strict=True))
                                 ).rstrip())
        if counts["failed"] or counts["incomplete"]:
            click.echo("`featpipe status NAME` lists a stage's failed items and ledgers; a "
                       "re-run of its command computes what is pending")
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems or (check and any(e.state != "done" for e in entries)):
        raise click.exceptions.Exit(1)


@click.command("status")
@store_option
@click.argument("name", required=False)
@click.option("--show-failed", default=20, show_default=True, type=click.IntRange(min=0),
              help="How many failed items to list with their reasons.")
@click.option("--show-ledgers", default=20, show_default=True, type=click.IntRange(min=0),
              help="How many per-process ledgers to list (the most recently active first).")
@click.option("--check", is_flag=True,
              help="Exit with status 1 unless every item of the stage is done (without NAME: "
                   "unless every stage listed is done).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (counts, rate, time left, ledgers, failed items; "
                   "without NAME: each stage's state, counts and time left).")
def status(store_path, name, show_failed, show_ledgers, check, as_json):
    """Show how far stage NAME (or the whole store) is: done, failed and pending items, rate.

    A time left is shown only while a process is computing the stage (a ledger of this host
    whose process is alive, or one of another host written to in the last 10 minutes): the
    work left (rows) at the rate the run did its work, from the work it recorded when it
    started; by items for a run that recorded none.  Without NAME: every named stage and
    every stage a run is computing, each with its state (running, failed, incomplete, done),
    item counts and time left.
    """
    from featpipe.progress import format_duration, format_time, stage_progress
    from featpipe.stages.base import latest_stage

    store = open_store(store_path)
    if name is None:
        _store_status(store, as_json, check)
        return
    stage = latest_stage(store, name)
    if stage.is_model_stage:
        _model_status(stage, as_json, check)
        return
    progress = stage_progress(stage)
    if as_json:
        click.echo(json.dumps({"stage": stage.name, "kind": stage.kind,
                               **progress.to_dict(), "problems": stage.ledger_problems()},
                              indent=1))
        if check and not progress.complete:
            raise click.exceptions.Exit(1)
        return
    click.echo(f"stage {stage.name} ({stage.kind})")
    share = 100.0 * progress.done / progress.total if progress.total else 100.0
    click.echo(f"items: {progress.total} total, {progress.done} done, "
               f"{len(progress.failed)} failed, {progress.pending} pending ({share:.1f}% done)")
    processes = progress.processes
    running = progress.running()
    if processes:
        click.echo(f"running: computed now by {', '.join(processes)} (host-pid)")
    eta = progress.eta_seconds()
    work = progress.work
    if eta is not None and work is not None:
        click.echo(f"rate: {_rate(progress.rate)}; about {format_duration(eta)} left "
                   f"({_number(work.left)} {work.unit} left at {_number(work.rate)} "
                   f"{work.unit}/s since the run started)")
    elif eta is not None:
        click.echo(f"rate: {_rate(progress.rate)}, about {format_duration(eta)} left at this "
                   "rate")
    elif progress.rate is not None and not running:
        click.echo(f"rate: {_rate(progress.rate)} while it ran")
    else:
        click.echo(f"rate: {_rate(progress.rate)}")
    if progress.pending and progress.ledgers and not running:
        click.echo(f"running: no process is computing this stage now (last ledger line "
                   f"{format_time(max(p.last or 0.0 for p in progress.ledgers))} UTC); re-run its "
                   f"command to compute the {progress.pending} pending item(s)")
    if progress.recomputed:
        click.echo(f"recomputed: {len(progress.recomputed)} item(s) have more than one done "
                   f"line (e.g. {progress.recomputed[0]!r}; --force or an interrupted write)")
    if progress.ledgers:
        click.echo(f"ledgers: {len(progress.ledgers)} (one per worker process)")
        recent = sorted(progress.ledgers, key=lambda p: p.last or 0.0, reverse=True)
        for ledger in recent[:show_ledgers]:
            click.echo(f"  {ledger.name}: {ledger.done} done, {ledger.failed} failed, "
                       f"{_rate(ledger.rate)}, {format_time(ledger.first)} .. "
                       f"{format_time(ledger.last)} UTC")
        if len(recent) > show_ledgers:
            click.echo(f"  ... and {len(recent) - show_ledgers} more")
    for item_id, reason in sorted(progress.failed.items())[:show_failed]:
        click.echo(f"failed: {item_id}: {reason}")
    if len(progress.failed) > show_failed:
        click.echo(f"failed: ... and {len(progress.failed) - show_failed} more")
    for problem in stage.ledger_problems():
        click.echo(f"problem: {problem}")
    state = "complete" if progress.complete else "incomplete"
    click.echo(f"status: {state}: {progress.done} done, {len(progress.failed)} failed, "
               f"{progress.pending} pending")
    if check and not progress.complete:
        raise click.exceptions.Exit(1)
