"""The ``featpipe`` command-line interface: a click group whose commands load lazily.

Exit codes: 0 success; 1 failure (some items failed, or a stage could not run); 2 usage error.
A :class:`featpipe.errors.FeatpipeError` is printed as one ``error:`` line, without traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from featpipe import __version__
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.parameters import flag_of

#: command name -> "module:attribute"; one module per command keeps each command obvious.
COMMANDS = {
    "manifest": "featpipe.cli.manifest:manifest",
    "import": "featpipe.cli.import_:import_command",
    "extract": "featpipe.cli.extract:extract",
    "fit": "featpipe.cli.fit:fit",
    "encode": "featpipe.cli.encode:encode",
    "classify": "featpipe.cli.classify:classify",
    "export": "featpipe.cli.export:export",
    "cache": "featpipe.cli.cache:cache",
    "status": "featpipe.cli.status:status",
    "submit": "featpipe.cli.submit:submit",
    "demo": "featpipe.cli.demo:demo",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used (``--help`` stays fast)."""

    def __init__(self, *args, lazy_commands: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx, cmd_name):
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta["featpipe.command"] = command  # the innermost wins: flags of its options
        return name, command, rest


def flag_for(command: click.Command | None, param: str) -> str:
    """The flag of ``command``'s option for library parameter ``param`` (``n_components`` is
    ``--dim`` in ``fit pca``); by default the rule of :func:`featpipe.parameters.flag_of`."""
    for option in getattr(command, "params", ()):
        if isinstance(option, click.Option) and option.name == param:
            return max((o for o in option.opts if o.startswith("--")), key=len,
                       default=option.opts[0])
    return flag_of(param)


class FeatpipeGroup(LazyGroup):
    """The root group: a FeatpipeError is one ``error:`` line and exit status 1 (2 for a bad
    parameter value, a usage error)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ParameterError as err:
            flag = flag_for(ctx.meta.get("featpipe.command"), err.param)
            click.echo(f"error: {flag} {err.cause}", err=True)
            ctx.exit(2)
        except FeatpipeError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(1)


@click.group(cls=FeatpipeGroup, lazy_commands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="featpipe")
@click.option("-v", "--verbose", count=True, help="More messages (repeat for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors; no progress bars.")
@click.pass_context
def cli(ctx, verbose, quiet):
    """featpipe: extract per-frame features, encode videos and images, train kernel SVMs."""
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else
                                         logging.INFO if verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    ctx.obj["quiet"] = quiet


def main(argv=None):
    """Console-script entry point."""
    cli.main(args=argv, prog_name="featpipe")
