"""Click options generated from parameter declarations (:mod:`featpipe.parameters`).

A parameter's type and choices come from its constraints, its help from the estimator's
numpydoc, its default from the signature: nothing here is written per parameter.

- :func:`method_option_specs`: the options of several methods at once (encode methods,
  feature methods).  Methods can share an option name with different defaults (``--psi``:
  ``rankpool`` ssr, ``hrp`` ser), so every option defaults to ``None`` (the method's default
  fills in) and keeps each method's own help and default: ``--help`` shows them for the
  method chosen (:mod:`featpipe.cli.method_help`).
- :func:`parameter_option_specs`: one option per parameter with its own default, for commands
  that serve one estimator (``fit dhrp``, ``fit gmsop``...).

An option is first a spec (a JSON-able dict, :func:`make_option` turns it into a
``click.Option``).  Reading the declarations imports the estimators, and with them
scikit-learn, SciPy and pandas (1-2 s); so the specs of every command are precomputed in
``options.json`` beside this module (:data:`TABLE_SOURCES` says what computes each entry;
``python -m featpipe.cli.options`` rewrites it, and ``tests/cli/test_startup.py`` fails when it
is stale).  A command reads its entry with :func:`table_entry`; with encoder plugins
configured (``FEATPIPE_ENCODERS``, entry points), entries that list encode methods are
computed live instead.  This module imports neither scikit-learn nor the estimators.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterable, Mapping
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING

import click

from featpipe.cli.method_help import MethodOption
from featpipe.cli.suggest import Choice
from featpipe.flags import FLAG_ALIASES, flag_of, off_flag_of

if TYPE_CHECKING:
    from featpipe.parameters import Parameter

#: the precomputed table of generated options and choices
TABLE_PATH = Path(__file__).with_name("options.json")
#: table key -> "module:function" computing the entry (importing what it needs); entries
#: marked True list encode or feature methods, so plugins make them live
TABLE_SOURCES: dict[str, tuple[str, bool]] = {
    "commands": ("featpipe.cli:table_source", False),
    "fit commands": ("featpipe.cli.fit:table_source", False),
    "encode": ("featpipe.cli.encode:table_source", True),
    "extract": ("featpipe.cli.extract:table_source", True),
    "classify": ("featpipe.cli.classify:table_source", False),
    "fit pca": ("featpipe.cli.fit_pca:table_source", False),
    "fit gmm": ("featpipe.cli.fit_gmm:table_source", False),
    "fit deep-gmm": ("featpipe.cli.fit_deep_gmm:table_source", False),
    "fit dhrp": ("featpipe.cli.fit_dhrp:table_source", False),
    "fit gmsop": ("featpipe.cli.fit_gmsop:table_source", False),
    "cache pack": ("featpipe.cli.cache_pack:table_source", False),
    "manifest": ("featpipe.cli.manifest:table_source", False),
}


def _kind(param: Parameter) -> tuple[str, object]:
    """('flag', None), ('choice', options), ('int', None), ('float', None) or ('text', None),
    from the raw constraint declarations (scikit-learn's vocabulary, read by duck typing:
    ``"boolean"``, ``"random_state"``, ``StrOptions`` (``.options``), ``Interval``
    (``.type`` and ``.closed``), the types ``int`` and ``float``)."""
    raw = list(param.constraints)
    if "boolean" in raw:
        return "flag", None
    options = [o for c in raw if not isinstance(c, str | type) and hasattr(c, "options")
               for o in c.options - getattr(c, "deprecated", set())]
    if options:
        return "choice", options
    if "random_state" in raw:
        return "int", None
    numbers = [c.type for c in raw if hasattr(c, "closed") and hasattr(c, "type")] + [
        c for c in raw if c in (int, float)]
    if numbers:
        return ("int" if all(t is int or t is Integral for t in numbers) else "float"), None
    return "text", None


def _spec(name: str, params: list[Parameter], default, help_text: str,
          aliases: tuple[str, ...] = (), show_default: bool = False) -> dict:
    """The spec of one option serving ``params`` (the same name in one or more methods): the
    flag of scikit-learn's name, then its short aliases (:data:`FLAG_ALIASES`, ``aliases``)."""
    kinds = [_kind(p) for p in params]
    flag = flag_of(name)
    names = {k for k, _ in kinds}
    spec: dict = {"decls": [flag, *FLAG_ALIASES.get(name, ()), *aliases, name],
                  "default": default, "help": help_text, "show_default": show_default}
    if "flag" in names:
        spec["decls"] = [f"{flag}/{off_flag_of(name, flag)}", name]
    elif "choice" in names:
        spec["choices"] = sorted({o for _, opts in kinds if opts for o in opts})
    elif names <= {"int", "float"}:
        spec["type"] = "int" if names == {"int"} else "float"
    if "flag" not in names and any(p.model for p in params):
        spec["metavar"] = "NAME"
    items = [type(p.default[0]).__name__ for p in params
             if isinstance(p.default, list | tuple) and p.default]
    if items:  # given as "4,6,8"
        spec["list"] = items[0]
    return spec


class WholeNumber(click.ParamType):
    """An integer option: a whole number, also written as a float (``--window 20.0`` is 20,
    ``20.5`` is refused), by :func:`featpipe.parameters.whole_number`, the rule a pipeline
    file and the library follow."""

    name = "integer"

    def convert(self, value, param, ctx):
        from featpipe.parameters import whole_number

        whole = whole_number(value)
        if whole is None:
            self.fail(f"must be a whole number, got {value!r}", param, ctx)
        return whole


