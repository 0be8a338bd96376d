"""Each parameter declared once (featpipe.parameters): the encode methods' options, defaults,
choices and help come from the estimators; the library names parameters, the CLI shows flags."""

from __future__ import annotations

import inspect
import re

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
