"""The ``featpipe encode --method`` registry.

Each encoder module declares ``ENCODE_METHODS``, a list of :class:`EncodeMethod`; the modules
are :data:`METHOD_MODULES`, then any plugin module named by the ``featpipe.encoders`` entry
point group or by the ``FEATPIPE_ENCODERS`` environment variable (module names separated by
commas; CONTRIBUTING.md shows a whole plugin).

A method's parameters are declared once, by the estimator classes that take them
(:func:`featpipe.parameters.estimator_parameters`: signature, ``_parameter_constraints``,
numpydoc), plus the model parameters that name fitted stages
(:func:`featpipe.parameters.model_parameter`).  ``featpipe encode`` offers the union of the
methods' options (generated, :mod:`featpipe.cli.options`); :func:`method_params` fills in the
method's defaults and :meth:`EncodeMethod.validate` checks every value before a stage exists.
The stage key hashes the method name and its canonical parameter record.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from featpipe import settings
from featpipe.parameters import Parameter, check_parameter_values, parameter_record

if TYPE_CHECKING:  # numpy is imported where items are encoded: ``encode --help`` needs none
    import numpy as np

#: Modules that define ENCODE_METHODS, with the names of their methods (checked when the module
#: is loaded), so that running one method imports its own module only (plugins: the
#: ``featpipe.encoders`` entry points and ``$FEATPIPE_ENCODERS``).
METHOD_MODULES: dict[str, tuple[str, ...]] = {
    "featpipe.encode.temporal": ("avg", "max", "tpyramid", "arp", "rankpool", "hrp",
                                 "recursive"),
    "featpipe.encode.standardize": ("standardize",),
    "featpipe.encode.spatial": ("spatial-grid",),
    "featpipe.encode.fisher": ("fisher",),
    "featpipe.encode.fisher_groups": ("fisher-group",),
    "featpipe.encode.bilinear": ("bilinear", "cov", "cbp-ts", "cbp-rm"),
    "featpipe.learn.dhrp": ("dhrp",),
    "featpipe.learn.gmsop": ("gmsop",),
}
#: Entry point group of plugin modules (each value names a module with ENCODE_METHODS).
ENTRY_POINT_GROUP = "featpipe.encoders"
#: Environment variable listing plugin modules, separated by commas.
PLUGIN_VARIABLE = "FEATPIPE_ENCODERS"


class ItemEncoder(Protocol):
    """Encodes a batch of items (arrays from the input stage, with their sidecars)."""

    def encode_batch(self, arrays: Sequence[np.ndarray],
                     extras: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class EncodeMethod:
    """One ``--method`` value.

    ``build(params, models)`` returns an :class:`ItemEncoder`; ``params`` holds every parameter
    of the method (defaults applied, validated) and ``models`` maps each model parameter (one
    that names a fitted stage, such as ``gmm``) to that :class:`~featpipe.store.Stage`.
    ``fixed`` holds the values ``build`` gives the estimators besides ``params`` (the pooling
    of ``--method cov``), so that their rules are checked with them.
    """

    name: str
    summary: str
    build: Callable[..., ItemEncoder]
    parameters: tuple[Parameter, ...] = ()
    #: items per encode_batch call, or a function of the parameters (e.g. more on a GPU)
    batch_size: int | Callable[[Mapping], int] = 16
    fixed: Mapping[str, object] = field(default_factory=dict)

    @property
    def defaults(self) -> dict[str, object]:
        return {p.name: p.default for p in self.parameters}

    @property
    def model_options(self) -> tuple[str, ...]:
        """The parameters that name fitted model stages."""
        return tuple(p.name for p in self.parameters if p.model)

    def validate(self, params: Mapping[str, object]) -> None:
        """Raise :class:`~featpipe.errors.ParameterError` for a missing model or a bad value."""
        check_parameter_values(self.parameters, params, f"--method {self.name}", self.fixed)


def plugin_modules() -> list[str]:
    """The plugin modules: ``featpipe.encoders`` entry points, then ``$FEATPIPE_ENCODERS``."""
    return settings.plugin_modules(ENTRY_POINT_GROUP, PLUGIN_VARIABLE)


def _module_methods(module_name: str) -> list[EncodeMethod]:
    """The ENCODE_METHODS of built-in module ``module_name``: the names METHOD_MODULES lists."""
    declared = list(importlib.import_module(module_name).ENCODE_METHODS)
    names = tuple(method.name for method in declared)
    if names != METHOD_MODULES[module_name]:
        raise RuntimeError(f"{module_name} defines the encode methods {names}, but "
                           f"METHOD_MODULES lists {METHOD_MODULES[module_name]}")
    return declared


def load_method(name: str) -> EncodeMethod:
    """Method ``name``; without plugins, only its own module is imported (``KeyError`` for a
    name no module defines)."""
    module_name = next((m for m, names in METHOD_MODULES.items() if name in names), None)
    if module_name is None or plugin_modules():
        return load_methods()[name]
    return next(method for method in _module_methods(module_name) if method.name == name)


def load_methods() -> dict[str, EncodeMethod]:
    """Every method by name: the built-in modules', then the plugins'."""
    found = [(name, _module_methods(name)) for name in METHOD_MODULES]
    found += [(name, settings.plugin_attribute(name, PLUGIN_VARIABLE, "ENCODE_METHODS"))
              for name in plugin_modules()]
    return settings.registry(found, "encode method")


def method_params(method: EncodeMethod, given: Mapping[str, object]) -> dict:
    """The method's canonical record (:func:`featpipe.parameters.parameter_record`): what the
    user gave (``None`` or ``()``: not given), else the method's default, typed by the
    declarations."""
    given = {k: v for k, v in given.items()
             if v is not None and not (isinstance(v, tuple) and not v)}
    return parameter_record(method.parameters, given, f"--method {method.name}")


def estimator_builder(cls, **fixed) -> Callable[[Mapping, Mapping], ItemEncoder]:
    """``build`` for a method whose parameters are those of transformer ``cls``: the
    transformer, fed one batch of item arrays at a time (:class:`BatchTransformer`)."""

    def build(params: Mapping, models: Mapping) -> ItemEncoder:
        return BatchTransformer(cls(**params, **fixed))

    return build


class BatchTransformer:
    """The :class:`ItemEncoder` around a transformer of lists of arrays: ``fit`` on the first
    item (it records the dimension, so that a later item with other dimensions fails with a
    clear error), then ``transform`` each batch into float32 rows.  A transformer with
    ``transform_sequences`` and ``emit_layer`` set gives one sequence per item instead."""

    def __init__(self, transformer):
        self.transformer = transformer

    def encode_batch(self, arrays: Sequence[np.ndarray],
                     extras: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
        import numpy as np

        if not arrays:
            return []
        if getattr(self.transformer, "n_features_in_", None) is None:
            self.transformer.fit([arrays[0]])
        if getattr(self.transformer, "emit_layer", None) is not None:
            return [s.astype(np.float32) for s in self.transformer.transform_sequences(arrays)]
        return list(np.asarray(self.transformer.transform(arrays)).astype(np.float32))