def _whole(text: str) -> int:
    from featpipe.parameters import whole_number

    whole = whole_number(text)
    if whole is None:
        raise ValueError(text)
    return whole


def _list_of(kind: str):
    """The callback of a list-valued option: ``"4,6,8"`` -> ``[4, 6, 8]`` (items of type
    ``kind``: int, float or str)."""
    convert = {"int": _whole, "float": float}.get(kind, str)

    def split(ctx, param, value):
        if value is None:
            return None
        try:
            return [convert(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected comma-separated {kind} values, got "
                                     f"{value!r}") from None

    return split


def make_option(spec: Mapping) -> click.Option:
    """The ``click.Option`` of a spec (a :class:`MethodOption` for a method's option)."""
    kwargs = {"default": spec["default"], "help": spec["help"],
              "show_default": spec["show_default"]}
    if "choices" in spec:
        kwargs["type"] = Choice(spec["choices"])
    elif "type" in spec:
        kwargs["type"] = {"int": WholeNumber(), "float": float}[spec["type"]]
    if "metavar" in spec:
        kwargs["metavar"] = spec["metavar"]
    if "list" in spec:
        kwargs["callback"] = _list_of(spec["list"])
    if "methods" in spec:
        return MethodOption(list(spec["decls"]), selector=spec["selector"],
                            per_method=spec["methods"], **kwargs)
    return click.Option(list(spec["decls"]), **kwargs)


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _help(param: Parameter) -> str:
    return param.help.replace("``", "")


def method_help(param: Parameter) -> str:
    """The help one method shows for its parameter: the text and the method's default
    (``Window length M ... [20]``), or for a fitted model the commands that make it."""
    text = _help(param)
    if param.model:
        return f"{text} Made by " + ", ".join(f"`featpipe {f}`" for f in param.model) + "."
    shown = "" if param.default is None else _shown(param.default)
    return f"{text} [{shown}]" if shown else text


def method_option_specs(methods: Mapping[str, object], selector: str) -> list[dict]:
    """One option per parameter name over ``methods`` (name -> a method record with
    ``parameters``), chosen by the option ``selector`` (``method``, ``features``, ``encode``):
    default ``None`` (the method's own default fills in), each method's help and default in
    the spec's ``methods`` (:func:`method_help`)."""
    by_name: dict[str, dict[str, Parameter]] = {}
    for method_name, method in methods.items():
        for param in method.parameters:
            by_name.setdefault(param.name, {})[method_name] = param
    specs = []
    for name, uses in by_name.items():
        spec = _spec(name, list(uses.values()), None, "")
        spec["selector"] = selector
        spec["methods"] = {method: method_help(param) for method, param in uses.items()}
        specs.append(spec)
    return specs


def parameter_option_specs(parameters: Iterable[Parameter],
                           aliases: Mapping[str, str] | None = None) -> list[dict]:
    """One option per parameter, with its own default (shown in the help); ``aliases`` adds a
    short spelling to a parameter's flag (``{"n_components": "--dim"}``: ``--n-components``
    or ``--dim``)."""
    aliases = dict(aliases or {})
    return [_spec(p.name, [p], p.default, _help(p),
                  (aliases[p.name],) if p.name in aliases else (),
                  show_default=p.default is not None) for p in parameters]


def attach_options(specs: Iterable[Mapping]):
    """Decorator: the options of ``specs``, in order, added as ``@click.option`` adds them."""
    specs = list(specs)

    def decorate(func):
        for spec in reversed(specs):
            if isinstance(func, click.Command):
                func.params.append(make_option(spec))
            else:
                func.__click_params__ = [*getattr(func, "__click_params__", []),
                                         make_option(spec)]
        return func

    return decorate


# -- the precomputed table -------------------------------------------------------------------

_TABLE: dict | None = None


def _plugins_configured() -> bool:
    from featpipe.encode.registry import plugin_modules
    from featpipe.extract.features import plugin_modules as feature_plugins

    return bool(plugin_modules() or feature_plugins())


def live_entry(key: str):
    """The table entry ``key`` computed now (imports the estimators)."""
    target, _ = TABLE_SOURCES[key]
    module_name, attr = target.split(":")
    return json.loads(json.dumps(getattr(importlib.import_module(module_name), attr)()))


def table_entry(key: str):
    """The entry ``key`` of the precomputed table (:data:`TABLE_PATH`); computed live when
    the table lacks it or when it lists encode methods and plugins are configured."""
    global _TABLE
    if TABLE_SOURCES[key][1] and _plugins_configured():
        return live_entry(key)
    if _TABLE is None:
        try:
            _TABLE = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
        except FileNotFoundError:
            _TABLE = {}
    if key not in _TABLE:
        return live_entry(key)
    return _TABLE[key]


def write_table(path: Path = TABLE_PATH) -> None:
    """Compute every entry of the table and write it to ``path`` (while computing, the
    commands' modules see an empty table: their own entries are computed live too); with the
    default path, rewrite the encode methods' parameter table too
    (:func:`featpipe.encode.registry.write_table`)."""
    from featpipe.cli import options
    from featpipe.encode import registry

    if path == TABLE_PATH:  # the encode methods' parameter table first: it is read below
        registry.write_table()
    options._TABLE = {}
    table = {key: live_entry(key) for key in TABLE_SOURCES}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_table(Path(sys.argv[1]) if len(sys.argv) > 1 else TABLE_PATH)
