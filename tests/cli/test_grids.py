"""Grids in pipeline files (issue 49 §1): a step's parameters swept, the steps after it
expanded with it, shared upstream stages computed once, the combinations listed by the dry
run, `--step` of one point or of all."""

from __future__ import annotations

import json

import pytest

from featpipe.grids import Point, combinations, expand, suffix, token
from featpipe.pipeline import PipelineError, load_pipeline
from featpipe.store import Store

SIFT = """[steps.sift]
stage = "extract"
manifest = "clips.csv"
features = "dsift"
params = { sizes = [8], step = 8 }
sampling = { every = 2 }
keep = true

[steps.grid]
stage = "encode"
input = "sift"
method = "spatial-grid"
params = { grid = "2x2" }

[steps.hrp]
stage = "encode"
input = "grid"
method = "hrp"
grid = { window = [2, 4, 6], depth = [1, 2] }

[steps.result]
stage = "classify"
inputs = ["hrp"]
"""


class Step:
    def __init__(self, name, arguments=None, reads=()):
        self.name, self.arguments, self.reads = name, dict(arguments or {}), list(reads)


def test_points_are_the_product_named_by_their_values_and_readers_follow():
    steps = [Step("a", {"grid": {"x": [1, 2]}}), Step("b", {"grid": {"y": ["p", "q"]}}),
             Step("c", reads=["a"]), Step("d", reads=["a", "b"]), Step("e", reads=["c", "a"])]

    def instantiate(step, name, values, rename):
        return Step(name, values, [rename.get(r, r) for r in step.reads])

    expansion = expand(steps, lambda s: s.reads, instantiate)
    names = [s.name for s in expansion.steps]
    assert names[:4] == ["a-x1", "a-x2", "b-yp", "b-yq"]
    assert names[4:6] == ["c-x1", "c-x2"]
    assert names[6:10] == ["d-x1-yp", "d-x1-yq", "d-x2-yp", "d-x2-yq"]
    # e reads c and a, which share a's grid: only the agreeing pairs
    assert [(s.name, s.reads) for s in expansion.steps[10:]] == [
        ("e-x1", ["c-x1", "a-x1"]), ("e-x2", ["c-x2", "a-x2"])]
    assert expansion.steps[0].arguments == {"x": 1}
    assert [p.name for p in expansion.points["d"]] == names[6:10]
    assert combinations({"x": [1, 2], "y": [3]}) == [{"x": 1, "y": 3}, {"x": 2, "y": 3}]
    assert token([8, 16]) == "8x16" and token(0.1) == "0.1" and token("a b") == "a_b"
    assert suffix({("a", "w"): 1, ("b", "w"): 2}) == "a.w1-b.w2"
    assert Point("p", {("a", "x"): 1}).agrees(Point("q", {("a", "x"): 1, ("b", "y"): 2}))


def test_a_grid_of_encoders_computes_the_shared_extraction_once(cli, tmp_path, monkeypatch):
    """A 2 x 3 grid of hrp on one extraction: one pass, the extraction's ledger one line an
    item, six encodings and six results, listed by the dry run with the grid's cost; a rerun
    computes nothing; `featpipe results` gathers them with a column per swept value."""
    monkeypatch.chdir(tmp_path)
    cli("example", "clips", "clips", "--per-class", "2", "--frames", "12", check=True)
    cli("manifest", "build", "clips", "-o", "clips.csv", "--test-fraction", "0.5", "--seed", "0",
        check=True)
    (tmp_path / "p.toml").write_text(SIFT)
    dry = cli("run", "p.toml", "--store", "s", "--dry-run", check=True)
    assert ("grid: hrp (window 2, 4, 6 x depth 1, 2): 6 step(s), hrp-window2-depth1, "
            "hrp-window2-depth2, hrp-window4-depth1") in dry.stdout
    assert "grid: result expands with what it reads: 6 step(s)" in dry.stdout
    assert "step 1/14: sift (extract), with grid, hrp-window2-depth1, hrp-window2-depth2" in \
        dry.stdout
    assert "dry run: total 14 stages (13 written, 1 fused pass(es))" in dry.stdout
    assert not (tmp_path / "s").exists()
    cli("run", "p.toml", "--store", "s", check=True)
    store = Store(tmp_path / "s")
    sift = store.resolve("sift")
    lines = [json.loads(line) for path in (sift.path / "ledger").iterdir()
             for line in path.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(sift.items.ids)  # once an item
    encodings = [s for s in store.all_stages() if s.params.get("method") == "hrp"]
    assert len(encodings) == 6 and all(s.is_complete() for s in encodings)
    assert {(s.params["window"], s.params["depth"]) for s in encodings} == {
        (w, d) for w in (2, 4, 6) for d in (1, 2)}
    again = cli("run", "p.toml", "--store", "s", check=True)
    assert "summary: 0 done, 8 skipped (already complete)" in again.stdout
    table = cli("results", "p.toml", "--store", "s", check=True).stdout
    header = table.splitlines()[0]
    assert "hrp.window" in header and "hrp.depth" in header
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == 1 + 6
    one = cli("run", "p.toml", "--store", "s", "--step", "hrp-window4-depth2", check=True)
    assert "step 6/14: hrp-window4-depth2 (encode): runs in the pass of step 'sift'" in one.stdout
    assert "sift (extract), with grid, hrp-window2-depth1" in one.stdout


@pytest.mark.parametrize("grid, message", [
    ("grid = { window = [] }", "grid window must be a non-empty list"),
    ("grid = [1, 2]", "grid must be a table of the values to sweep"),
    ("grid = { windw = [2, 4] }", "windw does not apply to method hrp (did you mean window?)"),
])
def test_a_bad_grid_is_a_usage_error_when_the_file_is_read(tmp_path, grid, message):
    path = tmp_path / "p.toml"
    path.write_text(SIFT.replace("grid = { window = [2, 4, 6], depth = [1, 2] }", grid))
    with pytest.raises(PipelineError) as raised:
        load_pipeline(path)
    assert message in str(raised.value)


def test_the_dry_runs_grid_lines_for_a_one_value_grid_and_a_reader_of_two_points():
    """A grid of one value is one point, listed with its value; a step that reads it is one
    step (no line); a step that reads two points says it expands; booleans name points in
    lower case (TOML's spelling)."""
    steps = [Step("a", {"grid": {"x": [1]}}), Step("b", {"grid": {"y": [True, False]}}),
             Step("c", reads=["a"]), Step("d", reads=["b"])]

    def instantiate(step, name, values, rename):
        return Step(name, values, [rename.get(r, r) for r in step.reads])

    expansion = expand(steps, lambda s: s.reads, instantiate)
    assert [s.name for s in expansion.steps] == ["a-x1", "b-ytrue", "b-yfalse", "c-x1",
                                                 "d-ytrue", "d-yfalse"]
    assert expansion.grid_lines() == [
        "grid: a (x 1): 1 step(s), a-x1",
        "grid: b (y True, False): 2 step(s), b-ytrue, b-yfalse",
        "grid: d expands with what it reads: 2 step(s)"]
    assert token(True) == "true" and token(False) == "false" and token([True, 2]) == "truex2"
