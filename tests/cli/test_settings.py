"""Issue 22 section 4: settings and metadata that break a run are reported, not followed.

Environment settings are usage errors (exit 2) before any stage exists, in every command;
an absurd ledger value is a problem line.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.progress import format_duration, format_time
from featpipe.store import Store
from tests._stores import six_sequences
from tests.conftest import one_line_error, run_cli


@pytest.fixture
def store(tmp_path):
    """Six labelled sequences (train/test) named seq."""
    store = six_sequences(tmp_path)
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
            ["classify", "--input", "seq", "--kernel", "linear"],
            ["extract", "--manifest", "m.csv", "--features", "dsift", "--dry-run"],
            ["import", "--from", "npy", "--name", "i"], ["run", "pipeline.toml"],
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
    ("seconds", -3.0, "'seconds' must be >= 0, got -3.0"),
    ("seconds", 1e308, "'seconds' 1e+308 is more than the time since 1970")])
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
    assert format_duration(float("inf")) == "an unknown time"


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


def test_a_log_file_in_the_store_logs_folder_is_allowed(cli, store):
    result = cli("status", "seq", "--store", store.root, "--log-file",
                 store.root / "logs" / "status.log")
    assert result.exit_code == 0, result.output
    assert "exit status 0" in (store.root / "logs" / "status.log").read_text()
    assert cli("cache", "ls", "--store", store.root).exit_code == 0


def _vectors(store, name, ids, seed):
    """A stage ``name`` of 4-d vectors for ``ids`` (train: t0..t7, test: the rest)."""
    rng = np.random.default_rng(seed)
    rows = [(i, f"{i}.mp4", ["up" if int(i[1:]) % 2 else "down"],
             ["train" if int(i[1:]) < 8 else "test"]) for i in ids]
    stage = store.stage("import", {"vectors": name}, items=from_rows(rows, root=store.root))
    for i in ids:
        stage.write_item(i, (rng.random(4) + (int(i[1:]) % 2)).astype(np.float32))
    store.set_name(name, stage)
    return stage


def test_fusing_inputs_with_different_items_names_them_or_intersects(cli, store):
    every = [f"t{i}" for i in range(12)]
    a = _vectors(store, "a", [i for i in every if i != "t3"] + ["t12"], 1)
    b = _vectors(store, "b", [i for i in every if i not in ("t10", "t11")], 2)
    fuse = ["classify", "--store", store.root, "--input", "a", "--input", "b"]
    refused = cli(*fuse)
    assert refused.exit_code == 1
    assert (f"error: the fused inputs hold different items (13 in all): input a ({a.name}) "
            f"lacks 1 of them ('t3'); input b ({b.name}) lacks 3 of them ('t10', 't11', "
            f"'t12'); --intersect classifies the 9 items they share") in refused.stderr
    fused = cli(*fuse, "--intersect")
    assert fused.exit_code == 0, fused.output
    assert f"--intersect: 3 of the 12 items of input a ({a.name}) are not in every input" \
        in fused.stderr
    assert f"--intersect: 1 of the 10 items of input b ({b.name}) are not in every input" \
        in fused.stderr
    # the same numbers as two inputs that hold only the shared items
    common = [i for i in every if i not in ("t3", "t10", "t11")]
    for name, stage in (("a2", a), ("b2", b)):
        copy = store.stage("import", {"vectors": name},
                           items=from_rows([(i, f"{i}.mp4", stage.items[i].labels,
                                             ["train" if int(i[1:]) < 8 else "test"])
                                            for i in common], root=store.root))
        for i in common:
            copy.write_item(i, stage.read_item(i))
        store.set_name(name, copy)
    reference = cli("classify", "--store", store.root, "--input", "a2", "--input", "b2")
    assert reference.exit_code == 0, reference.output
    lines = [line for line in fused.stdout.splitlines() if line.startswith("split 1:")]
    assert lines and lines == [line for line in reference.stdout.splitlines()
                               if line.startswith("split 1:")]
    assert "7 train / 2 test items" in lines[0]


def test_float16_underflow_to_zero_is_warned_with_the_count(cli, tmp_path):
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.npy,x,train\nb,b.npy,y,test\n")
    small = np.array([[1e-9, 2e-8, 0.0, 1.0], [5e-8, -1e-10, 3.0, 0.5]])  # 3 below 6e-8 / 2
    np.savez(tmp_path / "f.npz", a=small, b=np.ones((2, 4)))
    result = cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
                 "--store", tmp_path / "s", "--dtype", "float16", "--name", "h")
    assert result.exit_code == 0, result.output
    assert "a: 3 of 7 nonzero values are below the smallest float16 (6e-08) and are stored " \
        "as 0" in result.stderr
    assert "b:" not in result.stderr
    stored = Store(tmp_path / "s").resolve("h").read_item("a")
    assert stored.dtype == np.float16 and np.count_nonzero(stored) == 4
    big = cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
              "--store", tmp_path / "s", "--name", "f32")  # float32 holds them: no warning
    assert big.exit_code == 0 and "stored as 0" not in big.stderr



@pytest.mark.parametrize("variable, value, command, cause", [
    ("FEATPIPE_ENCODERS", "no_such_plugin", ["encode", "--input", "seq", "--method", "avg"],
     "must name importable modules, got 'no_such_plugin' (No module named 'no_such_plugin')"),
    ("FEATPIPE_ENCODERS", "json", ["encode", "--input", "seq", "--method", "avg"],
     "must name modules that define ENCODE_METHODS, got 'json'"),
    ("FEATPIPE_FEATURES", "no_such_plugin", ["extract", "--manifest", "m.csv", "--features",
                                             "dsift"],
     "must name importable modules, got 'no_such_plugin'")])
def test_a_bad_plugin_variable_is_a_usage_error(store, variable, value, command, cause):
    before = _state(store)
    proc = run_cli(*command, "--store", store.root, env={variable: value}, check=False)
    assert f"error: {variable} (or an entry point) {cause}" in one_line_error(proc, code=2)
    assert _state(store) == before


def test_a_bad_slurm_task_variable_is_shown_with_its_value(cli, store, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "x")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    before = _state(store)
    result = cli("encode", "--store", store.root, "--input", "seq", "--method", "avg")
    assert result.exit_code == 2
    assert "error: --shard must be I/N with 0 <= I < N (e.g. 0/4), got " \
        "SLURM_ARRAY_TASK_ID='x', SLURM_ARRAY_TASK_COUNT='4'" in result.stderr
    assert _state(store) == before


def test_submit_log_dir_inside_the_store_is_refused_outside_logs(cli, store):
    command = ["submit", "--backend", "slurm", "--tasks", "2", "--dry-run", "--log-dir"]
    wrapped = ["--", "featpipe", "encode", "--store", str(store.root), "--input", "seq",
               "--method", "avg"]
    refused = cli(*command, store.root / "names", *wrapped)
    assert refused.exit_code == 2
    assert f"error: --log-dir {store.root / 'names'} is inside the store {store.root}" \
        in refused.stderr
    assert cli(*command, store.root / "logs" / "slurm", *wrapped).exit_code == 0


def test_intersect_must_be_a_boolean(store):
    from featpipe.errors import ParameterError
    from featpipe.stages.classification import classify

    with pytest.raises(ParameterError, match="intersect must be true or false, got 'yes'"):
        classify(store, ["seq"], intersect="yes")
