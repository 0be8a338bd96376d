"""Each parameter declared once (featpipe.parameters): the encode methods' options, defaults,
choices and help come from the estimators; the library names parameters, the CLI shows flags."""

from __future__ import annotations

import inspect
import re
from numbers import Integral, Real

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


def test_encode_help_lists_each_default_once(cli):
    text = " ".join(cli("encode", "--help").output.split())
    assert "--window INTEGER Window length M of each sliding-window layer" in text
    assert "(hrp) [20]" in text
    assert "[rankpool: ssr; hrp, recursive: ser]" in text
    assert "--gmm NAME GMM model stage. Made by `featpipe fit gmm`, `featpipe fit deep-gmm`" \
        in text
    assert "--per-frame / --per-item" in text and "--random-state, --seed INTEGER" in text


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
