"""Write ``docs/cli.md`` from the click commands: ``python -m featpipe.cli.docgen > docs/cli.md``.

Every command and subcommand of ``featpipe`` in a fixed order (the group's listing), each with
its usage line and help text as ``--help`` prints them (a ``text`` block: output, which
the documentation's runner shows and never runs) and a table of its options (flags,
metavar, help with default); a command whose options depend on a method
(:class:`~featpipe.cli.method_help.MethodCommand`) then has one table per method, of the
options that method adds.  The text is rendered at a fixed width, with no plugin encoders
(``$FEATPIPE_ENCODERS`` is ignored; an installed ``featpipe.encoders`` entry point
would add its methods), so the file depends on the code only;
``tests/cli/test_docs.py`` fails when the committed file differs from this output.
"""

from __future__ import annotations

import os
import sys

import click

from featpipe.cli.method_help import CHOSEN, MethodCommand, MethodOption

#: the width help text is wrapped at (click's default wraps at the terminal's width)
WIDTH = 100

HEADER = """# Command reference

Generated from the commands by `python -m featpipe.cli.docgen > docs/cli.md`; do not edit by
hand (`tests/cli/test_docs.py` fails when this file is stale). Exit codes, verbosity and the
options the item commands share: [command-line.md](command-line.md).
"""


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _section(command: click.Command, ctx: click.Context) -> list[str]:
    formatter = click.HelpFormatter(width=WIDTH, max_width=WIDTH)
    command.format_usage(ctx, formatter)
    command.format_help_text(ctx, formatter)
    if isinstance(command, click.Group):
        command.format_commands(ctx, formatter)
    lines = [f"## `{ctx.command_path}`", "", "```text", formatter.getvalue().rstrip(), "```", ""]
    lines += _table(command.get_params(ctx), ctx)
    if isinstance(command, MethodCommand):
        lines += _method_sections(command, ctx)
    return lines


def _table(params, ctx: click.Context) -> list[str]:
    """The options table of ``params`` as ``--help`` shows them in ``ctx``."""
    records = [r for r in (p.get_help_record(ctx) for p in params) if r is not None]
    if not records:
        return []
    return ["| option | description |", "|---|---|",
            *(f"| `{_cell(flags)}` | {_cell(help_text)} |" for flags, help_text in records), ""]


def _method_sections(command: MethodCommand, ctx: click.Context) -> list[str]:
    """One section per method of each selector: the options that method adds, as
    ``featpipe COMMAND --SELECTOR METHOD --help`` lists them."""
    lines = []
    for selector in command.selectors:
        option = next(p for p in command.params if p.name == selector)
        flag = max(option.opts, key=len)
        for method in command.methods_of(selector):
            ctx.meta[CHOSEN] = {selector: method}
            own = [p for p in command.params
                   if isinstance(p, MethodOption) and p.selector == selector]
            lines += [f"### `{ctx.command_path} {flag} {method}`", "", *_table(own, ctx)]
    ctx.meta.pop(CHOSEN, None)
    return lines


def _walk(command: click.Command, ctx: click.Context) -> list[str]:
    lines = _section(command, ctx)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            sub_ctx = click.Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH,
                                    max_content_width=WIDTH)
            lines += _walk(sub, sub_ctx)
    return lines


def render() -> str:
    """The text of ``docs/cli.md`` (run without plugin encoders, as ``__main__`` does)."""
    from featpipe.cli import cli

    ctx = click.Context(cli, info_name="featpipe", terminal_width=WIDTH,
                        max_content_width=WIDTH, **cli.context_settings)
    return "\n".join([HEADER, *_walk(cli, ctx)]).rstrip("\n") + "\n"


if __name__ == "__main__":
    os.environ.pop("FEATPIPE_ENCODERS", None)  # registry.PLUGIN_VARIABLE, before any import
    sys.stdout.write(render())
