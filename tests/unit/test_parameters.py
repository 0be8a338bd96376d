"""Each parameter declared once (featpipe.parameters): the encode methods' options, defaults,
choices and help come from the estimators; the library names parameters, the CLI shows flags."""

from __future__ import annotations

import inspect
import re
from numbers import Integral, Real

import numpy as np
import pytest

from featpipe.encode.registry import load_methods
from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling
from featpipe.errors import ParameterError
from featpipe.flags import flag_of
from featpipe.parameters import parameter_docs
from tests.conftest import REPO


def test_every_method_parameter_comes_from_one_declaration():
    for method in load_methods().values():
        for param in method.parameters:
            assert param.help and param.constraints, (method.name, param.name)
            if param.owner is not None:  # the default is the estimator's own
                default = inspect.signature(param.owner).parameters[param.name].default
                assert param.default == default, (method.name, param.name)
                assert parameter_docs(param.owner)[param.name] == param.help
            else:
                assert param.model and param.required  # a fitted stage, named by the user


def test_defaults_and_choices_are_the_estimators():
    methods = load_methods()
    assert methods["hrp"].defaults["window"] == HierarchicalRankPooling().window == 20
    assert methods["rankpool"].defaults["psi"] == RankPooling().psi == "ssr"
    assert methods["hrp"].defaults["psi"] == HierarchicalRankPooling().psi == "ser"
    assert [p.name for p in methods["fisher"].parameters if p.required] == ["gmm"]
    assert not any(p.required for p in methods["avg"].parameters)


def test_no_library_module_builds_command_line_options():
    library = [p for p in (REPO / "featpipe").rglob("*.py") if "cli" not in p.parts]
    assert library
    for path in library:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import click|from click)", text, re.M), path
        assert "click.Option" not in text, path


def test_library_errors_name_parameters_and_the_cli_shows_flags(cli, tmp_path):
    with pytest.raises(ParameterError) as raised:
        HierarchicalRankPooling(window=0).fit([[[1.0]]])
    assert str(raised.value) == "window must be an int in the range [1, inf), got 0"
    assert raised.value.param == "window" and flag_of("window") == "--window"
    assert flag_of("random_state") == "--random-state" and flag_of("emit_layer") == "--emit-layer"
    result = cli("encode", "--store", tmp_path, "--input", "x", "--method", "avg",
                 "--window", "5")
    assert result.exit_code == 2 and "error: --window does not apply to method avg" \
        in result.stderr
    result = cli("fit", "gmsop", "--store", tmp_path, "--input", "x", "--components", "2",
                 "--top-k", "3")
    assert result.exit_code == 2
    assert "error: --top-k must lie in 1..n_components (2), got 3" in result.stderr


# -- the parameter table: featpipe encode runs the functional cores without the estimators --


def test_the_parameter_table_is_current():
    """featpipe/encode/methods.json is what the estimators declare now (rewrite it with
    `python -m featpipe.cli.options`)."""
    import json

    from featpipe.encode.registry import TABLE_PATH, table_entries

    assert json.loads(TABLE_PATH.read_text(encoding="utf-8")) == \
        json.loads(json.dumps(table_entries())), "run `python -m featpipe.cli.options`"


#: values for the table's records and the estimators' to check and type alike
_GIVEN = [{}, {"window": 0}, {"window": 20.0}, {"window": 2.5}, {"window": True},
          {"stride": np.int64(2)}, {"C": 5}, {"C": 0}, {"C": "x"}, {"C": float("nan")},
          {"epsilon": 0}, {"epsilon": -1.0}, {"psi": "bad"}, {"psi": "ssr"},
          {"depth": 2, "emit_layer": 3}, {"depth": 3, "emit_layer": 2}, {"emit_layer": None},
          {"directions": "both"}, {"solver": "liblinear"}, {"pool": "max"}, {"pool": 1},
          {"device": "gpu"}, {"device": "cuda"}, {"windw": 3}]


@pytest.mark.parametrize("name", ["avg", "max", "tpyramid", "arp", "rankpool", "hrp",
                                  "recursive"])
