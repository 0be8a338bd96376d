"""Parameters declared once: in an estimator's signature, constraints and docstring.

An estimator (scikit-learn's contract, ``sklearn/base.py``) declares each parameter in three
places that belong together:

- its ``__init__`` signature: the name and the default;
- ``_parameter_constraints``: what values are valid, in scikit-learn's vocabulary
  (``Interval(Integral, 1, None, closed="left")``, ``StrOptions({"avg", "max"})``, ``"boolean"``,
  ``None``...; ``sklearn/utils/_param_validation.py``);
- the numpydoc ``Parameters`` section of its class docstring: the help text.

From these :func:`estimator_parameters` builds :class:`Parameter` records, which the command
line turns into options (:mod:`featpipe.cli.options`) and the stage functions validate before
any stage exists (:func:`check_params`).

:func:`parameter_record` turns what a user gave (command line, pipeline file or Python call)
into the stage's canonical record, the part of its key that says what was computed: every
declared parameter under its one name, the default where none was given, each value typed by
its declaration (:func:`typed_value`: ``5`` for a float parameter is ``5.0``, ``20.0`` for an
int parameter is ``20``), so equal values written differently give one key.  A bad value raises
:class:`~featpipe.errors.ParameterError` naming the parameter as the library spells it
(``window``); the command line shows the flag (``--window``) and exits with status 2.

:class:`ValidatedEstimator` is the mixin every featpipe estimator puts before
``BaseEstimator``: scikit-learn's ``_validate_params`` (called by ``_fit_context``) then
raises a ParameterError, and ``_check_params`` adds the rules that tie two parameters together
(``emit_layer <= depth``).

A stage's run settings that are not an estimator's (``extract``'s frame sampling, stored
dtype, decoder...) are a dataclass whose fields are declared with :func:`declared` (default,
help, choices; the type is the field's annotation); :func:`record_parameters` gives their
:class:`Parameter` records, so the command line and pipeline files read them as they read an
estimator's.

Values are checked and typed without scikit-learn for the vocabulary featpipe's estimators use
(``None``, ``"boolean"``, types, ``Interval``, ``StrOptions``; scikit-learn is imported for the
rest), so that the command line reads :class:`Parameter` records (``featpipe --help``) and
checks a run's values without it.  :func:`constraint_json` writes a declaration into the
precomputed parameter table of :mod:`featpipe.encode.registry`; :func:`constraint_from_json`
reads it back as :class:`DeclaredInterval` / :class:`DeclaredOptions`, which check and print as
scikit-learn's ``Interval`` / ``StrOptions`` do.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real

from featpipe.errors import FeatpipeError, ParameterError


def describe(constraint) -> str:
    """A constraint in words: ``an int in the range [1, inf)``, ``one of avg, max``."""
    if getattr(constraint, "type", None) is str and hasattr(constraint, "options"):
        return "one of " + ", ".join(sorted(constraint.options - constraint.deprecated))
    return str(constraint)


class DeclaredInterval:
    """scikit-learn's ``Interval`` as featpipe reads it from the parameter table (the same
    attributes, test and words), without importing scikit-learn."""

    hidden = False

    def __init__(self, type, left, right, closed):
        self.type, self.left, self.right, self.closed = type, left, right, closed

    def is_satisfied_by(self, value) -> bool:
        if not isinstance(value, self.type) or (not isinstance(value, Integral)
                                                and math.isnan(value)):
            return False
        left = -math.inf if self.left is None else self.left  # an open end refuses ±inf
        right = math.inf if self.right is None else self.right
        return (left <= value if self.closed in ("left", "both") else left < value) and \
            (value <= right if self.closed in ("right", "both") else value < right)

    def __str__(self):
        real = self.type is not Integral
        left = "-inf" if self.left is None else float(self.left) if real else self.left
        right = "inf" if self.right is None else float(self.right) if real else self.right
        return (f"{'an int' if not real else 'a float'} in the range "
                f"{'[' if self.closed in ('left', 'both') else '('}{left}, "
                f"{right}{']' if self.closed in ('right', 'both') else ')'}")


class DeclaredOptions:
    """scikit-learn's ``StrOptions`` as featpipe reads it from the parameter table."""

    hidden = False
    type = str

    def __init__(self, options, deprecated=()):
        self.options, self.deprecated = set(options), set(deprecated)

    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, str) and value in self.options


