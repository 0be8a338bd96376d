"""Two identical runs started together (issue 22 section 4): the second waits for the first
(the stage's lock for its shard) and reuses the items it computed instead of computing them
again; other shards of the same stage are not held up."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np

from featpipe import stages
from featpipe.stages import Reporter, RunOptions
from featpipe.store import Store
from tests._stores import done_lines, write_npy_dataset
from tests.conftest import REPO


class Lines(Reporter):
    def __init__(self):
        self.lines: list[str] = []

    def info(self, text):
        self.lines.append(text)

    def warn(self, text):
        self.lines.append(text)


def _encode_stage(tmp_path, method):
    """A store with 12 imported sequences ``frames`` and the (empty) stage of their ``method``
    encoding, created as a run would create it."""
    store = Store(tmp_path / "store")
    stages.import_features(store, [str(tmp_path / "npy")], str(write_npy_dataset(tmp_path)),
                           name="frames")
    planned = stages.encode(store, "frames", method, options=RunOptions(dry_run=True)).stage
    stage = store.stage("encode", planned.params, inputs=planned.inputs(), items=planned.items)
    assert stage.name == planned.name
    return store, stage


def test_a_second_identical_encode_waits_and_reuses_the_first_ones_items(tmp_path):
    store, stage = _encode_stage(tmp_path, "avg")
    lines, result = Lines(), {}
    with stage.exclusive("all", lambda: None):  # the first run holds the stage
        second = threading.Thread(target=lambda: result.update(run=stages.encode(
            store, "frames", "avg", name="avg", reporter=lines)))
        second.start()
        deadline = time.monotonic() + 60
        while not any("waiting for it" in line for line in lines.lines):
            assert time.monotonic() < deadline and second.is_alive(), lines.lines
            time.sleep(0.02)
        for item_id in stage.items.ids:  # ... and computes every item meanwhile
            source = store.resolve("frames").read_item(item_id)
            stage.write_item(item_id, source.mean(axis=0))
        assert second.is_alive()  # still waiting
    second.join(60)
    run = result["run"]
    assert run.summary.done == 0 and run.summary.skipped == 12
    assert f"stage {stage.name} is being computed by another process; waiting for it, then " \
        "reusing its items" in lines.lines
    assert "reused 12 item(s) the other run computed meanwhile" in lines.lines
    assert store.resolve("avg") == stage
    np.testing.assert_allclose(stage.read_item("v03"),
                               store.resolve("frames").read_item("v03").mean(axis=0))


def test_another_shard_of_the_stage_is_not_held_up(tmp_path):
    store, stage = _encode_stage(tmp_path, "max")
    with stage.exclusive("shard-0-of-2", lambda: None):
        run = stages.encode(store, "frames", "max", options=RunOptions(shard="1/2"))
    assert run.summary.done + run.summary.not_in_shard == 12 and run.summary.done > 0


def test_two_identical_encode_commands_started_together_compute_each_item_once(tmp_path):
    store = Store(tmp_path / "store")
    stages.import_features(store, [str(tmp_path / "npy")], str(write_npy_dataset(tmp_path)),
                           name="frames")
    command = [sys.executable, "-m", "featpipe", "encode", "-s", str(store.root), "-i",
               "frames", "-m", "slow-mean", "--seconds", "0", "-n", "mean"]
    gate = tmp_path / "go"  # no item is computed before it exists
    env = dict(os.environ, PYTHONPATH=str(REPO), FEATPIPE_ENCODERS="tests._slow_mean",
               SLOW_MEAN_GATE=str(gate))
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    second = None
    try:
        deadline = time.monotonic() + 120
        while not any(s.running_processes() for s in store.all_stages() if s.kind == "encode"):
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.02)
        second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        said = []
        reader = threading.Thread(target=lambda: said.extend(second.stderr), daemon=True)
        reader.start()
        while not any("waiting for it" in line for line in said):
            assert time.monotonic() < deadline and second.poll() is None, said
            time.sleep(0.02)
    finally:
        gate.touch()
    out, err = first.communicate(timeout=300)
    second_out = second.stdout.read()
    assert second.wait(timeout=300) == 0 and first.returncode == 0, err
    reader.join(60)
    assert "summary: 12 done, 0 skipped" in out
    assert "summary: 0 done, 12 skipped" in second_out
    assert "reused 12 item(s) the other run computed meanwhile" in second_out + "".join(said)
    assert set(done_lines(store.root, "mean").values()) == {1}  # every item computed once
    assert store.resolve("mean").is_complete()