def test_a_table_method_checks_and_types_values_as_its_estimator(name, monkeypatch):
    """load_method (the table's records, featpipe's own checks, no scikit-learn) and
    load_methods (the estimators' declarations, scikit-learn's constraints) give the same
    canonical record or the same ParameterError for every value."""
    from featpipe.encode.registry import FUNCTION_MODULES, load_method
    from featpipe.stages.encoding import method_record

    monkeypatch.delenv("FEATPIPE_ENCODERS", raising=False)
    assert name in FUNCTION_MODULES["featpipe.encode.functional.temporal"]
    table, declared = load_method(name), load_methods()[name]
    assert all(p.owner is None for p in table.parameters)  # no estimator behind them
    assert all(p.owner is not None for p in declared.parameters)
    assert (table.summary, table.defaults, dict(table.fixed)) == \
        (declared.summary, declared.defaults, dict(declared.fixed))
    for given in _GIVEN:
        given = {k: v for k, v in given.items() if k in declared.defaults or k == "windw"}
        outcomes = []
        for method in (table, declared):
            try:
                outcomes.append(method_record(method, given))
            except ParameterError as err:
                outcomes.append((err.param, str(err)))
        assert outcomes[0] == outcomes[1], (name, given)
        if isinstance(outcomes[0], dict):
            assert [type(v) for v in outcomes[0].values()] == \
                [type(v) for v in outcomes[1].values()]


def test_declared_constraints_read_as_scikit_learn_reads_them():
    """featpipe's reading of a table constraint (DeclaredInterval, DeclaredOptions, types,
    None, "boolean") accepts, refuses and describes every value as scikit-learn's own
    classes do."""
    from numbers import Integral, Real

    from sklearn.utils._param_validation import Interval, StrOptions, make_constraint

    from featpipe.parameters import (
        check_value,
        constraint_from_json,
        constraint_json,
        describe,
    )

    declared = [Interval(Integral, 1, None, closed="left"),
                Interval(Real, 0, None, closed="neither"), Interval(Real, 0, 1, closed="both"),
                Interval(Integral, None, 4, closed="right"),
                Interval(Real, -1.5, 2, closed="left"), Interval(Real, None, None, closed="both"),
                StrOptions({"a", "b"}), None, "boolean", int, float, str]
    values = [-2, -1, 0, 1, 2, 4, 5, 0.0, 0.5, 1.0, 2.5, -1.5, float("nan"), float("inf"),
              -float("inf"), "a", "c", None, True, False, np.int64(3), np.float32(0.5),
              np.bool_(True), [1]]
    for constraint in declared:
        read = constraint_from_json(constraint_json(constraint))
        made = make_constraint(constraint)
        if hasattr(made, "closed") or hasattr(made, "options"):
            assert describe(read) == describe(made), constraint
        takes_bool = constraint == "boolean" or constraint is bool
        for value in values:
            try:
                check_value("p", value, [read])
                ours = "ok"
            except ParameterError as err:
                ours = str(err)
            # scikit-learn's test and words (a bool is a number only where declared boolean)
            accepted = (takes_bool or not isinstance(value, bool)) and made.is_satisfied_by(value)
            assert ours == ("ok" if accepted else f"p must be {describe(made)}, got {value!r}"), \
                (constraint, value)


def test_an_unreadable_constraint_has_no_table_form():
    from sklearn.utils._param_validation import HasMethods

    from featpipe.parameters import constraint_json

    with pytest.raises(TypeError, match="no form in the parameter table"):
        constraint_json(HasMethods(["fit"]))


def test_a_parameter_whose_default_is_none_is_typed_by_its_declaration():
    """``contrast_threshold`` (default None) takes floats: 2 and 2.0 are one record, one key;
    ``max_pixels`` (default None) takes ints: 100.0 is 100 (issue 31 §4)."""
    from featpipe.extract.dsift import DenseSIFT
    from featpipe.parameters import estimator_parameters, parameter_record

    params = estimator_parameters(DenseSIFT)
    as_int = parameter_record(params, {"contrast_threshold": 2, "max_pixels": 100.0})
    as_float = parameter_record(params, {"contrast_threshold": 2.0, "max_pixels": 100})
    assert as_int == as_float
    assert repr(as_int["contrast_threshold"]) == "2.0" and repr(as_int["max_pixels"]) == "100"
    assert parameter_record(params, {})["contrast_threshold"] is None


