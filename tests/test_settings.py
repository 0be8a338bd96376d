"""Issue 22 section 4: settings and metadata that break a run are reported, not followed.

Environment settings are usage errors (exit 2) before any stage exists, in every command;
an absurd ledger value is a problem line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.progress import format_time
from featpipe.store import Store


@pytest.fixture
def store(tmp_path):
    """Six labelled sequences (train/test) named seq."""
    rng = np.random.default_rng(0)
    rows = [(f"t{i}", f"t{i}.mp4", ["up" if i % 2 else "down"], ["train" if i < 4 else "test"])
            for i in range(6)]
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"seq": 1}, items=from_rows(rows, root=tmp_path))
    for item_id, *_ in rows:
        stage.write_item(item_id, rng.random((12, 3)).astype(np.float32))
    store.set_name("seq", stage)
    return store


def _state(store: Store):
    return sorted(p.name for p in store.stages_dir.iterdir()), store.names()


BAD_SETTINGS = [("FEATPIPE_THREADS", "abc"), ("FEATPIPE_THREADS", "0"),
                ("FEATPIPE_MEMORY", "-1"), ("FEATPIPE_MEMORY", "inf"),
                ("FEATPIPE_MEMORY", "nan"), ("FEATPIPE_PROGRESS_INTERVAL", "soon")]

COMMANDS = [["encode", "--input", "seq", "--method", "max", "--name", "e"],
            ["encode", "--input", "seq", "--method", "hrp", "--window", "4", "--name", "e"],
            ["encode", "--input", "seq", "--method", "hrp", "--dry-run"],
            ["fit", "pca", "--input", "seq", "--n-components", "2", "--name", "p"],
            ["status"], ["cache", "ls"]]


@pytest.mark.parametrize("variable, value", BAD_SETTINGS)
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_bad_setting_is_a_usage_error_before_any_stage(cli, store, monkeypatch, variable,
                                                         value, command):
    monkeypatch.setenv(variable, value)
    before = _state(store)
    result = cli(*command, "--store", store.root)
    assert result.exit_code == 2, result.output
    assert f"error: {variable} must be " in result.stderr
    assert f"got {value!r}" in result.stderr
    assert "Traceback" not in result.stderr and "t0" not in result.stderr
    assert _state(store) == before


def test_good_settings_run(cli, store, monkeypatch):
    monkeypatch.setenv("FEATPIPE_THREADS", "2")
    monkeypatch.setenv("FEATPIPE_MEMORY", "64M")
    result = cli("encode", "--store", store.root, "--input", "seq", "--method", "max",
                 "--name", "e")
    assert result.exit_code == 0, result.output
    seq = store.resolve("seq")
    assert np.array_equal(store.resolve("e").read_item("t0"), seq.read_item("t0").max(axis=0))


@pytest.mark.parametrize("field, value, reason", [
    ("time", 9e18, "'time' 9e+18 is in the future"),
    ("time", -5.0, "'time' must be >= 0, got -5.0"),
    ("time", float("nan"), "'time' must be a number, got nan"),
    ("time", "yesterday", "'time' must be a number, got 'yesterday'"),
    ("seconds", -3.0, "'seconds' must be >= 0, got -3.0")])
def test_an_absurd_ledger_value_is_a_problem_line_in_status(cli, store, field, value, reason):
    stage = store.resolve("seq")
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    lines = ledger.read_text().splitlines()
    entry = json.loads(lines[0])
    entry[field] = value
    ledger.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
    result = cli("status", "--store", store.root, "seq")
    assert result.exit_code == 0, result.output
    problem = f"problem: ledger {ledger.name} line 1: {reason}"
    assert problem in result.output
    assert "items: 6 total, 5 done, 0 failed, 1 pending" in result.output  # t0 is not trusted
    as_json = json.loads(cli("status", "--store", store.root, "seq", "--json").output)
    assert [p for p in as_json["problems"] if reason in p]
    verify = cli("cache", "verify", "--store", store.root)
    assert reason in verify.output


@pytest.mark.parametrize("stamp, shown", [(None, "-"), (0.0, "1970-01-01 00:00:00"),
                                          (9e18, "9e+18 (not a date)"),
                                          (float("inf"), "inf (not a date)")])
def test_format_time_never_raises(stamp, shown):
    assert format_time(stamp) == shown


@pytest.mark.parametrize("where", ["names/report.json", "stages/x/report.json", "report.json"])
@pytest.mark.parametrize("command, flag", [
    (["classify", "--input", "seq", "--report"], "--report"),
    (["export", "seq", "-o"], "--output"),
    (["status", "seq", "--log-file"], "--log-file"),
    (["cache", "ls", "--log-file"], "--log-file")])
def test_an_output_file_inside_the_store_is_refused(cli, store, command, flag, where):
    target = store.root / where
    before = _state(store)
    result = cli(*command, target.with_suffix(".npz" if flag == "--output" else ".json"),
                 "--store", store.root)
    assert result.exit_code == 2, result.output
    assert f"error: {flag} " in result.stderr and f"inside the store {store.root}" \
        in result.stderr
    assert _state(store) == before and not list(store.root.rglob("report.*"))
    listing = cli("cache", "ls", "--store", store.root)
    assert listing.exit_code == 0 and "problem" not in listing.output
