"""Help that fits (issues 40, 49): ``--help`` lists the methods and every shared option under
headings, in 80 columns; ``--features M --help`` / ``--method M --help`` lead with that
method's options (its own help and default), then the other options' flags under the same
headings, in at most 60 lines; no option shows two defaults.  And "did you mean" wherever a
name or a choice is refused on the command line."""

import re
from pathlib import Path

import pytest

from featpipe.suggest import close_match, did_you_mean
from tests.conftest import REPO

FEATURES = ("vgg16-fc6", "vgg16-conv5_3", "dsift", "dt", "idt")


#: the headings of extract's options, in order (encode has the first and the last two)
HEADINGS = ("Input and output", "Frame sampling", "Extraction", "Pooling over time", "Run",
            "Output and help")


def _options(output: str) -> list[str]:
    """The flags listed with their help (each option's first flag), under any heading."""
    return re.findall(r"^  (?:-\w, )?(--[\w-]+)", output, re.M)


def _help_of(output: str, flag: str) -> str:
    """The help text of ``flag`` in ``output``, on one line."""
    found = re.search(rf"^  (?:-\w, )?{flag}\b(.*?)(?=^  -|^\S|\Z)", output, re.M | re.S)
    return " ".join(found.group(1).split())


def _compact(output: str) -> dict[str, list[str]]:
    """A method's help after its options: heading -> the flags listed under it."""
    found = {}
    for block in re.findall(r"^([A-Z][\w ,]+): (.*?)(?=^\S|\Z)", output, re.M | re.S):
        found[block[0]] = block[1].split()
    return found


def test_plain_help_lists_the_methods_and_every_shared_option_under_headings(cli):
    extract = cli("extract", "--help").output
    for name in FEATURES:
        assert re.search(rf"^  {re.escape(name)} +\S", extract, re.M), name
    shown = _options(extract)
    assert {"--manifest", "--features", "--fps", "--jobs", "--encode", "--temporal",
            "--temporal-param", "--temporal-groups", "--keep-frames"} <= set(shown)
    assert not {"--step", "--keypoints", "--weights", "--gmm", "--window"} & set(shown)
    headings = [line[:-1] for line in extract.splitlines() if line.endswith(":")
                and not line.startswith(" ")]
    assert headings == ["Methods", *HEADINGS]
    assert _help_of(extract, "--keep-frames") == "Write the per-frame stage too (named " \
        "NAME-frames)."
    assert len(extract.splitlines()) < 110  # 202 lines before issue 40, 88 before issue 49
    assert max(len(line) for line in extract.splitlines()) <= 80  # 135 before issue 49
    encode = cli("encode", "--help").output
    for name in ("avg", "hrp", "rankpool", "fisher", "gmsop"):
        assert re.search(rf"^  {name} +\S", encode, re.M), name
    assert not {"--window", "--psi", "--gmm", "--grid"} & set(_options(encode))
    assert len(encode.splitlines()) < 60  # 135 lines before
    assert max(len(line) for line in encode.splitlines()) <= 80
    assert "featpipe encode -m METHOD --help" in " ".join(encode.split())


def _every_method(command: str) -> list[str]:
    from featpipe.cli.options import table_entry

    entry = table_entry(command)
    return [name for name, _ in entry["features" if command == "extract" else "methods"]]


@pytest.mark.parametrize("command, selector", [("extract", "-f"), ("encode", "-m")])
def test_every_methods_help_leads_with_its_options_then_the_headings_in_60_lines(
        cli, command, selector):
    for method in _every_method(command):
        output = cli(command, selector, method, "--help").output
        lines = output.splitlines()
        assert len(lines) <= 60, (method, len(lines))  # extract -f idt: 124 before
        assert max(len(line) for line in lines) <= 80, method
        flag = "--features" if command == "extract" else "--method"
        first = next(n for n, line in enumerate(lines) if line.endswith(":")
                     and not line.startswith(" "))
        assert lines[first] == f"Options of {flag} {method}:", method
        compact = _compact(output[output.index(lines[first]):])
        expected = HEADINGS if command == "extract" else (HEADINGS[0], *HEADINGS[-2:])
        assert tuple(compact) == expected, method
        assert "--jobs" in compact["Run"] and "--help" in compact["Output and help"]
        if command == "extract":
            assert compact["Frame sampling"] == ["--fps", "--every", "--frames"]
            assert "--temporal-param" in compact["Pooling over time"]
        assert f"(each described by featpipe {command} --help)" in output