#: the table form of the types a constraint may name
_TYPES = {t.__name__: t for t in (int, float, str, bool, list, tuple, Integral, Real)}


def constraint_json(constraint):
    """One declaration (scikit-learn's vocabulary) as JSON: ``None`` and strings
    (``"boolean"``) as they are, ``{"type": "int"}``, ``{"options": [...], "deprecated":
    [...]}``, ``{"interval": "int" or "real", "left", "right", "closed"}``; ``TypeError``
    for a declaration the table cannot hold."""
    if constraint is None or isinstance(constraint, str):
        return constraint
    if isinstance(constraint, type) and _TYPES.get(constraint.__name__) is constraint:
        return {"type": constraint.__name__}
    if getattr(constraint, "type", None) is str and hasattr(constraint, "options"):
        return {"options": sorted(constraint.options),
                "deprecated": sorted(constraint.deprecated)}
    if hasattr(constraint, "closed") and constraint.type in (Integral, Real):
        return {"interval": "int" if constraint.type is Integral else "real",
                "left": constraint.left, "right": constraint.right, "closed": constraint.closed}
    raise TypeError(f"{constraint!r} has no form in the parameter table")


def constraint_from_json(entry):
    """The declaration :func:`constraint_json` wrote (:class:`DeclaredInterval`,
    :class:`DeclaredOptions`)."""
    if entry is None or isinstance(entry, str):
        return entry
    if "type" in entry:
        return _TYPES[entry["type"]]
    if "options" in entry:
        return DeclaredOptions(entry["options"], entry["deprecated"])
    return DeclaredInterval(Integral if entry["interval"] == "int" else Real, entry["left"],
                            entry["right"], entry["closed"])


def _is_bool(value) -> bool:
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy"
                                       and kind.__name__ in ("bool", "bool_"))


