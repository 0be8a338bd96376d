"""``featpipe encode``: one vector (or sequence) per item from an input stage.

Methods and their options come from :mod:`featpipe.encode.registry` (options generated from
the estimators and precomputed, :mod:`featpipe.cli.options`); the work is
:func:`featpipe.stages.encoding.encode`.
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    RUN_OPTION_NAMES,
    ClickReporter,
    finish,
    item_parallel_options,
    open_store,
    run_options,
    store_option,
)
from featpipe.cli.method_help import MethodCommand
from featpipe.cli.options import make_option, method_option_specs, table_entry
from featpipe.cli.suggest import Choice


def table_source() -> dict:
    """The methods (name, summary) and their generated options (``options.json``)."""
    from featpipe.encode.registry import load_methods

    methods = load_methods()
    return {"methods": [[m.name, m.summary] for m in methods.values()],
            "options": method_option_specs(methods, "method")}


def _make_command() -> click.Command:
    entry = table_entry("encode")
    methods = dict(entry["methods"])
    headings = (("Input and output", ("store_path", "input_name", "method", "name")),
                ("Run", RUN_OPTION_NAMES),
                ("Output and help", ("verbose", "quiet", "log_file", "help")))

    @click.command("encode", cls=MethodCommand, selectors=("method",),
                   methods=list(methods.items()), groups=headings,
                   help="Encode each item of an input stage.")
    @store_option
    @click.option("--input", "-i", "input_name", required=True, help="Input stage name.")
    @click.option("--method", "-m", required=True, type=Choice(sorted(methods)),
                  metavar="METHOD",
                  help="Encoding method (listed above).")
    @click.option("--name", "-n", default=None, help="Name to give the encoded stage.")
    @item_parallel_options
    def encode(store_path, input_name, method, name, **kwargs):
        from featpipe.stages.encoding import encode as encode_stage

        options = run_options(kwargs)
        given = {k: v for k, v in kwargs.items() if v not in (None, ())}
        finish(encode_stage(open_store(store_path), input_name, method, given, name=name,
                            options=options, reporter=ClickReporter()))

    encode.params.extend(make_option(spec) for spec in entry["options"])
    return encode


encode = _make_command()
