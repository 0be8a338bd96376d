"""``featpipe cache ls|show|verify|gc|pack``: inspect, verify and clean a store."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import sys

import click

from featpipe.cli import LazyGroup
from featpipe.cli.common import ClickReporter, open_store, store_option

CACHE_COMMANDS = {"pack": "featpipe.cli.cache_pack:pack",
                  "refs": "featpipe.cli.cache_refs:refs", "rm": "featpipe.cli.cache_refs:rm"}
PARAMS_WIDTH = 60


@click.group(cls=LazyGroup, lazy_commands=CACHE_COMMANDS)
def cache():
    """Inspect (ls, show, refs), check (verify) and clean (gc, rm, pack) a store."""


def _compact_bytes(n: int) -> str:
    from featpipe.fileio import human_bytes

    return human_bytes(n).replace(" bytes", "B").replace(" ", "")


def _created(text: str | None) -> str:
    """``2025-01-31T10:04:00+00:00`` -> ``2025-01-31T10:04Z``."""
    try:
        return _dt.datetime.fromisoformat(text).astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def _params(params: dict, width: int | None = PARAMS_WIDTH) -> str:
    text = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}"
                    for k, v in sorted(params.items())) or "-"
    return text if width is None else _shorten(text, width)


def _counts(row: dict) -> tuple[str, str, str]:
    if row["items"] is None:  # a fit stage: its models, not 0/0/0 items
        return ("model" if row["models"] else "no-model"), "-", "-"
    items = row["items"]
    return str(items["done"]), str(items["failed"]), str(items["total"])


#: Columns ``cache ls`` drops, first to last, while the table is wider than the terminal.
DROP_ORDER = ("INPUTS", "CREATED", "SIZE", "FAILED", "TOTAL", "KIND")
#: PARAMS is shortened to no fewer characters than this before it is dropped.
MIN_PARAMS = 20


def _output_width() -> int | None:
    """Columns to fit: the terminal's when stdout is one, else ``$COLUMNS`` when set, else
    no limit (a pipe or a file gets every column)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def _lines(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in table]


def fit_table(table: list[tuple[str, ...]], width: int | None) -> tuple[list[str], list[str]]:
    """The lines of ``table`` (header first) within ``width`` characters: PARAMS shortened
    (down to :data:`MIN_PARAMS`), then dropped, then the columns of :data:`DROP_ORDER`;
    returns (lines, dropped column names)."""
    header = list(table[0])
    dropped: list[str] = []

    def too_wide(rows) -> bool:
        return width is not None and max(map(len, _lines(rows))) > width

    while too_wide(table):
        if "PARAMS" in header:
            at = header.index("PARAMS")
            excess = max(map(len, _lines(table))) - width
            longest = max(len(row[at]) for row in table[1:])
            if longest - excess >= MIN_PARAMS:
                table = [table[0]] + [row[:at] + (_shorten(row[at], longest - excess),)
                                      for row in table[1:]]
                continue
        drop = next((c for c in ("PARAMS", *DROP_ORDER) if c in header), None)
        if drop is None:
            break
        at = header.index(drop)
        table = [row[:at] + row[at + 1:] for row in table]
        header.pop(at)
        dropped.append(drop)
    return _lines(table), dropped


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


@cache.command("ls")
@store_option
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON list (every field in full) instead of the table.")
@click.option("--wide", is_flag=True,
              help="Every column and the parameters in full, however wide the terminal.")
def ls(store_path, as_json, wide):
    """One line per stage: names, stage folder (kind-key), done/failed/total items (``model``
    for a fitted model stage), size on disk, creation time (UTC), inputs and parameters.

    On a terminal (or with $COLUMNS) the table fits its width: the parameters are shortened,
    then columns dropped (inputs, creation time, size...), which a note on stderr names;
    `--wide` shows everything.  A stage that cannot be read is a ``problem:`` line (stderr,
    exit status 1); the others are listed.
    """
    from featpipe.stages import cache as upkeep

    store = open_store(store_path)
    rows, problems = upkeep.list_stages(store)
    passes = upkeep.fused_passes(rows)
    if as_json:
        click.echo(json.dumps({"store": str(store.root), "stages": rows, "passes": passes,
                               "problems": problems}, indent=1, default=str))
    elif not rows:
        click.echo(f"store {store.root}: no stages")
    else:
        table = [("NAMES", "STAGE", "KIND", "DONE", "FAILED", "TOTAL", "SIZE", "CREATED",
                  "INPUTS", "PARAMS")]
        for row in rows:
            if "in_pass" in row:  # listed with its pass, below
                continue
            names = row["names"] + [f"{n}(unfinished)" for n in row["unfinished_runs"]]
            table.append((",".join(names) or "-", row["stage"], row["kind"],
                          *_counts(row), _compact_bytes(row["size_bytes"]),
                          _created(row["created"]), ",".join(row["inputs"]) or "-",
                          _params(row["params"], None if wide else PARAMS_WIDTH)))
        lines, dropped = fit_table(table, None if wide else _output_width())
        for line in lines:
            click.echo(line)
        if dropped:
            click.echo(f"note: {', '.join(dropped)} left out to fit {_output_width()} "
                       "columns; --wide shows every column", err=True)
        _echo_passes(passes, {row["stage"]: row for row in rows})
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems:
        raise click.exceptions.Exit(1)


def _echo_passes(passes: list[dict], rows: dict[str, dict]) -> None:
    """One entry per fused pass: the stages it wrote, and the steps that ran inside it
    without being written (their stage records only)."""
    def label(folder: str) -> str:
        row = rows[folder]
        what = row["params"].get("method") if isinstance(row["params"], dict) else None
        names = ",".join(row["names"])
        return f"{folder} ({names or what or row['kind']})"

    for entry in passes:
        click.echo(f"pass {entry['stage']}: wrote "
                   + (", ".join(label(f) for f in entry["written"]) or "nothing yet")
                   + "; ran inside it without being written: "
                   + ", ".join(label(f) for f in entry["inside"]))


