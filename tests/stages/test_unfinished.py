"""Unfinished work stays visible (issue 22 section 3): every run marks itself running, a run
that ends with failures under ``--on-error skip`` takes its name and the stages computed from
it leave the failed items out (and say which), a killed extract or encode is followed by
``status``, kept by ``cache gc`` and finished by the same command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

from featpipe import stages
from featpipe.fileio import HOST
from featpipe.manifest import Manifest, from_rows
from featpipe.stages.base import RUNNING
from featpipe.stages.cache import gc
from featpipe.store import Store
from tests._stores import first_encoded, write_npy_dataset
from tests.cli.test_extract_cli import write_manifest
from tests.cli.test_extract_interrupt import ITEMS, command, environment, start_slow_extract


def test_a_killed_extract_is_followed_kept_and_finished(tmp_path, cli):
    proc = start_slow_extract(tmp_path)
    store = Store(tmp_path / "store")
    deadline = time.monotonic() + 120
    stage = None
    while time.monotonic() < deadline:  # one item done, the next begun
        stages_ = store.all_stages()
        stage = stages_[0] if stages_ else None
        if stage is not None and stage.done_ids():
            break
        time.sleep(0.05)
    assert stage is not None and stage.done_ids(), "no item finished in time"
    assert stage.running_processes() == [f"{HOST}-{proc.pid}"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    done = len(stage.done_ids())
    assert 1 <= done < ITEMS
    # the name's running marker outlives the process: status follows it, gc keeps the stage
    assert (store.names_dir / RUNNING / "raw").read_text().split()[0] == stage.name
    assert stage.running_processes() == []  # the killed process's marker is stale
    status = cli("status", "-s", store.root, "raw")
    assert status.exit_code == 0, status.output
    assert f"stage {stage.name} (extract)" in status.output
    assert f"{ITEMS} total, {done} done, 0 failed, {ITEMS - done} pending" in status.output
    result = gc(store, min_age=0)
    assert result.removed == [] and stage.path.is_dir()
    again = subprocess.run(command(tmp_path), env=environment(), cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{ITEMS - done} done, {done} skipped" in again.stdout
    assert store.resolve("raw") == stage and stage.is_complete()
    assert not (store.names_dir / RUNNING / "raw").exists()
    assert stage.running_processes() == [] and not list((stage.path / "running").iterdir())


def test_a_killed_encode_is_followed_kept_and_finished(tmp_path, cli):
    store = Store(tmp_path / "store")
    stages.import_features(store, [str(tmp_path / "npy")], str(write_npy_dataset(tmp_path)),
                           name="frames")
    frames = store.resolve("frames")
    command = [sys.executable, "-m", "featpipe", "encode", "-s", str(store.root), "-i",
               "frames", "-m", "slow-mean", "-n", "mean"]
    env = dict(environment(), FEATPIPE_ENCODERS="tests._slow_mean")
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    stage = first_encoded(store, proc)  # one item done, the next begun
    assert stage.running_processes() == [f"{HOST}-{proc.pid}"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    done = len(stage.done_ids())
    assert 1 <= done < len(frames.items.ids)
    assert (store.names_dir / RUNNING / "mean").read_text().split()[0] == stage.name
    assert "mean" not in store.names() and stage.running_processes() == []
    status = cli("status", "-s", store.root, "mean")
    assert status.exit_code == 0, status.output
    assert f"stage {stage.name} (encode)" in status.output
    assert f"12 total, {done} done, 0 failed, {12 - done} pending" in status.output
    assert gc(store, min_age=0).removed == [] and stage.path.is_dir()
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{12 - done} done, {done} skipped" in again.stdout
    assert store.resolve("mean") == stage and stage.is_complete()
    assert not (store.names_dir / RUNNING / "mean").exists()
    for item_id in frames.items.ids:
        mean = frames.read_item(item_id).astype(np.float64).mean(axis=0)
        np.testing.assert_array_equal(stage.read_item(item_id), mean.astype(np.float32))


@pytest.fixture
def images(tmp_path):
    """Three small images and one file that is not an image."""
    rng = np.random.default_rng(0)
    rows = []
    for k in range(3):
        cv2.imwrite(str(tmp_path / f"i{k}.png"), rng.integers(0, 255, (40, 48, 3), np.uint8))
        rows.append((f"i{k}", f"i{k}.png", "a" if k % 2 else "b", "train"))
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    rows.append(("bad", "bad.png", "a", "train"))
    return write_manifest(tmp_path, rows)


def test_skip_names_the_stage_and_downstream_stages_leave_the_failed_items_out(
        tmp_path, cli, images):
    store = Store(tmp_path / "store")
    args = ["extract", "-m", images, "-s", store.root, "-f", "dsift", "--sizes", "8",
            "--step", "8", "-n", "sift", "--on-error", "skip"]
    result = cli(*args)
    assert result.exit_code == 1  # items failed
    stage = store.resolve("sift")  # ... and the name points to the stage all the same
    assert set(stage.failed()) == {"bad"} and stage.done_ids() == {"i0", "i1", "i2"}
    assert "name sift points to stage" in result.stderr and "1 failed item(s)" in result.stderr
    assert not (store.names_dir / RUNNING / "sift").exists()
    status = cli("status", "-s", store.root, "sift")
    assert "failed: bad: " in status.output and "3 done, 1 failed, 0 pending" in status.output
    encoded = cli("encode", "-s", store.root, "-i", "sift", "-m", "cov", "-n", "cov")
    assert encoded.exit_code == 0, encoded.output
    assert "1 item(s) failed in " in encoded.stderr and "left out (first: 'bad'" in \
        encoded.stderr
    cov = store.resolve("cov")
    assert cov.params["input_failed"] == ["bad"] and cov.items.ids == ["i0", "i1", "i2"]
    assert cov.is_complete()
    pca = stages.fit_pca(store, "sift", name="p", n_components=2, sample=0)
    assert pca.params["input_failed"] == ["bad"]
    # the bad file fixed: a new extract stage (its files are keyed by content) with every
    # item, and encoding it again covers every item, in a new stage
    cv2.imwrite(str(tmp_path / "bad.png"), np.zeros((40, 48, 3), np.uint8))
    assert cli(*args).exit_code == 0
    assert store.resolve("sift") != stage and store.resolve("sift").is_complete()
    again = stages.encode(store, "sift", "cov", name="cov")
    assert again.stage != cov and "input_failed" not in again.stage.params
    assert sorted(again.stage.items.ids) == ["bad", "i0", "i1", "i2"]


def test_an_encode_with_a_failed_item_under_skip_takes_its_name(tmp_path, cli):
    store = Store(tmp_path / "store")
    rows = [(f"t{i}", "", ["a"], ["train"]) for i in range(4)]
    seq = store.stage("import", {"seq": 1}, items=from_rows(rows, root=tmp_path))
    for i in range(4):  # t2 has 4 features per frame, the others 3
        seq.write_item(f"t{i}", np.full((5, 4 if i == 2 else 3), i, np.float32))
    store.set_name("seq", seq)
    result = cli("encode", "-s", store.root, "-i", "seq", "-m", "avg", "-n", "e",
                 "--on-error", "skip")
    assert result.exit_code == 1
    stage = store.resolve("e")
    assert set(stage.failed()) == {"t2"} and stage.done_ids() == {"t0", "t1", "t3"}
    assert "name e points to stage" in result.stderr and "1 failed item(s)" in result.stderr
    assert not (store.names_dir / RUNNING / "e").exists()
    status = cli("status", "-s", store.root, "e")
    assert "failed: t2: " in status.output and "3 done, 1 failed, 0 pending" in status.output
    failing = cli("encode", "-s", store.root, "-i", "seq", "-m", "max", "-n", "m")
    assert failing.exit_code == 1 and "m" not in store.names()  # without skip: no name


def test_gc_keeps_a_stage_a_live_process_computes(tmp_path):
    store = Store(tmp_path / "store")
    stage = store.stage("encode", {"method": "avg"}, items=Manifest([]))
    stage.mark_running()
    assert gc(store, min_age=0).removed == []
    dead = subprocess.Popen(["true"])
    dead.wait()
    stage.unmark_running()
    (stage.path / "running" / f"{HOST}-{dead.pid}").touch()  # a killed process's marker
    assert stage.running_processes() == []
    assert gc(store, min_age=0).removed == [stage.path]


def test_a_fit_that_dies_leaves_its_run_marker(tmp_path, monkeypatch, cli):
    from featpipe.extract.pca import PCAProjection

    store = Store(tmp_path / "store")
    stages.import_features(store, [str(tmp_path / "npy")],
                           str(write_npy_dataset(tmp_path)), name="frames")

    def die(self, X):
        raise KeyboardInterrupt

    monkeypatch.setattr(PCAProjection, "fit", die)
    with pytest.raises(KeyboardInterrupt):
        stages.fit_pca(store, "frames", name="p", n_components=2)
    folder = (store.names_dir / RUNNING / "p").read_text().split()[0]
    assert folder.startswith("pca-") and "p" not in store.names()
    status = cli("status", "-s", store.root, "p")
    assert f"stage {folder} (pca)" in status.output and "incomplete: no model" in status.output
    monkeypatch.undo()
    stage = stages.fit_pca(store, "frames", name="p", n_components=2)
    assert stage.name == folder and store.resolve("p") == stage
    assert not (store.names_dir / RUNNING / "p").exists()
