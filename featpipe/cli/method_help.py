"""Help that shows what was asked: ``featpipe extract --features idt --help`` and
``featpipe encode --method hrp --help`` lead with that method's options (each with that
method's help and default), then list the other options under their headings, flags only,
in at most about 60 lines; plain ``--help`` lists the methods (one entry each, wrapped to
the terminal) and every shared option with its help, grouped under the same headings (git's
``-h`` shows a command's own options; click-option-group and cloup group them so).

A command whose options depend on a method is a :class:`MethodCommand`: ``selectors`` names
its options that choose a method (``features`` and ``encode`` for ``extract``, ``method`` for
``encode``), ``methods`` lists the methods of the first one (name, summary; ``methods_note``
ends their heading) and ``groups`` the headings (heading, option names, ``help`` for the help
option; an option in none is under "Other options").  Each
method option is a :class:`MethodOption` generated from the declarations
(:func:`featpipe.cli.options.make_option`; its spec's ``methods`` maps each method taking it
to that method's own help text and default).  The methods chosen are read from the command
line before click parses it (``--help`` is handled while parsing), and an option is listed
only when a chosen method takes it.  Every option is still accepted whatever the method (the
stage says which do not apply), so only the help changes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import click

#: ``ctx.meta`` key: selector (parameter name) -> the method chosen on the command line
CHOSEN = "featpipe.chosen_methods"


class MethodOption(click.Option):
    """An option of some methods: ``selector`` is the option that chooses them and
    ``per_method`` maps each method to the help (with its default) it shows for it."""

    def __init__(self, *args, selector: str, per_method: Mapping[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.selector = selector
        self.per_method = dict(per_method)

    def get_help_record(self, ctx: click.Context):
        method = ctx.meta.get(CHOSEN, {}).get(self.selector)
        if method not in self.per_method:
            return None  # not an option of the method chosen (or none is)
        flags, _ = super().get_help_record(ctx)
        return flags, self.per_method[method]


def chosen_methods(command: click.Command, args: Sequence[str],
                   selectors: Sequence[str]) -> dict[str, str]:
    """The value given to each option named in ``selectors`` in ``args`` (``--features idt``,
    ``--features=idt``, ``-fidt``), the last one when repeated; ``--`` ends the options."""
    spellings = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name in selectors:
            spellings.update({flag: param.name for flag in param.opts})
    found: dict[str, str] = {}
    tokens = list(args)
    for i, token in enumerate(tokens):
        if token == "--":
            break
        if token in spellings and i + 1 < len(tokens):
            found[spellings[token]] = tokens[i + 1]
            continue
        for flag, name in spellings.items():
            if flag.startswith("--") and token.startswith(flag + "="):
                found[name] = token[len(flag) + 1:]
            elif not flag.startswith("--") and token.startswith(flag) and len(token) > 2:
                found[name] = token[len(flag):]
    return found


class MethodCommand(click.Command):
    """A command whose help leads with the options of the methods chosen on its command line
    (``selectors``: the names of the options that choose them), then its other options under
    the headings of ``groups``; ``methods`` (name, summary) are listed by plain ``--help``,
    and with none chosen the text says how to see a method's options."""

    def __init__(self, *args, selectors: Sequence[str] = (),
                 methods: Sequence[tuple[str, str]] = (),
                 groups: Sequence[tuple[str, Sequence[str]]] = (), methods_note: str = "",
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.methods_note = methods_note
        self.selectors = tuple(selectors)
        self.methods = [tuple(m) for m in methods]
        self.groups = [(heading, tuple(names)) for heading, names in groups]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[CHOSEN] = chosen_methods(self, args, self.selectors)
        return super().parse_args(ctx, args)

    def methods_of(self, selector: str) -> list[str]:
        """Every method of ``selector`` that has an option of its own, in the order of the
        selector's choices."""
        found: set[str] = set()
        for param in self.params:
            if isinstance(param, MethodOption) and param.selector == selector:
                found.update(param.per_method)
        option = next(p for p in self.params if p.name == selector)
        order = list(getattr(option.type, "choices", ()))
        return sorted(found, key=lambda m: (order.index(m) if m in order else len(order), m))

    def _flag(self, selector: str) -> str:
        option = next(p for p in self.params if p.name == selector)
        return max(option.opts, key=len)

    def chosen(self, ctx: click.Context) -> list[tuple[str, str]]:
        """(selector, method) of each method chosen on the command line that has options."""
        picked = ctx.meta.get(CHOSEN, {})
        return [(s, picked[s]) for s in self.selectors if picked.get(s) in self.methods_of(s)]

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The help text, then the methods (each wrapped to the width) or, with one chosen,
        its summary."""
        super().format_help_text(ctx, formatter)
        summaries = dict(self.methods)
        chosen = [(s, m) for s, m in self.chosen(ctx) if m in summaries]
        if chosen:
            selector, method = chosen[0]
            with formatter.indentation():
                formatter.write_paragraph()
                formatter.write_text(f"{self._flag(selector)} {method}: {summaries[method]}")
        elif self.methods:
            option = next(p for p in self.params if p.name == self.selectors[0])
            with formatter.indentation():
                formatter.write_paragraph()
                formatter.write_text(f"{_path(ctx)} {min(option.opts, key=len)} METHOD "
                                     f"--help: a method's options{self.methods_note}.")
            with formatter.section("Methods"):
                formatter.write_dl(self.methods, col_max=16)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The chosen methods' options in full; then each heading of ``groups`` with its
        options, in full when no method is chosen, else their flags only."""
        params = [p for p in self.get_params(ctx) if isinstance(p, click.Option)]
        records = {p.name: p.get_help_record(ctx) for p in params}
        chosen = self.chosen(ctx)
        for selector, method in chosen:
            own = [records[p.name] for p in params if isinstance(p, MethodOption)
                   and p.selector == selector and records[p.name] is not None]
            with formatter.section(f"Options of {self._flag(selector)} {method}"):
                formatter.write_dl(own)
        shown = [p for p in params if not isinstance(p, MethodOption)
                 and records[p.name] is not None]
        help_option = self.get_help_option(ctx)
        name_of = {p.name: "help" if p is help_option else p.name for p in shown}
        named = {name for _, names in self.groups for name in names}
        groups = [(heading, [p for p in shown if name_of[p.name] in names])
                  for heading, names in self.groups]
        groups.append(("Other options", [p for p in shown if name_of[p.name] not in named]))
        if chosen:
            formatter.write_paragraph()
        for heading, members in groups:
            if not members:
                continue
            if not chosen:
                with formatter.section(heading):
                    formatter.write_dl([records[p.name] for p in members])
                continue
            formatter.write(textwrap.fill("  ".join(_short_flag(p) for p in members),
                                          formatter.width, initial_indent=f"{heading}: ",
                                          subsequent_indent="  ", break_on_hyphens=False,
                                          break_long_words=False) + "\n")
        if chosen:
            formatter.write(f"(each described by {_path(ctx)} --help)\n")

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The epilog, on the plain help only (a method's help is that method's)."""
        if not self.chosen(ctx):
            super().format_epilog(ctx, formatter)


def _path(ctx: click.Context) -> str:
    """``featpipe extract``: the command as a user types it (whatever the root's name)."""
    return " ".join(["featpipe", *ctx.command_path.split()[1:]])


def _short_flag(option: click.Option) -> str:
    """``--jobs`` (an option's long flag), ``--positions/--no-positions`` for an on/off
    flag."""
    longest = max(option.opts, key=len)
    return f"{longest}/{option.secondary_opts[0]}" if option.secondary_opts else longest
