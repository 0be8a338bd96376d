"""The ``featpipe encode --method`` registry.

Each encoder module declares ``ENCODE_METHODS``, a list of :class:`EncodeMethod`, and is named
in :data:`METHOD_MODULES`.  ``featpipe encode`` offers the union of their options; every click
option of a method defaults to ``None`` and the method's ``defaults`` fill in what the user did
not give, so two methods can share an option name (``--C``) with different defaults.  The
stage key hashes the method name and its complete parameter dict.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import click
import numpy as np

#: Modules that define ENCODE_METHODS; add yours here.
METHOD_MODULES: list[str] = [
    "featpipe.encode.temporal",
    "featpipe.encode.standardize",
    "featpipe.encode.spatial",
    "featpipe.encode.fisher",
    "featpipe.encode.bilinear",
    "featpipe.learn.dhrp",
    "featpipe.learn.gmsop",
]


class ItemEncoder(Protocol):
    """Encodes a batch of items (arrays from the input stage, with their sidecars)."""

    def encode_batch(self, arrays: Sequence[np.ndarray],
                     extras: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class EncodeMethod:
    """One ``--method`` value.

    ``build(params, models)`` returns an :class:`ItemEncoder`; ``params`` holds every option of
    the method (defaults applied) and ``models`` maps each option listed in ``model_options``
    (options whose value names a fitted stage, such as ``--gmm``) to that :class:`Stage`.
    """

    name: str
    summary: str
    build: Callable[..., ItemEncoder]
    options: tuple[click.Option, ...] = ()
    defaults: Mapping[str, object] = field(default_factory=dict)
    model_options: tuple[str, ...] = ()
    batch_size: int = 16


def load_methods() -> dict[str, EncodeMethod]:
    methods: dict[str, EncodeMethod] = {}
    for module_name in METHOD_MODULES:
        for method in importlib.import_module(module_name).ENCODE_METHODS:
            if method.name in methods:
                raise RuntimeError(f"encode method {method.name!r} is registered twice")
            methods[method.name] = method
    return methods


def method_params(method: EncodeMethod, given: Mapping[str, object]) -> dict:
    """The method's complete parameters: what the user gave, else the method's default."""
    params = {}
    for option in method.options:
        value = given.get(option.name)
        if value is None or value == ():
            value = method.defaults.get(option.name)
        params[option.name] = list(value) if isinstance(value, tuple) else value
    return params


def method_options(methods: Iterable[EncodeMethod], skip: Container[str] = ()
                   ) -> list[click.Option]:
    """The click options of ``methods``, one per name (the first declaration wins), minus
    the names in ``skip``: ``featpipe encode`` and ``featpipe extract --encode`` offer
    exactly these."""
    options: dict[str, click.Option] = {}
    for method in methods:
        for option in method.options:
            if option.name not in skip:
                options.setdefault(option.name, option)
    return list(options.values())


def given_params(method: EncodeMethod, values: Mapping[str, object], flag: str = "--method"
                 ) -> dict:
    """The values of ``method``'s own options; a value given for an option of another
    method is a usage error (``flag`` names the method's flag in the message)."""
    own = {option.name for option in method.options}
    stray = sorted(k for k, v in values.items() if v not in (None, ()) and k not in own)
    if stray:
        flags = ", ".join("--" + k.replace("_", "-") for k in stray)
        raise click.UsageError(f"{flags} does not apply to {flag} {method.name}")
    return {k: v for k, v in values.items() if k in own}
