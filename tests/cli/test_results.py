"""`featpipe results` (issue 49.2): the classify results of a store or a pipeline file as one
table; its columns and values against the reports classify wrote for the same runs; sorting;
CSV and Markdown; the plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import invoke_cli, one_line_error

aeon = pytest.importorskip("aeon")
DATA = Path(aeon.__file__).parent / "datasets" / "data" / "BasicMotions"
#: (encoder, C) of each classify run on BasicMotions
RUNS = [("avg", 1.0), ("avg", 10.0), ("max", 1.0), ("rankpool", 1.0)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A store with BasicMotions (80 series) pooled by avg, max and rankpool, classified as
    :data:`RUNS` with a report each; returns (folder, store, {run: report})."""
    root = tmp_path_factory.mktemp("results")
    store = root / "S"
    invoke_cli("import", "--from", DATA / "BasicMotions_TRAIN.ts", "--from",
               DATA / "BasicMotions_TEST.ts", "-s", store, "--name", "bm", check=True)
    for method in sorted({m for m, _ in RUNS}):
        invoke_cli("encode", "-s", store, "-i", "bm", "-m", method, "-n", f"bm-{method}",
                   check=True)
    reports = {}
    for method, C in RUNS:
        path = root / f"{method}-{C:g}.json"
        invoke_cli("classify", "-s", store, "-i", f"bm-{method}", "--C", C, "--report", path,
                   check=True)
        reports[method, C] = json.loads(path.read_text(encoding="utf-8"))
    return root, store, reports


