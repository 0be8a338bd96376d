"""Help that fits the chosen method: ``featpipe extract --features idt --help`` and
``featpipe encode --method hrp --help`` show that method's options and the shared ones, each
with that method's help and default; plain ``--help`` shows the shared options and lists the
methods, one line each.

A command whose options depend on a method is a :class:`MethodCommand`: ``selectors`` names
its options that choose a method (``features`` and ``encode`` for ``extract``, ``method`` for
``encode``).  Each method option is a :class:`MethodOption` generated from the declarations
(:func:`featpipe.cli.options.make_option`; its spec's ``methods`` maps each method taking it
to that method's own help text and default).  The methods chosen are read from the command
line before click parses it (``--help`` is handled while parsing), and an option is listed
only when a chosen method takes it.  Every option is still accepted whatever the method (the
stage says which do not apply), so only the help changes.
"""

from __future__ import annotations

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
    """A command whose help lists only the options of the methods chosen on its command line
    (``selectors``: the names of the options that choose them); with none chosen, the epilog
    says how to see a method's options."""

    def __init__(self, *args, selectors: Sequence[str] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.selectors = tuple(selectors)

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