def _type_name(kind: type) -> str:
    """A type as scikit-learn's messages name it (``int``, ``float``, ``numpy.ndarray``)."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return {Real: "float", Integral: "int"}.get(kind, f"{kind.__module__}.{kind.__qualname__}")


def _read(constraint):
    """(test, words) of one declaration read without scikit-learn (``None``, ``"boolean"``,
    a type, or a constraint object with ``is_satisfied_by``), as scikit-learn reads it; None
    for what only scikit-learn reads (``"array-like"``, ``"random_state"``, ``Hidden``...)."""
    if constraint is None:
        return (lambda value: value is None), "None"
    if isinstance(constraint, str):
        return (_is_bool, "an instance of 'bool' or an instance of 'numpy.bool'") \
            if constraint == "boolean" else None
    if isinstance(constraint, type):
        return (lambda value: isinstance(value, constraint)), \
            f"an instance of '{_type_name(constraint)}'"
    if hasattr(constraint, "is_satisfied_by") and not getattr(constraint, "hidden", True):
        return constraint.is_satisfied_by, describe(constraint)
    return None


def check_value(name: str, value, constraints: Iterable) -> None:
    """Raise :class:`ParameterError` unless ``value`` satisfies one of ``constraints``.

    The vocabulary featpipe's own estimators use is read here (:func:`_read`); scikit-learn
    is imported only for the rest of its vocabulary."""
    if constraints == "no_validation":
        return
    constraints = list(constraints)
    read = [_read(c) for c in constraints]
    if any(r is None for r in read):
        from sklearn.utils._param_validation import make_constraint

        made = [make_constraint(c) for c in constraints]
        read = [(c.is_satisfied_by, None if c.hidden else describe(c)) for c in made]
        takes_bool = any(_takes_bool(c) for c in made)
    else:
        takes_bool = any(c == "boolean" or c is bool for c in constraints)
    # a bool is an int to Python (True == 1) but no number to a user: only a parameter
    # declared boolean takes one, so that stride = true is no second spelling of stride = 1
    if not isinstance(value, bool) or takes_bool:
        if any(test(value) for test, _ in read):
            return
    shown = [words for _, words in read if words is not None]
    raise ParameterError(name, f"must be {' or '.join(shown)}, got {value!r}")


def _takes_bool(constraint) -> bool:
    """Whether a made constraint accepts a bool as such (``"boolean"``, ``bool``), not as the
    number 0 or 1."""
    from sklearn.utils._param_validation import _Booleans, _InstancesOf

    return isinstance(constraint, _Booleans) or (isinstance(constraint, _InstancesOf)
                                                 and constraint.type is bool)


def check_params(constraints: Mapping[str, Iterable], values: Mapping[str, object]) -> None:
    """Check each value that has constraints (scikit-learn's vocabulary)."""
    for name, value in values.items():
        if name in constraints:
            check_value(name, value, constraints[name])


def check_device(device) -> None:
    """``cuda`` only where CuPy or torch sees a GPU (:func:`featpipe.backend.device_namespace`;
    on the node itself when the check is for a cluster task: ``node_checks_deferred``)."""
    from featpipe.settings import node_checks_deferred

    if device == "cuda" and not node_checks_deferred():
        from featpipe.backend import device_namespace

        try:
            device_namespace("cuda")
        except FeatpipeError:
            raise ParameterError("device", "cuda: no GPU found (neither CuPy nor torch sees a "
                                 "CUDA device); use cpu") from None


class ValidatedEstimator:
    """Mixin (left of ``BaseEstimator``): parameter errors name the parameter.

    :meth:`check_param_values` checks values against ``_parameter_constraints``, then the
    rules between parameters (:meth:`_check_param_rules`, none by default), then the device;
    it needs no instance, so a stage checks its parameters before it builds anything.
    scikit-learn's ``_validate_params`` (and ``_fit_context``) call it on the instance.
    """

    _parameter_constraints: dict = {}

    @classmethod
    def check_param_values(cls, params: Mapping[str, object]) -> None:
        """Raise :class:`ParameterError` for the first invalid value in ``params``."""
        check_params(cls._parameter_constraints, params)
        cls._check_param_rules(params)
        check_device(params.get("device"))

    @classmethod
    def _check_param_rules(cls, params: Mapping[str, object]) -> None:
        """Rules that tie parameters together (``emit_layer <= depth``); raise ParameterError.
        ``params`` may hold only some of the parameters."""

    def _validate_params(self) -> None:
        self.check_param_values(self.get_params(deep=False))


class DeclaredEstimator(ValidatedEstimator):
    """scikit-learn's estimator contract for parameters (``sklearn/base.py``:
    ``get_params``, ``set_params``, the repr of the non-default values; ``sklearn.base.clone``
    copies one) without importing scikit-learn, for the feature methods: they fit nothing
    and are built in every decoding worker, where importing scikit-learn (SciPy's statistics
    and pandas with it) costs 2-3 s of CPU per process.  No nested estimators: ``deep`` changes
    nothing.  Constraints use :class:`DeclaredInterval` and :class:`DeclaredOptions`."""

    @classmethod
    def _parameter_names(cls) -> list[str]:
        """The ``__init__`` arguments, sorted (as ``BaseEstimator._get_param_names``)."""
        return sorted(name for name, arg in inspect.signature(cls.__init__).parameters.items()
                      if name != "self"
                      and arg.kind not in (arg.VAR_KEYWORD, arg.VAR_POSITIONAL))

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._parameter_names()}

    def set_params(self, **params):
        names = self._parameter_names()
        for name, value in params.items():
            if name not in names:
                raise ValueError(f"Invalid parameter {name!r} for estimator {self}. Valid "
                                 f"parameters are: {names!r}.")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = inspect.signature(type(self).__init__).parameters
        shown = [f"{name}={value!r}" for name, value in self.get_params().items()
                 if repr(value) != repr(defaults[name].default)]  # as scikit-learn decides
        return f"{type(self).__name__}({', '.join(shown)})"


@dataclass(frozen=True)
class Parameter:
    """One parameter of an estimator or of an encode method.

    ``owner`` is the estimator class that declares it (its constraints and rules validate
    it); ``model`` names the ``featpipe fit`` commands that make the fitted stage a model
    parameter names (its value is a stage name); ``required`` is declared, never guessed from
    a default.
    """

    name: str
    default: object
    constraints: tuple
    help: str
    owner: type | None = None
    model: tuple[str, ...] = ()
    required: bool = False