def _rows(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_columns_are_the_parameters_that_differ_and_the_numbers_the_reports(runs, cli):
    root, store, reports = runs
    result = cli("results", "-s", store, "-o", root / "t.csv", "-o", root / "t.md",
                 check=True)
    rows = _rows(root / "t.csv")
    # encode and C differ; the kernel, normalisation, rankpool's own parameters (one
    # result has them) and the import do not
    assert list(rows[0]) == ["result", "inputs", "encode", "C", "metric", "split1", "mean",
                             "std"]
    assert len(rows) == len(RUNS)
    for row in rows:
        report = reports[row["encode"], float(row["C"])]
        assert row["result"] == f"classify-{report['config']['key']}"
        assert row["inputs"] == f"bm-{row['encode']}"
        assert row["metric"] == report["summary"]["metric"] == "accuracy"
        assert float(row["split1"]) == report["splits"][0]["score"]
        assert float(row["mean"]) == report["summary"]["mean"]
        assert float(row["std"]) == report["summary"]["std"]
        chain = [e for e in report["inputs_chain"] if e["kind"] == "encode"]
        assert chain[0]["params"]["method"] == row["encode"]
    # default order: by the parameter columns (encode, then C as a number)
    assert [(r["encode"], float(r["C"])) for r in rows] == sorted(RUNS)
    markdown = (root / "t.md").read_text(encoding="utf-8")
    assert result.stdout == markdown
    lines = markdown.splitlines()
    assert lines[0] == "| result | inputs | encode | C | metric | split1 | mean ± std |"
    avg10 = reports["avg", 10.0]["summary"]
    assert any(f"| avg | 10 | accuracy | {avg10['mean']:.4f} | {avg10['mean']:.4f} ± "
               f"{avg10['std']:.4f} |" in line for line in lines[2:])


def test_sorting_by_a_score_puts_the_best_first_and_reverse_turns_it(runs, cli):
    root, store, _ = runs
    cli("results", "-s", store, "--sort", "mean", "--sort", "C", "-o", root / "best.csv",
        check=True)
    rows = _rows(root / "best.csv")
    means = [float(r["mean"]) for r in rows]
    assert means == sorted(means, reverse=True) and len(set(means)) > 1
    cli("results", "-s", store, "--sort", "C", "--reverse", "-o", root / "c.csv", check=True)
    assert [float(r["C"]) for r in _rows(root / "c.csv")][0] == 10.0
    bad = cli("results", "-s", store, "--sort", "men")
    assert "--sort 'men' is not a column of this table (did you mean 'mean'?)" in \
        one_line_error(bad, 2)


def test_the_plot_has_a_line_per_value_of_by_and_loads(runs, cli):
    import matplotlib.image

    root, store, _ = runs
    result = cli("results", "-s", store, "-o", root / "p.csv", "--plot", "C", "--by",
                 "encode", check=True)
    png = root / "p.C.png"
    assert f"wrote {png} (3 line(s))" in result.stderr
    image = matplotlib.image.imread(png)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # not a blank canvas
    assert "--plot needs -o" in cli("results", "-s", store, "--plot", "C").stderr
    assert "--plot 'window' is not a column" in one_line_error(
        cli("results", "-s", store, "-o", root / "q.csv", "--plot", "window"), 2)
    assert not (root / "q.csv").exists()  # nothing written before the columns are checked


def test_a_pipeline_files_results_are_its_classify_steps(tmp_path, monkeypatch, cli):
    (tmp_path / "p.toml").write_text(f"""
[pipeline]
store = "P"

[steps.bm]
stage = "import_features"
sources = ["{DATA / 'BasicMotions_TRAIN.ts'}", "{DATA / 'BasicMotions_TEST.ts'}"]

[steps.avg]
stage = "encode"
input = "bm"
method = "avg"

[steps.max]
stage = "encode"
input = "bm"
method = "max"

[steps.avg-result]
stage = "classify"
inputs = ["avg"]
C = [1.0]

[steps.max-result]
stage = "classify"
inputs = ["max"]
C = [1.0]
""", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    cli("run", "p.toml", "--step", "bm", "--step", "avg", "--step", "avg-result", check=True)
    waiting = cli("results", "p.toml", check=True)
    assert "step 'max-result': no result in store P yet (featpipe run p.toml computes it)" \
        in waiting.stderr
    assert waiting.stdout.count("| avg | accuracy |") == 1  # one result: no parameter column
    cli("run", "p.toml", check=True)
    cli("encode", "-s", "P", "-i", "bm", "-m", "rankpool", "-n", "rp", check=True)
    cli("classify", "-s", "P", "-i", "rp", check=True)  # not a step of the file
    cli("results", "p.toml", "-o", "t.csv", check=True)
    rows = _rows(tmp_path / "t.csv")
    assert [(r["inputs"], r["encode"]) for r in rows] == [("avg", "avg"), ("max", "max")]
    assert len(_rows_of_store(cli, tmp_path)) == 3
    # a result whose input stage is gone keeps its row, with classify's parameters only
    import shutil

    from featpipe.store import Store

    shutil.rmtree(Store(tmp_path / "P").resolve("rp").path)
    gone = cli("results", "-s", "P", check=True)
    assert "result classify-" in gone.stderr and "its inputs cannot be read" in gone.stderr
    assert len(_rows_of_store(cli, tmp_path)) == 3


def _rows_of_store(cli, folder) -> list[dict]:
    cli("results", "-s", folder / "P", "-o", folder / "all.csv", check=True)
    return _rows(folder / "all.csv")


def test_no_results_and_bad_outputs_are_one_line(tmp_path, runs, cli):
    _, store, _ = runs
    empty = tmp_path / "E"
    cli("import", "--from", DATA / "BasicMotions_TRAIN.ts", "-s", empty, "--name", "bm",
        check=True)
    assert "no classify results for store" in one_line_error(cli("results", "-s", empty))
    assert "use .csv or .md" in one_line_error(
        cli("results", "-s", store, "-o", tmp_path / "t.txt"), 2)
    assert "no store" in cli("results").stderr


def _result(label, params, scores, mean, std, inputs=("x",)):
    from featpipe.results import Result

    return Result(None, label, list(inputs), params, "accuracy", scores, mean, std)


#: four results: encode and C differ, hrp.window is had by two, avg.x by one, kernel by all
RESULTS = [
    ("r1", {"encode": "avg", "C": 10.0, "kernel": "linear", "avg.x": 1}, {1: 0.5, 2: 0.7},
     0.6, 0.1),
    ("r2", {"encode": "hrp", "hrp.window": 20, "C": 2.0, "kernel": "linear"}, {1: 0.9, 2: 0.8},
     0.85, 0.05),
    ("r3", {"encode": "hrp", "hrp.window": 5, "C": 2.0, "kernel": "linear"}, {1: 0.25}, 0.25,
     0.0, ("a", "b|c")),
    ("r4", {"encode": "avg", "C": 2.0, "kernel": "linear"}, {1: 0.6, 2: 0.6}, 0.6, 0.0)]


def test_a_table_of_results_worked_by_hand():
    """make_table, sort_rows, markdown and CSV on four results made here: the columns that
    differ among the results having them, rows by those columns (numbers as numbers, before
    any other value, a missing value last in either order), scores best first, ties by the
    next column."""
    from featpipe.results import _sort_value, csv_text, make_table, markdown, sort_rows

    table = make_table([_result(*r) for r in RESULTS])
    assert table.parameters == ["encode", "C", "hrp.window"]
    assert table.columns == ["result", "inputs", "encode", "C", "hrp.window", "metric",
                             "split1", "split2", "mean", "std"]
    assert [r["result"] for r in table.rows] == ["r4", "r1", "r3", "r2"]
    assert table.rows[2] == {"result": "r3", "inputs": "a+b|c", "encode": "hrp", "C": 2.0,
                             "hrp.window": 5, "metric": "accuracy", "split1": 0.25,
                             "mean": 0.25, "std": 0.0}
    order = {(cols, rev): [r["result"] for r in sort_rows(table, cols, rev).rows]
             for cols, rev in [(("mean", "C"), False), (("mean", "C"), True),
                               (("hrp.window",), False), (("hrp.window",), True)]}
    assert order == {(("mean", "C"), False): ["r2", "r4", "r1", "r3"],
                     (("mean", "C"), True): ["r3", "r1", "r4", "r2"],
                     (("hrp.window",), False): ["r3", "r2", "r4", "r1"],
                     (("hrp.window",), True): ["r2", "r3", "r4", "r1"]}
    # a column of numbers and other values: the numbers first, the others by their cell text
    # (a boolean is no number here)
    mixed = ["auto", 2, True, None, 1.5, False, [1, 2]]
    assert sorted(mixed, key=_sort_value) == [1.5, 2, [1, 2], "auto", False, None, True]
    assert sorted(mixed, key=lambda v: _sort_value(v, descending=True))[:2] == [2, 1.5]
    with pytest.raises(Exception, match="'widow' is not a column of this table .did you mean "
                       "'hrp.window'.*; columns: result, inputs, encode"):
        sort_rows(table, ["widow"])
    assert markdown(table) == (
        "| result | inputs | encode | C | hrp.window | metric | split1 | split2 | mean ± std |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        "| r4 | x | avg | 2 |  | accuracy | 0.6000 | 0.6000 | 0.6000 ± 0.0000 |\n"
        "| r1 | x | avg | 10 |  | accuracy | 0.5000 | 0.7000 | 0.6000 ± 0.1000 |\n"
        "| r3 | a+b\\|c | hrp | 2 | 5 | accuracy | 0.2500 |  | 0.2500 ± 0.0000 |\n"
        "| r2 | x | hrp | 2 | 20 | accuracy | 0.9000 | 0.8000 | 0.8500 ± 0.0500 |\n")
    assert csv_text(table) == (
        "result,inputs,encode,C,hrp.window,metric,split1,split2,mean,std\n"
        "r4,x,avg,2.0,,accuracy,0.6,0.6,0.6,0.0\n"
        "r1,x,avg,10.0,,accuracy,0.5,0.7,0.6,0.1\n"
        "r3,a+b|c,hrp,2.0,5,accuracy,0.25,,0.25,0.0\n"
        "r2,x,hrp,2.0,20,accuracy,0.9,0.8,0.85,0.05\n")


def test_cells_and_columns_of_a_chain():
    """cell's spellings; a stage's columns (its method, METHOD.PARAM, nested records as
    KEY.FIELD, one-element lists unwrapped); classify's by their option; a name met twice in
    one chain numbered."""
    from featpipe.results import _add, cell, classify_columns, stage_columns

    assert [cell(v) for v in (None, True, False, 1000.0, 0.1, 3, "ser", [1, 2.5], (4,),
                              [[1], 2], {"b": 1, "a": [2]})] == [
        "none", "true", "false", "1000", "0.1", "3", "ser", "1,2.5", "4", '[[1],2]',
        '{"a":[2],"b":1}']
    assert stage_columns("encode", {"method": "hrp", "window": 20, "C": [1.0], "psi": [1, 2],
                                    "sampling": {"fps": 5, "crop": {"size": 8}},
                                    "empty": {}}) == {
        "encode": "hrp", "hrp.window": 20, "hrp.C": 1.0, "hrp.psi": [1, 2], "sampling.fps": 5,
        "sampling.crop.size": 8, "hrp.empty": {}}
    assert stage_columns("extract", {"features": "idt", "step": 5}) == {"extract": "idt",
                                                                        "idt.step": 5}
    assert stage_columns("gmm", {"n_components": 4, "method": "x"}) == {
        "gmm.n_components": 4, "gmm.method": "x"}
    assert stage_columns("encode", {"window": 3}) == {"encode.window": 3}
    assert classify_columns({"kernels": ["linear"], "ap_mode": "voc", "metric": "map",
                             "C": [1000.0], "split": 2}) == {"kernel": "linear", "ap": "voc",
                                                             "C": 1000.0, "split": 2}
    into = {"hrp.window": 1}
    _add(into, {"hrp.window": 2, "C": 3})
    _add(into, {"hrp.window": 4})
    assert into == {"hrp.window": 1, "hrp.window#2": 2, "C": 3, "hrp.window#3": 4}


def test_the_plots_lines_and_the_files_beside_a_table(tmp_path):
    """plot_series: a line per value of ``by`` and of every other parameter that varies among
    the rows with ``x``, 'all' when none does; a plot of a text column; the PNG's name; an
    output's suffix picks its format, whatever its case, and another is refused before
    anything is written."""
    from featpipe.errors import FeatpipeError, ParameterError
    from featpipe.results import (
        Table,
        check_output,
        make_table,
        plot,
        plot_path,
        plot_series,
        write_table,
    )

    table = make_table([_result(*r) for r in RESULTS])
    by_c = [("encode=avg", [(2.0, 0.6, 0.0), (10.0, 0.6, 0.1)]),
            ("encode=hrp, hrp.window=5", [(2.0, 0.25, 0.0)]),
            ("encode=hrp, hrp.window=20", [(2.0, 0.85, 0.05)])]
    assert plot_series(table, "C") == by_c and plot_series(table, "C", by="encode") == by_c
    assert plot_series(table, "hrp.window") == [("all", [(5, 0.25, 0.0), (20, 0.85, 0.05)])]
    assert [label for label, _ in plot_series(table, "C", by="hrp.window")] == [
        "encode=avg", "hrp.window=5, encode=hrp", "hrp.window=20, encode=hrp"]  # by first
    with pytest.raises(ParameterError, match="by 'encod' is not a column"):
        plot_series(table, "C", by="encod")
    assert [label for label, _ in plot_series(table, "encode")] == [
        "C=2", "C=10", "C=2, hrp.window=5", "C=2, hrp.window=20"]
    assert plot(table, "encode", tmp_path / "e.png") == 4  # a text axis
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FeatpipeError, match="no result has a value for 'C': nothing to plot"):
        plot(Table([], ["C"]), "C", tmp_path / "n.png")  # no rows
    assert plot_path(tmp_path / "t.csv", "hrp.window") == tmp_path / "t.hrp.window.png"
    assert plot_path("out/t.md", "a b/c#2") == Path("out/t.a_b_c_2.png")
    check_output("T.CSV")
    with pytest.raises(ParameterError, match="'t.txt': the suffix picks the format"):
        check_output("t.txt")
    write_table(table, tmp_path / "new" / "T.MD")
    assert (tmp_path / "new" / "T.MD").read_text(encoding="utf-8").startswith("| result |")
    with pytest.raises(ParameterError, match="t.txt': the suffix picks the format"):
        write_table(table, tmp_path / "bad" / "t.txt")  # refused before its folder is made
    assert not (tmp_path / "bad").exists()


class _Stage:
    """A stage as read_result sees it: name, kind, params, inputs, its stored result."""

    def __init__(self, name, kind, params, inputs=(), result=None, store=None):
        self.name, self.kind, self.params, self.store = name, kind, params, store
        self._inputs, self.input_names = list(inputs), [s.name for s in inputs]
        self.meta, self.result = {"created": "then"}, result

    def inputs(self):
        if "encode-x" in self.input_names:
            from featpipe.errors import FeatpipeError

            raise FeatpipeError("input stage encode-x is gone")
        return self._inputs

    def has_model(self, name):
        return name == "result" and self.result is not None

    def load_model(self, name):
        return {}, self.result


class _Warnings:
    def __init__(self):
        self.lines = []

    def warn(self, text):
        self.lines.append(text)


def test_each_result_row_from_its_stored_result_and_chain_and_the_unreadable_skipped(tmp_path):
    """gather/read_result on stages made here: the row's label and inputs by their first
    name (else the folder), its chain's columns then classify's, the scores of each split; a
    stage without a result, or whose result lacks its splits or summary, skipped with a
    warning; a chain that cannot be read warned about, the row kept with classify's columns;
    a store that does not exist is one line, its own (before any reference is resolved)."""
    from types import SimpleNamespace

    from featpipe.errors import FeatpipeError
    from featpipe.pipeline import load_pipeline
    from featpipe.results import gather, pipeline_results, store_results
    from featpipe.store import Store

    store = SimpleNamespace(names=lambda: {"frames": "import-a", "pooled": "encode-b",
                                           "best": "classify-c", "also": "classify-c"})
    frames = _Stage("import-a", "import", {"n": 2}, store=store)
    pooled = _Stage("encode-b", "encode", {"method": "hrp", "window": 4}, [frames],
                    store=store)
    unnamed = _Stage("encode-u", "encode", {"method": "avg"}, [frames], store=store)
    good = {"splits": [{"split": 1, "score": 0.5}, {"split": 2, "score": 1}],
            "summary": {"metric": "accuracy", "mean": 0.75, "std": 0.25}}
    own = {"kernels": ["linear"], "C": [10.0], "metric": "accuracy"}
    stages = [_Stage("classify-c", "classify", own, [pooled], good, store),
              _Stage("classify-d", "classify", own, [pooled], None, store),
              _Stage("classify-e", "classify", own, [pooled], {**good, "summary": None},
                     store),
              _Stage("classify-f", "classify", own, [pooled], {**good, "splits": {}}, store),
              _Stage("classify-g", "classify", own, [pooled],
                     {**good, "summary": {"metric": "map", "mean": 1.0}}, store),
              _Stage("classify-h", "classify", own, [], good, store),
              _Stage("classify-i", "classify", {"C": [1.0]}, [unnamed], good, store)]
    stages[5].input_names = ["encode-x"]
    warnings = _Warnings()
    rows = gather(stages, warnings)
    assert [(r.label, r.inputs) for r in rows] == [
        ("best", ["pooled"]), ("classify-h", ["encode-x"]), ("classify-i", ["encode-u"])]
    assert (rows[0].metric, rows[0].scores, rows[0].mean, rows[0].std) == (
        "accuracy", {1: 0.5, 2: 1.0}, 0.75, 0.25)
    assert rows[0].params == {"import.n": 2, "encode": "hrp", "hrp.window": 4,
                              "kernel": "linear", "C": 10.0}
    assert rows[1].params == {"kernel": "linear", "C": 10.0}
    assert warnings.lines == [
        "skipped: classify stage classify-d holds no result",
        *(f"skipped: the result of classify stage classify-{s} lacks its splits or summary"
          for s in "efg"),
        "result classify-h: its inputs cannot be read (input stage encode-x is gone); its row "
        "has classify's own parameters only"]
    assert gather([], warnings) == []
    missing = Store(tmp_path / "none")
    with pytest.raises(FeatpipeError, match="^no store at .*none: the folder does not exist"):
        store_results(missing)
    path = tmp_path / "p.toml"
    path.write_text('[steps.r]\nstage = "classify"\ninputs = ["@x"]\n')
    # the store's own line, before any reference of the file is resolved in it
    with pytest.raises(FeatpipeError, match="^no store at .*none: the folder does not exist"):
        pipeline_results(load_pipeline(path), missing, _Warnings())
