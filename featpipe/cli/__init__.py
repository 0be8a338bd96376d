"""The ``featpipe`` command-line interface: a click group whose commands load lazily.

Exit codes: 0 success; 1 failure (some items failed, or a stage could not run); 2 usage error.
A :class:`featpipe.errors.FeatpipeError` is printed as one ``error:`` line, without traceback.

Verbosity, the same for every command (docs/command-line.md); ``-q``/``-v`` are accepted
before or after the command name (``featpipe -q encode`` = ``featpipe encode -q``; counts add
up: ``featpipe -v encode -v`` is ``-vv``):

- default: results on stdout (stage and name, summary line, scores); warnings and errors on
  stderr; a progress line on stderr when it is a terminal, else a plain progress line every
  30 s and a last one (a SLURM log).
- ``-q``: stderr carries errors only (``error:`` and ``failed:`` lines): no progress, no
  warnings, no log lines, no Python warnings.  stdout is unchanged: it is the command's
  result, which scripts read; ``> /dev/null`` silences it.
- ``-v``: also featpipe's log lines (what a stage reads, EM and SGD iterations with their
  objective, per-epoch losses) and, off a terminal, plain progress lines every 10 s.
- ``-vv``: also debug lines, and a progress line at every update off a terminal.
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import shlex
import sys
import warnings

import click

from featpipe import __version__
from featpipe.cli import logfile
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.flags import flag_of
from featpipe.settings import SettingError, check_environment
from featpipe.suggest import did_you_mean

#: command name -> "module:attribute"; one module per command keeps each command obvious.
COMMANDS = {
    "manifest": "featpipe.cli.manifest:manifest",
    "import": "featpipe.cli.import_:import_command",
    "extract": "featpipe.cli.extract:extract",
    "fit": "featpipe.cli.fit:fit",
    "encode": "featpipe.cli.encode:encode",
    "classify": "featpipe.cli.classify:classify",
    "export": "featpipe.cli.export:export",
    "results": "featpipe.cli.results:results",
    "cache": "featpipe.cli.cache:cache",
    "status": "featpipe.cli.status:status",
    "submit": "featpipe.cli.submit:submit",
    "run": "featpipe.cli.run:run",
    "demo": "featpipe.cli.demo:demo",
    "example": "featpipe.cli.example:example",
}


def short_helps(commands: dict[str, str]) -> dict[str, str]:
    """Each lazy command's short help, in full (click shortens it to the terminal)."""
    found = {}
    for name, target in commands.items():
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        found[name] = command.get_short_help_str(limit=10**6)
    return found