def test_a_methods_help_adds_its_options_with_its_own_defaults(cli):
    idt = cli("extract", "--features", "idt", "--help").output
    shown = set(_options(idt))
    assert {"--step", "--keypoints", "--flow"} <= shown
    assert not {"--magnif", "--weights", "--gmm", "--jobs", "--fps"} & shown  # flags only
    assert _help_of(idt, "--step").endswith("(the release's -W: 5). [5]")
    dsift = cli("extract", "-f", "dsift", "--encode", "fisher", "--help").output
    assert _help_of(dsift, "--step").endswith("[2]")
    assert {"--magnif", "--gmm", "--per-frame"} <= set(_options(dsift))
    assert dsift.index("Options of --features dsift:") < \
        dsift.index("Options of --encode fisher:") < dsift.index("Input and output:")
    assert "--dim" not in _options(dsift)  # cbp-ts's, not fisher's
    assert "--gmm" in _options(cli("extract", "-fdsift", "--encode=fisher", "--help").output)
    hrp = cli("encode", "--method", "hrp", "--help").output
    assert _help_of(hrp, "--window").endswith("[20]")
    assert _help_of(hrp, "--psi").endswith("[ser]")
    rankpool = cli("encode", "-m", "rankpool", "--help").output
    assert _help_of(rankpool, "--psi").endswith("[ssr]") and "--window" not in \
        _options(rankpool)
    fisher = cli("encode", "-m", "fisher", "--help").output
    assert _help_of(fisher, "--gmm") == ("NAME GMM model stage. Made by `featpipe fit gmm`, "
                                         "`featpipe fit deep-gmm`.")


def test_every_option_of_every_help_shows_one_default():
    """docs/cli.md is every command's help and every method's options (generated, checked by
    tests/cli/test_docs.py): no description holds defaults per method (``[a: 2; b: 5]``)."""
    reference = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([^`]+)` \| (.*) \|$", reference, re.M)
    assert len(rows) > 150
    for flags, text in rows:
        assert not re.search(r"\[(?!default: )[^\]]*\w: [^\]]*;", text), (flags, text)
        assert len(re.findall(r"\[default: ", text)) <= 1, (flags, text)
    assert "### `featpipe extract --features idt`" in reference
    assert "### `featpipe encode --method hrp`" in reference


def test_close_match_and_did_you_mean():
    assert close_match("hrpp", ["avg", "hrp", "rankpool"]) == "hrp"
    assert close_match("acc", ["accuracy", "map"]) == "accuracy"  # the only one it starts
    assert close_match("zzz", ["avg", "hrp"]) is None
    assert did_you_mean("gird", ["grid", "hrp"]) == "did you mean 'grid'?"
    assert did_you_mean("q", ["avg"]) == ""


@pytest.mark.parametrize("args, hint", [
    (["encod"], "Did you mean 'encode'?"),
    (["fit", "gmmm"], "Did you mean 'gmm'?"),
    (["cache", "lss"], "Did you mean 'ls'?"),
    (["encode", "-s", "S", "-i", "x", "-m", "hrpp"], "Did you mean 'hrp'?"),
    (["classify", "-s", "S", "-i", "x", "--kernel", "chi2ser"], "Did you mean 'chi2+ser'?"),
    (["classify", "-s", "S", "-i", "x", "--metric", "acc"], "Did you mean 'accuracy'?"),
    (["extract", "-m", "m.csv", "-s", "S", "-f", "dsfit"], "Did you mean 'dsift'?"),
    (["example", "pipeline", "walkthru"], "Did you mean 'walkthrough'?"),
])
def test_a_mistyped_command_or_choice_is_answered_with_the_closest(cli, args, hint):
    result = cli(*args)
    assert result.exit_code == 2
    assert result.stderr.rstrip().endswith(hint), result.stderr
    assert result.stderr.count("Did you mean") == 1


def test_a_mistyped_stage_step_or_split_format_is_answered_with_the_closest(tmp_path, cli):
    aeon = pytest.importorskip("aeon")
    data = Path(aeon.__file__).parent / "datasets" / "data" / "BasicMotions"
    store = tmp_path / "store"
    cli("import", "--from", data / "BasicMotions_TRAIN.ts", "--store", store, "--name", "seqs",
        check=True)
    one = cli("encode", "-s", store, "-i", "sqs", "-m", "avg", "-n", "a")
    assert one.exit_code == 1
    assert f"error: no stage named 'sqs' in store {store}: did you mean 'seqs'?" in one.stderr
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(cli("example", "pipeline").output, encoding="utf-8")
    step = cli("run", pipeline, "--store", store, "--step", "sfit", "--dry-run")
    assert step.exit_code == 2 and "no step 'sfit' in" in step.stderr and \
        "did you mean 'sift'?" in step.stderr
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "a.mp4").write_bytes(b"")
    split = cli("manifest", "build", tmp_path / "v", "-o", tmp_path / "m.csv", "--splits",
                f"ucf10:{tmp_path}")
    assert split.exit_code == 1 and "unknown split format 'ucf10'; did you mean 'ucf101'?" \
        in split.stderr