def test_typed_value_follows_the_declaration_then_the_default():
    import numpy as np
    from sklearn.utils._param_validation import Interval

    from featpipe.parameters import typed_value

    assert repr(typed_value(5, (float,))) == "5.0"
    assert repr(typed_value(20.0, [Interval(Integral, 1, None, closed="left")])) == "20"
    assert repr(typed_value(5, [Interval(Real, 0, None, closed="left"), None])) == "5.0"
    assert repr(typed_value(3, (), 1.5)) == "3.0" and repr(typed_value(3.0, (), 1)) == "3"
    assert repr(typed_value(3.0, (int, float))) == "3.0"  # both taken: kept as given
    assert repr(typed_value(3, "no_validation", 0.5)) == "3.0"
    assert repr(typed_value(np.float32(2.5), (float,))) == "2.5"
    assert repr(typed_value(np.int64(4), (), 1.0)) == "4.0"
    assert typed_value((8, 16.0), (), (4,)) == [8, 16] and typed_value([], (), ()) == []
    assert typed_value([1, 2], (), []) == [1, 2]
    assert typed_value(False, (int,)) is False and typed_value("ssr", (str,)) == "ssr"
    assert typed_value(True, (float,)) is True and typed_value(False, (), 0.5) is False
    assert repr(typed_value(7, ["random_state"])) == "7"


def test_a_record_fills_defaults_in_declaration_order_and_refuses_strangers():
    from featpipe.encode.temporal import HierarchicalRankPooling
    from featpipe.parameters import estimator_parameters, parameter_record

    params = estimator_parameters(HierarchicalRankPooling)
    record = parameter_record(params, {"window": 10.0})
    assert list(record) == [p.name for p in params]
    assert repr(record["window"]) == "10"
    with pytest.raises(ParameterError, match=r"^windw is not a parameter of --method hrp "
                       r"\(did you mean window\?\)$"):
        parameter_record(params, {"windw": 3}, "--method hrp")
    with pytest.raises(ParameterError, match=r"^zzz is not a parameter of this stage$"):
        parameter_record(params, {"zzz": 3})


def test_check_value_takes_a_bool_only_where_one_is_declared():
    from sklearn.utils._param_validation import Interval, StrOptions

    from featpipe.parameters import check_params, check_value

    ints = [Interval(Integral, 1, None, closed="left")]
    check_value("stride", 3, ints)
    for bad in (True, 0, "3"):
        with pytest.raises(ParameterError, match=r"^stride must be an int in the range "
                           r"\[1, inf\), got "):
            check_value("stride", bad, ints)
    check_value("flag", True, ["boolean"])
    check_value("flag", False, [bool])
    check_value("anything", object(), "no_validation")
    with pytest.raises(ParameterError, match=r"^psi must be one of a, b or None, got 'c'$"):
        check_value("psi", "c", [StrOptions({"b", "a"}), None])
    check_params({"stride": ints}, {"stride": 2, "undeclared": True})
    with pytest.raises(ParameterError, match="stride"):
        check_params({"stride": ints}, {"undeclared": 1, "stride": 0})


def test_check_parameter_values_asks_for_required_models_and_each_owners_rules():
    from featpipe.encode.registry import load_methods
    from featpipe.parameters import Parameter, check_parameter_values

    fisher = load_methods()["fisher"].parameters
    for missing in (None, ""):
        with pytest.raises(ParameterError, match=r"^gmm is required by --method fisher: the "
                           r"name of a model stage made by `featpipe fit gmm` or "):
            check_parameter_values(fisher, {"gmm": missing}, "--method fisher")
    hrp = load_methods()["hrp"].parameters
    defaults = {p.name: p.default for p in hrp}
    check_parameter_values(hrp, {**defaults, "window": 5}, "--method hrp")
    with pytest.raises(ParameterError, match="window must be"):
        check_parameter_values(hrp, {**defaults, "window": 0}, "--method hrp")
    with pytest.raises(ParameterError, match="emit_layer"):  # a rule between two parameters
        check_parameter_values(hrp, {**defaults, "depth": 2, "emit_layer": 3}, "--method hrp")
    own = Parameter("k", 1, (int,), "a count")
    with pytest.raises(AttributeError):  # a declaration is never changed in place
        own.default = 2
    check_parameter_values([own], {"k": 2}, "x")
    with pytest.raises(ParameterError, match="^k must be"):
        check_parameter_values([own], {"k": "two"}, "x")


