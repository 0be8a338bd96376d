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

A built-in method with a functional core (:data:`FUNCTION_MODULES`: plain functions that import
neither scikit-learn nor torch, :class:`EncodeFunction`) runs from the precomputed table
:data:`TABLE_PATH` instead: :func:`load_method` builds its :class:`EncodeMethod` from the
table's parameter records (written from the estimators' declarations by :func:`write_table`;
``python -m featpipe.cli.options`` rewrites it with the option table, and
``tests/unit/test_parameters.py`` fails while it is stale) and the core's function, so that
``featpipe encode --method hrp`` never imports ``sklearn.base``.  :func:`load_methods` (the
listing, the option table, the plugins) reads the estimators.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from featpipe import settings
from featpipe.parameters import (
    Parameter,
    check_device,
    check_parameter_values,
    constraint_from_json,
    constraint_json,
    parameter_record,
)

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
#: Functional cores of built-in methods (modules defining ENCODE_FUNCTIONS), with their methods:
#: these run from the parameter table (:data:`TABLE_PATH`), without their estimators.
FUNCTION_MODULES: dict[str, tuple[str, ...]] = {
    "featpipe.encode.functional.temporal": ("avg", "max", "tpyramid", "arp", "rankpool", "hrp",
                                            "recursive"),
}
#: The precomputed parameter records of the methods of :data:`FUNCTION_MODULES`.
TABLE_PATH = Path(__file__).with_name("methods.json")
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
    of ``--method cov``), so that their rules are checked with them.  ``rules`` checks what a
    method's estimators (the parameters' ``owner``) would check besides each value, for a
    method whose parameters have none: one read from the parameter table (the rules between
    parameters and the device).
    """

    name: str
    summary: str
    build: Callable[..., ItemEncoder]
    parameters: tuple[Parameter, ...] = ()
    #: items per encode_batch call, or a function of the parameters (e.g. more on a GPU)
    batch_size: int | Callable[[Mapping], int] = 16
    fixed: Mapping[str, object] = field(default_factory=dict)
    rules: Callable[[Mapping], None] | None = None
    #: a method that keeps a column range of its input: ``view(params, models)`` gives
    #: ``(columns, sidecars kept)``, and its stage on a stored input is a view of it
    #: (:meth:`featpipe.store.Stage.make_view`), not a copy
    view: Callable[[Mapping, Mapping], tuple[slice, tuple[str, ...]]] | None = None
    #: the item kinds it takes and the kind it makes (a :class:`featpipe.item_kinds.Kinds`;
    #: None: undeclared, a plugin's, not checked)
    kinds: object = None

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
        if self.rules is not None:
            self.rules({**self.fixed, **params})


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
    """Method ``name``; without plugins, only its own module is imported: its functional core
    with the parameter table where it has one (:data:`FUNCTION_MODULES`), else its estimators'
    module (``KeyError`` for a name no module defines)."""
    module_name = next((m for m, names in METHOD_MODULES.items() if name in names), None)
    if module_name is None or plugin_modules():
        return load_methods()[name]
    core = next((m for m, names in FUNCTION_MODULES.items() if name in names), None)
    if core is not None and name in _table():
        return table_method(name, importlib.import_module(core).ENCODE_FUNCTIONS[name])
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


@dataclass(frozen=True)
class EncodeFunction:
    """A method's functional core.  ``function(items, **params)`` encodes a list of items that
    ``validate(arrays, device, expected_dim)`` returned (raising an error that names the bad
    one; ``expected_dim``: the dimension of the batches before) and returns one array per
    item; ``params`` is the method's record with its ``fixed`` values.  ``batch_size``,
    ``rules`` and ``kinds`` as in :class:`EncodeMethod`."""

    function: Callable[..., list]
    validate: Callable[..., list]
    batch_size: int | Callable[[Mapping], int] = 16
    rules: Callable[[Mapping], None] | None = None
    kinds: object = None


def function_builder(core: EncodeFunction, **fixed) -> Callable[[Mapping, Mapping], ItemEncoder]:
    """``build`` for a method run by its functional core (:class:`FunctionEncoder`)."""

    def build(params: Mapping, models: Mapping) -> ItemEncoder:
        return FunctionEncoder(core, {**params, **fixed})

    return build


class FunctionEncoder:
    """The :class:`ItemEncoder` around a functional core: the first batch fixes the dimension
    (a later item with another fails clearly), float32 results out."""

    def __init__(self, core: EncodeFunction, params: Mapping):
        self.core, self.params, self.dim = core, dict(params), None

    def encode_batch(self, arrays: Sequence[np.ndarray],
                     extras: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
        import numpy as np

        from featpipe.backend import to_numpy

        if not arrays:
            return []
        items = self.core.validate(arrays, self.params.get("device", "cpu"), self.dim)
        self.dim = items[0].shape[1]
        return [np.asarray(to_numpy(e)).astype(np.float32)
                for e in self.core.function(items, **self.params)]


def table_method(name: str, core: EncodeFunction) -> EncodeMethod:
    """Method ``name`` of the parameter table, run by ``core``: its parameters are the table's
    records (constraints read by :func:`featpipe.parameters.constraint_from_json`), checked
    by featpipe's own checks and the core's rules."""
    entry = _table()[name]
    parameters = tuple(Parameter(p["name"], p["default"],
                                 tuple(constraint_from_json(c) for c in p["constraints"]),
                                 p["help"], model=tuple(p["model"]), required=p["required"])
                       for p in entry["parameters"])
    def rules(params: Mapping) -> None:  # as ValidatedEstimator.check_param_values does
        if core.rules is not None:
            core.rules(params)
        check_device(params.get("device"))

    return EncodeMethod(name, entry["summary"], function_builder(core, **entry["fixed"]),
                        parameters, core.batch_size, entry["fixed"], rules, kinds=core.kinds)


_TABLE: dict | None = None


def _table() -> dict:
    global _TABLE
    if _TABLE is None:
        try:
            _TABLE = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
        except FileNotFoundError:
            _TABLE = {}
    return _TABLE


def table_entries() -> dict:
    """The parameter table computed now from the estimators' declarations (imports them)."""
    methods = load_methods()
    return {name: {"summary": methods[name].summary, "fixed": dict(methods[name].fixed),
                   "parameters": [{"name": p.name, "default": p.default, "help": p.help,
                                   "constraints": [constraint_json(c) for c in p.constraints],
                                   "model": list(p.model), "required": p.required}
                                  for p in methods[name].parameters]}
            for names in FUNCTION_MODULES.values() for name in names}


def write_table(path: Path = TABLE_PATH) -> None:
    """Write :func:`table_entries` to ``path``."""
    path.write_text(json.dumps(table_entries(), indent=1, sort_keys=True) + "\n",
                    encoding="utf-8")


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


if __name__ == "__main__":
    write_table(Path(sys.argv[1]) if len(sys.argv) > 1 else TABLE_PATH)