def model_parameter(name: str, help: str, fits: Iterable[str], required: bool = True
                    ) -> Parameter:
    """A parameter naming a fitted model stage made by one of ``fits`` (``featpipe fit gmm``);
    required unless said otherwise."""
    return Parameter(name, None, (str, None), help, model=tuple(fits), required=required)


def check_parameter_values(parameters: Iterable[Parameter], values: Mapping[str, object],
                           what: str, fixed: Mapping[str, object] | None = None) -> None:
    """Validate ``values`` against ``parameters``: required model stages first, then each
    owner's constraints and rules on its own parameters, with the ``fixed`` values an owner
    also receives (``method="cov"``).  ``what`` names the user of a missing model in the
    message (``--method fisher``)."""
    owners: dict[type, dict] = {}
    for param in parameters:
        value = values.get(param.name)
        if param.required and value in (None, ""):
            fits = " or ".join(f"`featpipe {fit}`" for fit in param.model)
            raise ParameterError(param.name, f"is required by {what}: the name of a model "
                                 f"stage made by {fits}")
        if param.owner is not None:
            owners.setdefault(param.owner, {})[param.name] = value
        else:
            check_value(param.name, value, param.constraints)
    for owner, subset in owners.items():
        own = {k: v for k, v in (fixed or {}).items() if k in owner._parameter_constraints}
        owner.check_param_values({**own, **subset})


def parameter_docs(cls) -> dict[str, str]:
    """Help text of each parameter from the numpydoc ``Parameters`` sections of ``cls`` and its
    bases (a base documents the parameters its subclasses share; the subclass wins).

    An entry is a line ``name : type`` (or ``a, b : type``) followed by indented description
    lines; the section ends at the next underlined heading.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__doc__" in vars(klass):
            docs.update(_section_docs(klass.__doc__))
    return docs


def _section_docs(doc: str | None) -> dict[str, str]:
    lines = inspect.cleandoc(doc or "").splitlines()
    docs: dict[str, list[str]] = {}
    try:
        start = next(i for i in range(len(lines) - 1) if lines[i].strip() == "Parameters"
                     and set(lines[i + 1].strip()) == {"-"}) + 2
    except StopIteration:
        return {}
    current: list[str] = []
    for i in range(start, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and set(lines[i + 1].strip()) == {"-"}:
            break  # the next section
        if line and not line[0].isspace():
            current = [n.strip() for n in line.partition(" : ")[0].split(",")]
            for name in current:
                docs[name] = []
        elif line.strip():
            for name in current:
                docs[name].append(line.strip())
    return {name: " ".join(text) for name, text in docs.items()}


def estimator_parameters(cls, include: Iterable[str] | None = None,
                         exclude: Iterable[str] = ()) -> tuple[Parameter, ...]:
    """The :class:`Parameter` of each ``__init__`` argument of ``cls``: all of them, or those in
    ``include``, minus ``exclude``.

    Every parameter must be documented and constrained: a missing declaration is a
    programming error, reported when the registry loads (and by the test suite).
    """
    docs = parameter_docs(cls)
    constraints = getattr(cls, "_parameter_constraints", {})
    out = []
    for name, arg in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or arg.kind in (arg.VAR_KEYWORD, arg.VAR_POSITIONAL) \
                or name in exclude or (include is not None and name not in include):
            continue
        if name not in docs or name not in constraints:
            raise TypeError(f"{cls.__name__}.{name} needs a docstring entry and a constraint "
                            "(see featpipe.parameters)")
        default = None if arg.default is inspect.Parameter.empty else arg.default
        out.append(Parameter(name, default, tuple(constraints[name]), docs[name], owner=cls))
    return tuple(out)


def hidden_defaults(cls, names: Iterable[str]) -> dict[str, object]:
    """The ``__init__`` defaults of ``cls`` for ``names`` (those it takes): the values a
    method gives an estimator's parameters that it does not offer (``chunk_bytes``)."""
    signature = inspect.signature(cls.__init__).parameters
    return {name: signature[name].default for name in names if name in signature}


def declared(default, help: str, *, choices: Iterable[str] = (), model: Iterable[str] = ()):
    """A dataclass field declared as a parameter: its ``default``, ``help`` (one sentence),
    the ``choices`` of a text value, the ``featpipe fit`` commands making the stage a
    ``model`` parameter names; its type is the field's annotation."""
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": tuple(choices), "model": tuple(model)})


