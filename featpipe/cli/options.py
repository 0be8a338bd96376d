"""Click options generated from parameter declarations (:mod:`featpipe.parameters`).

A parameter's type and choices come from its constraints, its help from the estimator's
numpydoc, its default from the signature: nothing here is written per parameter.

- :func:`click_options`: the options of several encode methods at once.  Methods can share an
  option name with different defaults (``--psi``: ``rankpool`` ssr, ``hrp`` ser), so every
  option defaults to ``None`` (the method's default fills in) and the help lists the
  defaults per method.
- :func:`parameter_options`: a decorator adding one option per parameter with its own
  default, for commands that serve one estimator (``fit dhrp``, ``fit gmsop``...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from numbers import Integral

import click
from sklearn.utils._param_validation import (
    Interval,
    StrOptions,
    _Booleans,
    _InstancesOf,
    _RandomStates,
    make_constraint,
)

from featpipe.errors import FLAG_ALIASES, flag_of, off_flag_of
from featpipe.parameters import Parameter


def _kind(param: Parameter) -> tuple[str, object]:
    """('flag', None), ('choice', options), ('int', None), ('float', None) or ('text', None)."""
    made = [make_constraint(c) for c in param.constraints]
    if any(isinstance(c, _Booleans) for c in made):
        return "flag", None
    options = [o for c in made if isinstance(c, StrOptions) for o in c.options]
    if options:
        return "choice", options
    if any(isinstance(c, _RandomStates) for c in made):
        return "int", None
    numbers = [c.type for c in made if isinstance(c, Interval)] + [
        c.type for c in made if isinstance(c, _InstancesOf) and c.type in (int, float)]
    if numbers:
        return ("int" if all(t is int or t is Integral for t in numbers) else "float"), None
    return "text", None


def _option(name: str, params: list[Parameter], default, help_text: str,
            aliases: tuple[str, ...] = (), show_default: bool = False) -> click.Option:
    kinds = [_kind(p) for p in params]
    flag = flag_of(name)
    names = {k for k, _ in kinds}
    kwargs: dict = {"default": default, "help": help_text, "show_default": show_default}
    if "flag" in names:
        decls = [f"{flag}/{off_flag_of(name, flag)}", name]
    else:
        decls = [flag, *FLAG_ALIASES.get(name, ()), *aliases, name]
        if "choice" in names:
            kwargs["type"] = click.Choice(sorted({o for _, opts in kinds if opts for o in opts}))
        elif names <= {"int", "float"}:
            kwargs["type"] = int if names == {"int"} else float
        if any(p.model for p in params):
            kwargs["metavar"] = "NAME"
    return click.Option(decls, **kwargs)


def _grouped(uses: Mapping[str, Parameter], value) -> dict[str, list[str]]:
    """Methods grouped by ``value(param)`` (in first-use order)."""
    groups: dict[str, list[str]] = {}
    for method, param in uses.items():
        groups.setdefault(value(param), []).append(method)
    return groups


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _help(param: Parameter) -> str:
    return param.help.replace("``", "")


def shared_help(uses: Mapping[str, Parameter], all_methods: int) -> str:
    """Help of an option several methods share: the text (per method when the declarations
    differ), the methods when not all take it, and the defaults (per method when they differ):
    ``... (hrp, recursive) [2]``, ``... [rankpool: ssr; hrp, recursive: ser]``."""
    texts = _grouped(uses, _help)
    if len(texts) == 1:
        text = next(iter(texts))
    else:
        text = " | ".join(f"{', '.join(m)}: {t}" for t, m in texts.items())
    first = next(iter(uses.values()))
    if first.model:
        fits = _grouped(uses, lambda p: ", ".join(f"`featpipe {f}`" for f in p.model))
        return f"{text} Made by " + "; ".join(f"{f} ({', '.join(m)})" for f, m in fits.items())
    defaults = _grouped(uses, lambda p: "" if p.default is None else _shown(p.default))
    if len(defaults) == 1:
        if len(uses) < all_methods and len(texts) == 1:
            text += f" ({', '.join(uses)})"
        shown = next(iter(defaults))
        return f"{text} [{shown}]" if shown else text
    return f"{text} [" + "; ".join(f"{', '.join(m)}: {v or 'none'}"
                                   for v, m in defaults.items()) + "]"


def click_options(methods: Mapping[str, object]) -> tuple[click.Option, ...]:
    """One option per parameter name over ``methods`` (name -> EncodeMethod), default ``None``
    (the method's own default fills in), help from :func:`shared_help`."""
    by_name: dict[str, dict[str, Parameter]] = {}
    for method_name, method in methods.items():
        for param in method.parameters:
            by_name.setdefault(param.name, {})[method_name] = param
    return tuple(_option(name, list(uses.values()), None, shared_help(uses, len(methods)))
                 for name, uses in by_name.items())


def parameter_options(parameters: Iterable[Parameter], aliases: Mapping[str, str] | None = None):
    """Decorator: one click option per parameter, with its own default (shown in the help);
    ``aliases`` adds a short spelling to a parameter's flag (``{"n_components": "--dim"}``:
    ``--n-components`` or ``--dim``)."""
    aliases = dict(aliases or {})
    parameters = list(parameters)

    def decorate(func):
        for param in reversed(parameters):
            alias = (aliases[param.name],) if param.name in aliases else ()
            option = _option(param.name, [param], param.default, _help(param), alias,
                             show_default=param.default is not None)
            func = _attach(func, option)
        return func

    return decorate


def _attach(func, option: click.Option):
    """Add ``option`` to a function or command the way ``@click.option`` does."""
    if isinstance(func, click.Command):
        func.params.append(option)
    else:
        if not hasattr(func, "__click_params__"):
            func.__click_params__ = []
        func.__click_params__.append(option)
    return func
