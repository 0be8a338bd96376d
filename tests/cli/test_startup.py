"""The command line starts at once: ``--help`` of every command imports no heavy stack.

scikit-learn alone takes 1.5-2 s to import here (it brings SciPy, pandas and joblib), so the
help of a command must not read the estimators: what it shows comes from the precomputed
table ``featpipe/cli/options.json`` (:mod:`featpipe.cli.options`), which must equal what the
estimators declare now.  Time is measured by ``benchmarks/bench_startup.py``, not here.
"""

import json
import subprocess
import sys

import click
import pytest

from featpipe.cli import COMMANDS, cli
from featpipe.cli.options import TABLE_PATH, TABLE_SOURCES, live_entry

#: packages a command's --help must not import (numpy is allowed)
HEAVY = ("sklearn", "scipy", "pandas", "torch", "cv2", "joblib", "h5py", "dask",
         "distributed", "matplotlib", "aeon")


def _command_paths() -> list[list[str]]:
    """Every command and subcommand, as argument lists (``["fit", "gmm"]``)."""
    paths = []
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        paths.append([name])
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            paths += [[name, sub] for sub in command.list_commands(ctx)]
    return paths


PROBE = """
import json, sys
from featpipe.cli import cli
found = {}
for path in json.loads(sys.argv[1]):
    before = set(sys.modules)
    try:
        cli.main(args=[*path, "--help"], prog_name="featpipe", standalone_mode=False)
    except SystemExit:
        pass
    new = {m.split(".")[0] for m in set(sys.modules) - before}
    found[" ".join(path) or "featpipe"] = sorted(new & set(json.loads(sys.argv[2])))
print(json.dumps(found))
"""


def test_help_of_every_command_imports_no_heavy_stack():
    paths = [[]] + _command_paths()
    assert ["fit", "gmm"] in paths and ["encode"] in paths and len(paths) > 15
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(paths), json.dumps(HEAVY)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    found = json.loads(out.splitlines()[-1])
    assert len(found) == len(paths)
    assert {k: v for k, v in found.items() if v} == {}


def test_featpipe_help_imports_not_even_numpy():
    code = ("import sys\nfrom featpipe.cli import cli\ntry:\n    cli.main(args=['--help'], "
            "prog_name='featpipe', standalone_mode=False)\nexcept SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'click'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.splitlines()[-1] == "['click']"


@pytest.mark.parametrize("key", sorted(TABLE_SOURCES))
def test_the_precomputed_option_table_is_current(key):
    table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    assert set(table) == set(TABLE_SOURCES)
    assert table[key] == live_entry(key), (
        f"featpipe/cli/options.json is stale for {key!r}: run `python -m featpipe.cli.options`")


def test_listed_short_helps_are_what_click_would_show():
    ctx = click.Context(cli)
    table = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        for limit in (20, 45, 74, 200):
            listed = click.Command(name, help=table["commands"][name])
            assert listed.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_generated_options_parse_as_before():
    """The table's specs give the same click options as the declarations (a type, a flag
    pair and a model metavar spot-checked)."""
    from featpipe.cli.encode import encode
    from featpipe.cli.fit_gmm import fit_gmm

    options = {p.name: p for p in encode.params}
    assert options["window"].type is click.INT and options["window"].default is None
    assert options["per_frame"].opts == ["--per-frame"] and \
        options["per_frame"].secondary_opts == ["--per-item"]
    assert options["gmm"].metavar == "NAME"
    gmm = {p.name: p for p in fit_gmm.params}
    assert gmm["n_components"].opts == ["--n-components", "--components"] and \
        gmm["n_components"].default == 256
