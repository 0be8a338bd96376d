"""``featpipe cache refs`` and ``cache rm``: what refers to a stage; remove a name."""

from __future__ import annotations

import json

import click

from featpipe.cli.common import ClickReporter, open_store, store_option


@click.command("refs")
@store_option
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def refs(store_path, name, as_json):
    """What refers to stage NAME (a name, a stage folder kind-key, or its key): the names
    pointing at it, unfinished runs computing it, the stages computed from it (with their
    names), and the names whose inputs chain reaches it (what `cache rm` and `cache gc`
    keep it for)."""
    from featpipe.stages import refs as references

    store = open_store(store_path)
    found = references.references(store, references.find_stage(store, name).name)
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=1))
        return
    click.echo(f"stage {found.stage} ({found.kind})")
    click.echo(f"names: {', '.join(found.names) or '-'}")
    click.echo(f"unfinished runs for: {', '.join(found.running) or '-'}")
    click.echo("input of: " + (", ".join(
        folder + (f" ({', '.join(names)})" if names else "")
        for folder, names in found.dependents.items()) or "-"))
    click.echo(f"needed by names: {', '.join(found.needed_by) or '-'}")
    if found.unreadable:
        click.echo(f"unreadable stages (may be computed from it): "
                   f"{', '.join(found.unreadable)}")


@click.command("rm")
@store_option
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
def rm(store_path, name, dry_run):
    """Remove name NAME, and its stage when nothing else refers to it.

    A stage that another name, an unfinished run or a stage computed from it still refers
    to is kept, and the references are listed (see `cache refs`). NAME may also be a stage
    folder (kind-key): that stage is removed when nothing refers to it. The marker of an
    unfinished run for NAME goes too, unless that run is computing now (an error).
    """
    from featpipe.stages import refs as references

    references.remove(open_store(store_path), name, dry_run, ClickReporter())