def table_source() -> dict[str, str]:
    """The short help of each command (``featpipe --help``; ``options.json``)."""
    return short_helps(COMMANDS)


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when used: its ``--help`` lists them with
    the short helps of the precomputed table (:func:`featpipe.cli.options.table_entry`
    ``table_key``), so that it imports none of them."""

    def __init__(self, *args, lazy_commands: dict[str, str] | None = None,
                 table_key: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})
        self.table_key = table_key

    def format_commands(self, ctx, formatter):
        if self.table_key is None:
            return super().format_commands(ctx, formatter)
        from featpipe.cli.options import table_entry

        helps = table_entry(self.table_key)
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, click.Command(name, help=helps[name]).get_short_help_str(limit))
                for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx, cmd_name):
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
        else:
            command = super().get_command(ctx, cmd_name)
        return with_verbosity_options(command)

    def resolve_command(self, ctx, args):
        try:
            name, command, rest = super().resolve_command(ctx, args)
        except click.UsageError as err:  # "No such command 'encod'."
            word = click.utils.make_str(args[0]) if args else ""
            hint = did_you_mean(word, self.list_commands(ctx))
            if hint and not getattr(err, "possibilities", None):  # click >= 8.4 suggests
                # the commands registered eagerly; the lazy ones are not among them
                err.message = f"{err.message} {hint[0].upper()}{hint[1:]}"
            raise
        ctx.meta["featpipe.command"] = command  # the innermost wins: flags of its options
        return name, command, rest


def flag_for(command: click.Command | None, param: str) -> str:
    """The flag of ``command``'s option for library parameter ``param``, with its short
    aliases (``--n-components (--dim)`` in ``fit pca``); by default the rule of
    :func:`featpipe.flags.flag_of`."""
    for option in getattr(command, "params", ()):
        if isinstance(option, click.Option) and option.name == param:
            flags = [o for o in option.opts if o.startswith("--")] or option.opts[:1]
            return flags[0] + (f" ({', '.join(flags[1:])})" if flags[1:] else "")
    return flag_of(param)


class FeatpipeGroup(LazyGroup):
    """The root group: a FeatpipeError is one ``error:`` line and exit status 1 (2 for a bad
    parameter value or environment setting, a usage error); SIGINT and SIGTERM stop every
    command the same way (:mod:`featpipe.interrupts`): one ``interrupted:`` line and exit
    status 128 + the signal number."""

    def invoke(self, ctx):
        code = 1
        try:
            result = self._invoke(ctx)
            code = 0
            return result
        except click.exceptions.Exit as stop:
            code = stop.exit_code
            raise
        except click.ClickException as err:
            code = err.exit_code
            logfile.record(f"error: {err.format_message()}", logging.ERROR)
            raise
        except BaseException:
            logfile.record_crash()
            raise
        finally:
            logfile.close_log(code)

    def _invoke(self, ctx):
        from featpipe.interrupts import Interrupt, Interrupted, interruptible

        try:
            with interruptible():
                return super().invoke(ctx)
        except Interrupted as err:  # a stage said how many items are done and left
            _error(str(err))
            ctx.exit(err.exit_code)
        except Interrupt as signal_:  # any other command: what it wrote is whole
            _error(f"interrupted ({signal_}): nothing half-written is kept; re-run the same "
                   "command")
            ctx.exit(128 + signal_.signum)
        except ParameterError as err:
            flag = flag_for(ctx.meta.get("featpipe.command"), err.param)
            _error(f"error: {flag} {err.cause}")
            ctx.exit(2)
        except SettingError as err:
            _error(f"error: {err}")
            ctx.exit(2)
        except FeatpipeError as err:
            _error(f"error: {err}")
            ctx.exit(1)


def _error(text: str) -> None:
    click.echo(text, err=True)
    logfile.record(text, logging.ERROR)


def _set_verbosity(ctx, param, value) -> None:
    """Callback of a subcommand's ``-v``/``-q``: add to the root's count, reconfigure logging."""
    if not value:
        return
    obj = ctx.find_root().ensure_object(dict)
    if param.name == "quiet":
        obj["quiet"] = True
    else:
        obj["verbose"] = int(obj.get("verbose") or 0) + value
    apply_verbosity(obj)


def _set_log_file(ctx, param, value) -> None:
    """Callback of ``--log-file``: start the record of this run (module :mod:`logfile`)."""
    if value:
        try:
            logfile.open_log(value, shlex.join(["featpipe", *sys.argv[1:]]))
        except FeatpipeError as err:  # a usage error, found while parsing
            raise click.BadParameter(str(err).removeprefix("--log-file "), ctx, param) \
                from None
        apply_verbosity(ctx.find_root().ensure_object(dict))


LOG_FILE_HELP = ("Append the full record of the run (every log level, the reported lines, "
                 "progress, the exit status) to PATH.")

VERBOSITY_OPTIONS = (
    ("verbose", lambda: click.Option(
        ["-v", "--verbose"], count=True, expose_value=False, callback=_set_verbosity,
        is_eager=True, help="Same as featpipe -v (may also come before the command).")),
    ("quiet", lambda: click.Option(
        ["-q", "--quiet"], is_flag=True, expose_value=False, callback=_set_verbosity,
        is_eager=True, help="Same as featpipe -q (may also come before the command).")),
    ("log_file", lambda: click.Option(
        ["--log-file"], type=click.Path(dir_okay=False), metavar="PATH", expose_value=False,
        callback=_set_log_file, is_eager=True, help=LOG_FILE_HELP)),
)


def with_verbosity_options(command: click.Command | None) -> click.Command | None:
    """``command`` with ``-v``/``-q``/``--log-file`` (once): they work after its name too,
    read before the command's other options (eager), so what those options' checks say while
    they are read (``--jobs N is more than the cores``) is silenced or recorded as with the
    flags before the name."""
    if command is not None:
        present = {p.name for p in command.params}
        command.params.extend(make() for name, make in VERBOSITY_OPTIONS if name not in present)
    return command


def apply_verbosity(obj: dict) -> None:
    """Configure logging for ``obj``'s ``verbose`` count and ``quiet`` flag."""
    verbose, quiet = int(obj.get("verbose") or 0), bool(obj.get("quiet"))
    if quiet and verbose:
        raise click.UsageError("-q and -v exclude each other")
    configure_logging(-1 if quiet else min(verbose, 2))


