"""Executors behind one interface: shards, local processes, SIGKILL + resume, status, errors."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.errors import FeatpipeError
from featpipe.parallel import (
    DaskExecutor,
    LocalExecutor,
    SlurmExecutor,
    make_executor,
    parse_shard,
    run_items,
    shard_of,
)
from featpipe.store import Store
from tests._computes import SleepyCompute, item_ids, sleepy_stage
from tests._stores import assert_matches_literal, assert_same_items, done_lines, load_all
from tests.conftest import REPO

SLEEPY = [sys.executable, "-m", "tests._computes", "sleepy"]


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_shards_are_a_stable_hash_partition():
    ids = item_ids(200) + ["a/b", "a_b", "ü"]
    for n in (1, 3, 4):
        parts = [{i for i in ids if shard_of(i, n) == k} for k in range(n)]
        assert set().union(*parts) == set(ids)
        assert sum(map(len, parts)) == len(ids)  # disjoint
    # literal: the first 8 hex digits of sha256(id), modulo N
    digest = int(hashlib.sha256(b"video/007").hexdigest()[:8], 16)
    assert shard_of("video/007", 5) == digest % 5


def test_parse_shard_from_slurm_environment(monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_COUNT", raising=False)
    assert parse_shard(None) is None
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "5")
    assert parse_shard(None) == (2, 5)
    assert parse_shard("0/3") == (0, 3)
    with pytest.raises(FeatpipeError, match="need 0 <= I < N"):
        parse_shard("3/3")


def test_make_executor_and_clear_errors(tmp_path):
    assert isinstance(make_executor("local", jobs=2), LocalExecutor)
    assert isinstance(make_executor("slurm"), SlurmExecutor)
    with pytest.raises(FeatpipeError, match="--executor dask needs --scheduler ADDRESS"):
        make_executor("dask")
    with pytest.raises(FeatpipeError, match="--executor must be one of"):
        make_executor("mpi")
    stage = sleepy_stage(Store(tmp_path / "s"), 4)
    with pytest.raises(FeatpipeError, match="--executor slurm computes one shard"):
        run_items(stage, stage.items.ids, SleepyCompute(), executor="slurm")
    assert stage.done_ids() == set()
    with pytest.raises(FeatpipeError, match="cannot reach the dask scheduler at tcp://127.0.0.1:9"):
        run_items(stage, stage.items.ids, SleepyCompute(),
                  executor=DaskExecutor("tcp://127.0.0.1:9", timeout=1))


def test_local_processes_and_shards_equal_one_process(tmp_path):
    one = sleepy_stage(Store(tmp_path / "one"), 20)
    summary = run_items(one, one.items.ids, SleepyCompute())
    assert (summary.done, summary.skipped, len(summary.failed)) == (20, 0, 0)
    two = sleepy_stage(Store(tmp_path / "two"), 20)
    run_items(two, two.items.ids, SleepyCompute(), jobs=2, batch_size=3)
    sharded = sleepy_stage(Store(tmp_path / "sharded"), 20)
    for k in range(3):
        part = run_items(sharded, sharded.items.ids, SleepyCompute(), executor="slurm",
                         shard=(k, 3))
        assert part.done == sum(shard_of(i, 3) == k for i in item_ids(20))
        assert part.not_in_shard == 20 - part.done
    for stage in (one, two, sharded):
        Store(stage.path.parent.parent).set_name("s", stage)
    reference = load_all(tmp_path / "one", "s")
    assert_matches_literal(reference)
    assert_same_items(load_all(tmp_path / "two", "s"), reference)
    assert_same_items(load_all(tmp_path / "sharded", "s"), reference)
    again = run_items(one, one.items.ids, SleepyCompute(), jobs=2)
    assert (again.done, again.skipped) == (0, 20)


def test_local_workers_reused_after_a_change_of_folder_read_the_new_one(tmp_path,
                                                                         monkeypatch):
    """A relative store in one folder, then the same relative store in another (a library
    user's os.chdir between runs): loky's reused workers work from the caller's folder, so
    the second store gets its items (they failed with "no stage at ..." read from the
    first folder, or wrote into it)."""
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        stage = sleepy_stage(Store("store"), 6)
        summary = run_items(stage, stage.items.ids, SleepyCompute(), jobs=2, batch_size=1)
        assert (summary.done, len(summary.failed)) == (6, 0), summary.failed
        assert stage.done_ids() == set(item_ids(6))
    assert Store(tmp_path / "first" / "store").all_stages()[0].done_ids() == set(item_ids(6))


def test_sigkill_of_a_local_worker_then_rerun_completes(cli, tmp_path):
    n = 14
    reference = sleepy_stage(Store(tmp_path / "ref"), n)
    run_items(reference, reference.items.ids, SleepyCompute())
    Store(tmp_path / "ref").set_name("s", reference)
    cmd = [*map(str, SLEEPY), "--store", str(tmp_path / "s"), "--items", str(n), "--name", "s",
           "--sleep", "0.2", "--jobs", "2", "--batch-size", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    victim, deadline = None, time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        for path in (tmp_path / "s" / "stages").glob("sleepy-*/ledger/*.jsonl"):
            if path.read_text().count('"done"') >= 2:
                victim = int(path.stem.rsplit("-", 1)[1])  # ledger/<host>-<pid>.jsonl
                break
        time.sleep(0.02)
    assert victim is not None and victim != proc.pid, "no worker wrote an item within 60 s"
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert re.search(r"error: a worker process of stage sleepy-\w+ died .*re-run the same "
                     "command", err), err
    first = done_lines(tmp_path / "s", "s")
    assert 2 <= len(first) < n

    again = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    assert again.returncode == 0, again.stderr
    assert f"{n - len(first)} done, {len(first)} skipped" in again.stdout
    counts = done_lines(tmp_path / "s", "s")
    assert sorted(counts) == sorted(item_ids(n)) and set(counts.values()) == {1}
    verify = cli("cache", "verify", "--store", tmp_path / "s")
    assert verify.exit_code == 0 and "0 problem(s)" in verify.output  # none corrupt
    loaded = load_all(tmp_path / "s", "s")
    assert_same_items(loaded, load_all(tmp_path / "ref", "s"))
    assert_matches_literal(loaded)


def test_status_reports_done_failed_pending_and_reasons(cli, tmp_path):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 10)
    store.set_name("s", stage)
    ids = stage.items.ids
    run_items(stage, ids[:6], SleepyCompute(bad=[ids[2]]), on_error="skip", jobs=2)
    proc = cli("status", "--store", tmp_path / "s", "s", "--check")
    assert proc.exit_code == 1
    assert "items: 10 total, 5 done, 1 failed, 4 pending (50.0% done)" in proc.stdout
    assert f"failed: {ids[2]}: bad test item" in proc.stdout
    ledgers = re.findall(r"^  \S+-\d+: (\d+) done, (\d+) failed", proc.stdout, re.M)
    assert sum(int(d) for d, _ in ledgers) == 5 and sum(int(f) for _, f in ledgers) == 1
    assert "status: incomplete: 5 done, 1 failed, 4 pending" in proc.stdout
    run_items(stage, ids, SleepyCompute())
    proc = cli("status", "--store", tmp_path / "s", "s", "--check")
    assert proc.exit_code == 0
    assert "items: 10 total, 10 done, 0 failed, 0 pending (100.0% done)" in proc.stdout
    assert "recomputed" not in proc.stdout
    n_ledgers = int(re.search(r"ledgers: (\d+)", proc.stdout).group(1))
    short = cli("status", "--store", tmp_path / "s", "s", "--show-ledgers", 1)
    assert f"  ... and {n_ledgers - 1} more" in short.output
    run_items(stage, ids[:1], SleepyCompute(), force=True)
    proc = cli("status", "--store", tmp_path / "s", "s")
    assert f"recomputed: 1 item(s) have more than one done line (e.g. {ids[0]!r}" in proc.stdout
    missing = cli("status", "--store", tmp_path / "s", "nope")
    assert missing.exit_code == 1 and "error: no stage named 'nope'" in missing.output


def test_write_failure_is_recorded_not_fatal(tmp_path):
    class NaNCompute(SleepyCompute):
        def __call__(self, ids):
            out = super().__call__(ids)
            out[0].array[0, 0] = np.nan
            return out

    stage = sleepy_stage(Store(tmp_path / "s"), 3)
    summary = run_items(stage, stage.items.ids, NaNCompute(), on_error="skip")
    assert summary.done == 0 and len(summary.failed) == 3
    assert all("NaN" in reason for reason in summary.failed.values())