def _echo_chain(nodes: list[dict], depth: int = 1) -> None:
    for node in nodes:
        names = f" ({','.join(node['names'])})" if node["names"] else ""
        detail = node.get("problem") or _params(node["params"])
        click.echo(f"{'  ' * depth}{node['stage']}{names}: {detail}")
        _echo_chain(node.get("inputs", []), depth + 1)


def _when(stamp: float | None) -> str:
    from featpipe.progress import format_time

    return "-" if stamp is None else f"{format_time(stamp)} UTC"


@cache.command("show")
@store_option
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(store_path, name, as_json):
    """Everything about stage NAME: parameters, the chain of inputs it was computed from,
    size, versions, and its items (counts, an example shape, timings) or, for a fit stage,
    its models (each array's shape and dtype, and the model's metadata)."""
    from featpipe.fileio import human_bytes
    from featpipe.progress import format_duration
    from featpipe.stages import cache as upkeep

    info = upkeep.show(open_store(store_path), name)
    if as_json:
        click.echo(json.dumps(info, indent=1, default=str))
        return
    names = f" as {','.join(info['names'])}" if info["names"] else ""
    runs = "".join(f"; unfinished run for {n}" for n in info["unfinished_runs"])
    click.echo(f"stage {info['stage']}{names} ({info['kind']}){runs}")
    click.echo(f"created: {_created(info['created'])} on {info['host'] or '-'}; "
               f"{info['files']} file(s), {human_bytes(info['size_bytes'])}")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(info["versions"].items()))
    click.echo(f"versions: {versions or '-'}")
    click.echo("params:" + ("" if info["params"] else " -"))
    for key, value in sorted(info["params"].items()):
        click.echo(f"  {key}: {json.dumps(value)}")
    click.echo("inputs:" + ("" if info["input_chain"] else " - (made from files)"))
    _echo_chain(info["input_chain"])
    if info["items"] is None:
        click.echo(f"models: {len(info['models']) or 'none (not fitted yet)'}")
        for model, detail in info["models"].items():
            click.echo(f"  {model} (written {_when(detail['written'])}):")
            for key, array in detail["arrays"].items():
                click.echo(f"    {key}: {tuple(array['shape'])} {array['dtype']}")
            for key, value in sorted(detail["meta"].items()):
                text = json.dumps(value, default=str)
                click.echo(f"    meta {key}: {text if len(text) <= 100 else text[:97] + '...'}")
        return
    items = info["items"]
    click.echo(f"items: {items['total']} total, {items['done']} done, {items['failed']} "
               f"failed, {items['pending']} pending" + (" (packed)" if info["packed"] else ""))
    example = info.get("item_example")
    if example:
        extras = f", sidecars {', '.join(example['extras'])}" if example["extras"] else ""
        click.echo(f"item {example['id']!r}: {tuple(example['shape'])} {example['dtype']}"
                   f"{extras}")
    timings = info["timings"]
    if timings["first_line"] is not None:
        rate = timings["items_per_second"]
        click.echo(f"timings: {format_duration(timings['compute_seconds'])} of compute in "
                   f"{timings['processes']} process(es), {_when(timings['first_line'])} .. "
                   f"{_when(timings['last_line'])}"
                   + (f", {rate:.3g} items/s" if rate else ""))


@cache.command("verify")
@store_option
@click.argument("names", nargs=-1)
@click.option("--repair", is_flag=True,
              help="Remove what is damaged (items, models, packed items, ledger lines, item "
                   "lists, stages whose stage.json is damaged with their names, name files; "
                   "the content-hash cache is hashed again), so that a re-run of each "
                   "stage's command recomputes exactly that.")
@click.option("--rehash", is_flag=True,
              help="Hash every file the content-hash cache vouches for again and compare "
                   "(without it, a random sample of 64).")
def verify(store_path, names, repair, rehash):
    """Check every file of the store (all stages, or the NAMES given and the stages the
    views among them read) against the checksum taken when it was written: stage records,
    item lists, ledger lines, items, models, packed files, names, the content-hash cache
    (and a sample of its files hashed again); then the values: readable, numeric, finite,
    same feature shape as the stage's other items. Exits 1 naming each problem and what
    recovers it (with --repair, only when something could not be repaired); a stage that
    cannot be read is a problem too, and the others are still verified."""
    from featpipe.stages import cache as upkeep

    if upkeep.verify(open_store(store_path), names, ClickReporter(), repair=repair,
                     rehash=rehash):
        raise click.exceptions.Exit(1)


@cache.command("gc")
@store_option
@click.option("--dry-run", is_flag=True, help="List what would be removed, remove nothing.")
@click.option("--min-age", default=10.0, show_default=True, type=float, metavar="MINUTES",
              help="Keep unnamed stages written to in the last MINUTES (may be in use).")
def gc(store_path, dry_run, min_age):
    """Remove unnamed stages that no named stage needs, and stale temporary files.

    A stage is needed when a name, or the marker of an unfinished named run (also one whose
    process was killed), points to it or to a stage computed from it; a stage a live process
    is computing is kept too. A temporary
    file (``*.tmp.<host>.<pid>``) is stale when its process is gone (same host) or it is older
    than a day. While a name or a needed stage cannot be read, no stage is removed and the
    exit status is 1.
    """
    from featpipe.stages import cache as upkeep

    if upkeep.gc(open_store(store_path), dry_run, min_age, ClickReporter()).problems:
        raise click.exceptions.Exit(1)
