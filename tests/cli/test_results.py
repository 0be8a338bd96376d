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