def test_record_parameters_of_a_dataclass_follow_its_annotations():
    from featpipe.extract.settings import ExtractSettings
    from featpipe.io.video import Sampling
    from featpipe.parameters import DeclaredOptions, record_parameters

    sampling = {p.name: p for p in record_parameters(Sampling)}
    assert list(sampling) == ["fps", "every", "frames"]
    assert sampling["fps"].constraints == (float, None) and sampling["fps"].default is None
    assert sampling["every"].constraints == (int, None)
    assert sampling["every"].help == "Keep every N-th frame (1: all)."
    settings = {p.name: p for p in record_parameters(ExtractSettings)}
    assert "encode_params" not in settings  # a field, not a declared parameter
    assert settings["positions"].constraints == ("boolean",)
    (dtype,) = settings["dtype"].constraints
    assert isinstance(dtype, DeclaredOptions) and dtype.options == {"float32", "float16"}
    assert settings["pca"].constraints == (str, None) and settings["pca"].model


def test_docstring_sections_give_each_parameter_its_help():
    from featpipe.parameters import ValidatedEstimator, estimator_parameters

    class Base(ValidatedEstimator):
        """A base.

        Parameters
        ----------
        shared : int
            Documented once,
            on two lines.
        """

    class Child(Base):
        """A child.

        Parameters
        ----------
        a, b : float
            Two at once.
        c : str
            The last.

        Returns
        -------
        c : never a parameter
            Not this one.
        """

        _parameter_constraints = {"a": [float], "b": [float], "c": [str], "shared": [int]}

        def __init__(self, a=1.0, b=2.0, c="x", shared=3, *args, **kwargs):
            pass

    assert parameter_docs(Child) == {"shared": "Documented once, on two lines.",
                                     "a": "Two at once.", "b": "Two at once.", "c": "The last."}
    params = estimator_parameters(Child, exclude=("b",))
    assert [(p.name, p.default, p.owner) for p in params] == [
        ("a", 1.0, Child), ("c", "x", Child), ("shared", 3, Child)]
    assert [p.name for p in estimator_parameters(Child, include=("c",))] == ["c"]
    Child._parameter_constraints = {"a": [float]}
    with pytest.raises(TypeError, match=r"Child.b needs a docstring entry and a constraint"):
        estimator_parameters(Child)
    assert parameter_docs(type("Bare", (), {"__doc__": "No sections."})) == {}


def test_a_declared_estimator_keeps_scikit_learns_parameter_contract():
    """:class:`DeclaredEstimator` (the feature methods' base, which must not import
    scikit-learn) answers get_params, set_params, repr and clone as ``BaseEstimator`` does."""
    from sklearn.base import BaseEstimator, clone

    from featpipe.parameters import DeclaredEstimator

    def init(self, step=5, sizes=(4, 6), flow="farneback", weights=None):
        self.step, self.sizes, self.flow, self.weights = step, sizes, flow, weights

    ours = type("Tracks", (DeclaredEstimator,), {"__init__": init})
    theirs = type("Tracks", (BaseEstimator,), {"__init__": init})
    for given in ({}, {"flow": "dis"}, {"step": 5.0, "sizes": [4, 6]}, {"weights": "w.pth"}):
        a, b = ours(**given), theirs(**given)
        assert a.get_params() == b.get_params() == a.get_params(deep=False)
        assert repr(a) == repr(b)
        copy = clone(a)
        assert type(copy) is ours and copy.get_params() == a.get_params() and copy is not a
    assert ours().set_params(step=3, flow="dis").get_params() == \
        theirs().set_params(step=3, flow="dis").get_params()
    for estimator in (ours(), theirs()):
        with pytest.raises(ValueError, match="Invalid parameter 'stride'"):
            estimator.set_params(stride=2)