def record_parameters(cls) -> tuple[Parameter, ...]:
    """The :class:`Parameter` of each :func:`declared` field of dataclass ``cls``, in order
    (other fields are not parameters); constraints in scikit-learn's vocabulary from the
    annotation (``int | None`` -> ``(int, None)``, ``bool`` -> ``"boolean"``) or the choices."""
    hints = typing.get_type_hints(cls)
    out = []
    for field_ in dataclasses.fields(cls):
        if "help" not in field_.metadata:
            continue
        types = typing.get_args(hints[field_.name]) or (hints[field_.name],)
        if field_.metadata["choices"]:
            constraints = [DeclaredOptions(field_.metadata["choices"])]
        else:
            constraints = ["boolean" if t is bool else t for t in types if t is not type(None)]
        constraints += [None] if type(None) in types else []
        out.append(Parameter(field_.name, field_.default, tuple(constraints),
                             field_.metadata["help"], model=field_.metadata["model"]))
    return tuple(out)


def _number_types(constraints) -> set[type]:
    """The number types a declaration accepts: ``{int}``, ``{float}``, both or none (read as
    scikit-learn reads ``"random_state"``, an ``Interval`` and the types)."""
    types: set[type] = set()
    for constraint in constraints if constraints != "no_validation" else ():
        if isinstance(constraint, str):
            types |= {int} if constraint == "random_state" else set()
        elif hasattr(constraint, "closed") and hasattr(constraint, "type"):
            types.add(int if constraint.type is Integral else float)
        elif constraint in (int, Integral):
            types.add(int)
        elif constraint in (float, Real):
            types.add(float)
    return types


def _number_type_of(default) -> set[type]:
    if isinstance(default, bool) or not isinstance(default, int | float):
        return set()
    return {int} if isinstance(default, int) else {float}


def whole_number(value) -> int | None:
    """``value`` as an int when it is a whole number, else ``None``: ``20``, ``20.0`` and the
    text ``"20.0"`` are 20; ``20.5``, ``inf`` and booleans are not.  The one rule by which an
    integer parameter takes a float, on the command line (:mod:`featpipe.cli.options`), in a
    pipeline file and in the library (:func:`typed_value`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def typed_value(value, constraints=(), default=None):
    """``value`` as its declaration types it: a number is a float where the constraints
    accept floats only (``5`` -> ``5.0``), an int where they accept ints only (``20.0`` ->
    ``20``; ``20.5`` stays, for validation to refuse); without a numeric constraint the
    default's type decides.  Lists and tuples become lists, typed item by item (by the
    default's first item); NumPy scalars become Python scalars; booleans, strings and a
    parameter taking both ints and floats (an int count or a float fraction) keep theirs."""
    if hasattr(value, "item") and hasattr(value, "dtype") and not hasattr(value, "__len__"):
        value = value.item()  # a NumPy scalar
    if isinstance(value, list | tuple):
        first = default[0] if isinstance(default, list | tuple) and default else None
        return [typed_value(v, (), first) for v in value]
    types = _number_types(constraints) or _number_type_of(default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if types == {float}:
        return float(value)
    if types == {int} and isinstance(value, float):
        whole = whole_number(value)
        return value if whole is None else whole
    return value


def parameter_record(parameters: Iterable[Parameter], given: Mapping[str, object],
                     what: str = "") -> dict:
    """The canonical record of one stage's parameters (the part of its key they make).

    One entry per declared parameter, in declaration order, under the name the estimator
    gives it; the value given, else the declared default; typed by :func:`typed_value`.  The
    same computation asked for from the command line, a pipeline file or the Python API gives
    the same record.  A name that is not declared raises :class:`ParameterError` (with the
    closest declared name); ``what`` says whose parameters they are (``--method hrp``).
    Values are not validated here (the owners' checks do that).
    """
    parameters = list(parameters)
    names = [p.name for p in parameters]
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ParameterError(name, f"is not a parameter of {what or 'this stage'}{hint}")
    return {p.name: typed_value(given.get(p.name, p.default), p.constraints, p.default)
            for p in parameters}
