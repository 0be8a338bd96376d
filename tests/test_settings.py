"""Issue 22 section 4: settings and metadata that break a run are reported, not followed.

Environment settings are usage errors (exit 2) before any stage exists, in every command.
"""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.manifest import from_rows
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
