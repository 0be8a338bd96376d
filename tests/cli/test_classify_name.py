"""Results a user keeps (issue 47 item 5): ``classify --name`` names the stage that keeps the
result, so ``cache gc`` keeps it as it keeps every named stage; an unnamed result is still
collected; a pipeline step's name names its result; the report records the stage."""

from __future__ import annotations

import json

import numpy as np

from featpipe import stages
from featpipe.manifest import from_rows
from featpipe.stages.classification import RESULT
from featpipe.store import Store


def _encoded(tmp_path) -> Store:
    """An encode stage ``vec`` of 16 vectors, two classes apart, 8 train and 8 test."""
    rng = np.random.default_rng(0)
    rows, vectors = [], {}
    for k in range(16):
        label = "ab"[k % 2]
        item_id = f"v{k:02d}"
        rows.append((item_id, "", [label], ["train" if k < 8 else "test"]))
        vectors[item_id] = rng.random(4).astype(np.float32) + (2.0 if label == "b" else 0.0)
    store = Store(tmp_path / "s")
    stage = store.stage("encode", {"test": "vectors"},
                        items=from_rows(rows, tmp_path, n_splits=1))
    for item_id, vector in vectors.items():
        stage.write_item(item_id, vector)
    store.set_name("vec", stage)
    return store


def test_a_named_result_survives_gc_and_an_unnamed_one_is_collected(tmp_path, cli):
    store = _encoded(tmp_path)
    report = tmp_path / "r" / "kept.json"
    named = cli("classify", "--store", store.root, "--input", "vec", "--name", "kept",
                "--normalize", "none", "--report", report, check=True)
    assert "split 1: accuracy 1.0000 (8/8)" in named.stdout
    kept = store.resolve("kept")
    assert kept.kind == "classify" and kept.has_model(RESULT)
    config = json.loads(report.read_text())["config"]
    assert config["stage"] == kept.name and config["name"] == "kept"
    assert config["key"] == kept.key
    markdown = report.with_suffix(".md").read_text()
    assert f"- kept in the store as stage `{kept.name}`, name `kept`" in markdown
    other = tmp_path / "r" / "other.json"
    cli("classify", "--store", store.root, "--input", "vec", "--C", "10", "--report", other,
        check=True)
    unnamed = json.loads(other.read_text())["config"]
    assert unnamed["name"] is None and unnamed["stage"] != kept.name
    assert "(unnamed: `cache gc` collects it" in other.with_suffix(".md").read_text()
    gone = store.stages_dir / unnamed["stage"]
    assert gone.is_dir()
    cli("cache", "gc", "--store", store.root, "--min-age", "0", check=True)
    assert not gone.exists()  # an unnamed result is collected, as before
    assert store.resolve("kept").load_model(RESULT)[1]["summary"]["mean"] == 1.0
    status = cli("status", "--store", store.root, "kept", "--check", check=True)
    assert "status: complete: model fitted" in status.stdout
    again = cli("classify", "--store", store.root, "--input", "vec", "--name", "kept",
                "--normalize", "none", check=True)
    assert "reused the stored result" in again.stdout and "moved" not in again.stderr
    renamed = cli("classify", "--store", store.root, "--input", "vec", "--name", "vec2",
                  "--normalize", "none", check=True)
    assert "reused the stored result" in renamed.stdout  # a name given later names it too
    assert store.resolve("vec2") == kept


def test_the_python_api_names_the_result_and_a_bad_name_touches_nothing(tmp_path):
    import pytest

    from featpipe.errors import ParameterError

    store = _encoded(tmp_path)
    with pytest.raises(ParameterError, match="name"):
        stages.classify(store, ["vec"], name="no/slash")
    assert sorted(store.names()) == ["vec"] and len(store.all_stages()) == 1
    result = stages.classify(store, ["vec"], name="res")
    assert store.resolve("res").key == result["key"]


def test_a_pipeline_steps_name_names_its_result(tmp_path, cli):
    store = _encoded(tmp_path)
    path = tmp_path / "p.toml"
    path.write_text("[steps.result]\nstage = 'classify'\ninputs = ['@vec']\n"
                    "[steps.other]\nstage = 'classify'\ninputs = ['@vec']\nC = [10]\n"
                    "name = 'c10'\n")
    cli("run", path, "--store", store.root, check=True)
    names = store.names()
    assert sorted(names) == ["c10", "result", "vec"]
    assert store.resolve("result").kind == store.resolve("c10").kind == "classify"
    assert names["result"] != names["c10"]
