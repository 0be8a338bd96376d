"""Command-line values checked with a "did you mean" (:mod:`featpipe.suggest`): a choice
(``--method hrpp``: ``Did you mean 'hrp'?``), and through :class:`featpipe.cli.LazyGroup` a
command name (``featpipe encod``)."""

from __future__ import annotations

import click

from featpipe.suggest import did_you_mean


class Choice(click.Choice):
    """``click.Choice`` whose refusal ends with the closest choice: ``'hrpp' is not one of
    'arp', ... Did you mean 'hrp'?``."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as err:
            hint = did_you_mean(value, self.choices)
            if hint:
                err.message = f"{err.message} {hint[0].upper()}{hint[1:]}"
            raise