@click.group(cls=FeatpipeGroup, lazy_commands=COMMANDS, table_key="commands",
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="featpipe")
@click.option("-v", "--verbose", count=True,
              help="-v: log lines (iterations, objectives) and progress lines in log files; "
                   "-vv: debug.")
@click.option("-q", "--quiet", is_flag=True,
              help="stderr shows errors only (no progress, warnings or log lines); stdout "
                   "keeps the results.")
@click.option("--log-file", type=click.Path(dir_okay=False), metavar="PATH",
              envvar="FEATPIPE_LOG_FILE", expose_value=False, callback=_set_log_file,
              help=LOG_FILE_HELP + " Or $FEATPIPE_LOG_FILE.")
@click.pass_context
def cli(ctx, verbose, quiet):
    """featpipe: extract per-frame features, encode videos and images, train kernel SVMs."""
    check_environment()  # FEATPIPE_THREADS, FEATPIPE_MEMORY...: exit 2 before any stage
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    ctx.obj["quiet"] = quiet
    apply_verbosity(ctx.obj)


class _StatusAwareHandler(logging.Handler):
    """Log records on stderr, printed above an active progress line."""

    def emit(self, record):
        from featpipe.cli.display import print_above

        if record.name.startswith(logfile.OUTPUT):  # for the log file only
            return
        try:
            print_above(self.format(record))
        except Exception:  # logging must never break a run
            self.handleError(record)


def configure_logging(level: int) -> None:
    """featpipe's loggers on stderr at ERROR (-q, level -1), WARNING (0), INFO (1) or DEBUG
    (2), and at every level into a ``--log-file``; other libraries' loggers at WARNING
    (ERROR with -q); with -q Python warnings are ignored."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StatusAwareHandler)]:
        root.removeHandler(handler)
    handler = _StatusAwareHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           "%H:%M:%S"))
    featpipe_level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO,
                      2: logging.DEBUG}[level]
    handler.setLevel(featpipe_level)
    root.addHandler(handler)
    root.setLevel(logging.ERROR if level < 0 else logging.WARNING)
    logging.getLogger("featpipe").setLevel(logging.DEBUG if logfile.active() else featpipe_level)
    if level < 0:
        warnings.simplefilter("ignore")


class _ReaderMayLeave(io.RawIOBase):
    """File descriptor ``fd`` as a raw stream that drops what it is given once its reader has
    closed the pipe (EPIPE): :func:`main`'s rule for a closed stdout."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self.reader_left = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data) -> int:
        if not self.reader_left:
            try:
                return os.write(self._fd, data)
            except BrokenPipeError:
                self.reader_left = True
        return len(data)


def drop_output_once_stdout_closes() -> None:
    """One rule for a closed stdout (``featpipe classify ... | head -1``): the lines that
    would go there are dropped, the command does all its work and exits with its usual
    status, and nothing is said on stderr (docs/command-line.md)."""
    out = sys.stdout
    try:
        fd = out.fileno()
        out.flush()
    except (AttributeError, OSError, ValueError):  # no real stdout: nothing to guard
        return
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_ReaderMayLeave(fd)),
                                  encoding=out.encoding, errors=out.errors,
                                  line_buffering=out.line_buffering)


def main(argv=None):
    """Console-script entry point."""
    drop_output_once_stdout_closes()
    cli.main(args=argv, prog_name="featpipe")
