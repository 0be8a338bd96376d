"""The ``featpipe encode --method`` registry.

Each encoder module declares ``ENCODE_METHODS``, a list of :class:`EncodeMethod`, and is named
in :data:`METHOD_MODULES`.  ``featpipe encode`` offers the union of their options; every click
option of a method defaults to ``None`` and the method's ``defaults`` fill in what the user did
not give, so two methods can share an option name (``--C``) with different defaults.  The
stage key hashes the method name and its complete parameter dict.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
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
    #: items per encode_batch call, or a function of the parameters (e.g. more on a GPU)
    batch_size: int | Callable[[Mapping], int] = 16


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
