"""featpipe submit --backend slurm: rendered job arrays, a real SLURM cluster, scancel + resume.

The ``slurm_env`` fixture starts a real single-node SLURM cluster (``tests/slurm_cluster.py``:
installs slurm-wlm and munge when root and absent, starts munged, slurmctld and slurmd, stops
what it started).  Rendering tests need no cluster: the rendered script is plain bash whose
``#SBATCH`` lines are comments, so running it with SLURM_ARRAY_TASK_ID set is one task.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.fileio import shard_of
from featpipe.manifest import from_rows
from featpipe.parallel import run_items
from featpipe.store import Store
from tests._computes import SleepyCompute, item_ids, sleepy_stage
from tests._stores import (
    assert_matches_literal,
    assert_same_items,
    done_lines,
    load_all,
    write_npy_dataset,
)
from tests.conftest import REPO, run_cli
from tests.slurm_cluster import ClusterUnavailable, start_cluster

SLEEPY = [sys.executable, "-m", "tests._computes", "sleepy"]


def sleepy_cmd(store, name, n_items, *extra):
    return [*SLEEPY, "--store", str(store), "--items", str(n_items), "--name", name,
            *map(str, extra)]


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory):
    """Environment for commands talking to a running single-node SLURM cluster."""
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as err:
        pytest.skip(f"no SLURM cluster: {err}")
    yield cluster.env
    cluster.stop()


# -- rendering (no cluster needed) ---------------------------------------------------------

@pytest.fixture
def feats(tmp_path, cli):
    """A store with a 3-item stage named ``f`` (the wrapped commands' checks pass)."""
    ids = ["x0", "x1", "x2"]
    from_rows([(i, "", ["a"], ["train"]) for i in ids], tmp_path).write(tmp_path / "m.csv")
    np.savez(tmp_path / "f.npz", **{i: np.ones((2, 2)) for i in ids})
    assert cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
               "--store", tmp_path / "s", "--name", "f").exit_code == 0
    return tmp_path / "s"


def test_dry_run_renders_array_script(cli, tmp_path, feats):
    proc = cli("submit", "--backend", "slurm", "--tasks", 4, "--array-throttle", 2,
                   "--partition", "gpu", "--time", "2:00:00", "--mem", "8G", "--gpus", 1,
                   "--cpus-per-task", 4, "--sbatch-option=--qos=long", "--dry-run", "--",
                   "featpipe", "encode", "--store", tmp_path / "s", "--input", "f",
                   "--method", "avg", "--name", "avg", "--jobs", 4)
    assert proc.exit_code == 0, proc.output
    script = proc.stdout
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --partition=gpu", "#SBATCH --time=2:00:00",
                 "#SBATCH --mem=8G", "#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --qos=long", "#SBATCH --job-name=featpipe-encode-avg",
                 f"#SBATCH --output={tmp_path / 's' / 'logs'}/%x-%A_%a.out"):
        assert line in script.splitlines(), line
    command = next(x for x in script.splitlines() if x.startswith("exec "))
    assert command == (f"exec {sys.executable} -P -m featpipe encode --store {tmp_path / 's'} "
                       "--input f --method avg --name avg --jobs 4 --executor slurm "
                       '--shard "${SLURM_ARRAY_TASK_ID}/4"')
    assert re.search(r"afterany.*featpipe status --store \S+ avg --check", script)
    assert "{{" not in script


def test_each_rendered_task_keeps_a_log_file(tmp_path, feats):
    """Issue 23: an array task's full record goes to LOG_DIR/JOB-<job>_<task>.log too."""
    script = run_cli("submit", "--backend", "slurm", "--tasks", 1, "--dry-run", "--",
                     "featpipe", "encode", "--store", feats, "--input", "f", "--method", "avg",
                     "--name", "avg").stdout
    (tmp_path / "task.sh").write_text(script)
    proc = subprocess.run(["bash", str(tmp_path / "task.sh")], capture_output=True, text=True,
                          env=_env(SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_JOB_ID="7"))
    assert proc.returncode == 0, proc.stderr
    log = (feats / "logs" / "featpipe-encode-avg-7_0.log").read_text()
    assert "featpipe.output: summary: 3 done" in log and "exit status 0 after" in log


def test_submit_usage_errors(cli, monkeypatch, feats):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    result = cli("submit", "--backend", "slurm", "--dry-run", "--", "featpipe", "encode")
    assert result.exit_code == 2 and "--backend slurm needs --tasks N" in result.output
    result = cli("submit", "--backend", "slurm", "--tasks", 2, "--dry-run", "--", "featpipe",
                 "encode", "--shard", "0/2")
    assert result.exit_code == 1
    assert "error: do not pass --shard in the stage command" in result.output
    result = cli("submit", "--backend", "dask", "--", "featpipe", "encode")
    assert result.exit_code == 2 and "--backend dask needs --scheduler ADDRESS" in result.output
    result = cli("submit", "--backend", "dask", "--scheduler", "tcp://h:8786", "--dry-run", "--",
                 "featpipe", "encode", "--store", feats, "--input", "f", "--method", "avg",
                 "--name", "x")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (f"{sys.executable} -P -m featpipe encode --store {feats} "
                                     "--input f --method avg --name x --executor dask "
                                     "--scheduler tcp://h:8786")


@pytest.mark.parametrize("stage_args, code, message", [
    (["--input", "f", "--method", "hrp", "--window", "0"], 2, "error: --window "),
    (["--input", "nope", "--method", "avg"], 1, "error: no stage named 'nope'"),
    (["--input", "f", "--method", "avg", "--no-such-flag"], 2, "No such option"),
])
def test_submit_runs_the_stage_commands_own_checks_first(feats, stage_args, code, message):
    """Issue 23: a wrapped command that would fail is refused before any job file exists,
    with its own error, dry run or not."""
    slurm, dask = ["slurm", "--tasks", "2"], ["dask", "--scheduler", "tcp://h:8786"]
    for backend in ([*slurm, "--dry-run"], slurm, [*dask, "--dry-run"]):
        proc = run_cli("submit", "--backend", *backend, "--", "featpipe", "encode",
                       "--store", feats, "--name", "e", *stage_args, check=False)
        assert proc.returncode == code, proc.stderr
        assert message in proc.stderr and "nothing submitted" in proc.stderr
        assert proc.stdout == "" and not (feats / "logs").exists()
        assert sorted(Store(feats).names()) == ["f"]
    proc = run_cli("submit", "--backend", *slurm, "--dry-run", "--", "featpipe", "classify",
                   "--store", feats, "--input", "f", check=False)
    assert proc.returncode == 2 and "is not an item-parallel stage command" in proc.stderr


def test_what_depends_on_the_node_is_checked_on_the_node(feats, tmp_path):
    """Issue 30: docs/cluster.md's first example failed on a machine without a GPU: the check
    before submitting tested --device cuda and --jobs against the submitting machine.  They
    are deferred to each task's node, and the check says so; the task itself still checks
    them (``--jobs 0`` and a bad ``--device`` value stay usage errors at once)."""
    stage = ["featpipe", "encode", "--store", feats, "--input", "f", "--method", "avg",
             "--name", "e", "--device", "cuda", "--jobs", 4096]
    proc = run_cli("submit", "--backend", "slurm", "--tasks", 2, "--gpus", 1, "--dry-run", "--",
                   *stage, check=False)
    assert proc.returncode == 0, proc.stderr
    checked = next(line for line in proc.stderr.splitlines() if line.startswith("checked: "))
    assert checked.endswith("dry run: 3 to compute, 0 already complete; checked on each "
                            "task's node: --device cuda, --jobs 4096")
    assert "more than the" not in proc.stderr
    assert "# checked on each task's node: --device cuda, --jobs 4096" in proc.stdout
    for bad, message in ((["--jobs", "0"], "--jobs must be a positive number"),
                         (["--device", "tpu"], "--device")):
        proc = run_cli("submit", "--backend", "slurm", "--tasks", 2, "--dry-run", "--",
                       *stage, *bad, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_rendered_tasks_run_as_bash_equal_local_run(tmp_path):
    """Each array task, run by bash as SLURM would, computes its shard; together: all items."""
    n, tasks = 10, 2
    local_run(tmp_path / "local", n)
    script = run_cli("submit", "--backend", "slurm", "--tasks", tasks, "--dry-run", "--",
                     *sleepy_cmd(tmp_path / "array", "s", n)).stdout
    (tmp_path / "task.sh").write_text(script)
    for task in range(tasks):
        proc = subprocess.run(["bash", str(tmp_path / "task.sh")], capture_output=True,
                              text=True, env=_env(SLURM_ARRAY_TASK_ID=str(task),
                                                  SLURM_ARRAY_JOB_ID="7"))
        assert proc.returncode == 0, proc.stderr
        mine = sum(shard_of(i, tasks) == task for i in item_ids(n))
        assert f"summary: {mine} done, 0 skipped (already complete), 0 failed, " \
               f"{n - mine} in other shards" in proc.stdout
    array = load_all(tmp_path / "array", "s")
    assert_same_items(array, load_all(tmp_path / "local", "s"))
    assert_matches_literal(array)


def local_run(store_dir, n):
    """The uninterrupted reference: the sleepy stage computed in this process."""
    store = Store(store_dir)
    stage = sleepy_stage(store, n)
    run_items(stage, stage.items.ids, SleepyCompute())
    store.set_name("s", stage)


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **extra)


# -- a real SLURM cluster ------------------------------------------------------------------

def _assert_real_stages_equal(left_store, right_store):
    for name in ("feats", "rp"):
        left, right = Store(left_store).resolve(name), Store(right_store).resolve(name)
        assert left.name == right.name  # same key: same parameters, same inputs
        assert_same_items(load_all(left_store, name), load_all(right_store, name))
        assert set(done_lines(right_store, name).values()) == {1}


@pytest.mark.slurm
def test_submit_import_and_encode_over_four_tasks_equals_local_run(slurm_env, cli, tmp_path):
    manifest = write_npy_dataset(tmp_path)
    import_args = ["import", "--manifest", manifest, "--from", tmp_path / "npy", "--name",
                   "feats"]
    encode_args = ["encode", "--input", "feats", "--method", "rankpool", "--name", "rp"]
    for args in (import_args, encode_args):
        assert cli(*args, "--store", tmp_path / "local").exit_code == 0
    for args in (import_args, encode_args):
        proc = run_cli("submit", "--backend", "slurm", "--tasks", 4, "--time", "5:00",
                       "--wait", "--", "featpipe", *args, "--store", tmp_path / "cluster",
                       env=slurm_env, cwd=tmp_path, timeout=120)
        assert re.search(r"submitted array job \d+ \(4 tasks\)", proc.stdout)
        assert "status: complete: 12 done, 0 failed, 0 pending" in proc.stdout  # report job
    _assert_real_stages_equal(tmp_path / "local", tmp_path / "cluster")
    stage = Store(tmp_path / "cluster").resolve("rp")
    ledgers = {}
    for source, entry in stage.ledger_with_source():
        ledgers.setdefault(source, set()).add(shard_of(entry.id, 4))
    assert len(ledgers) == 4 and all(len(shards) == 1 for shards in ledgers.values())
    logs = sorted((tmp_path / "cluster" / "logs").glob("featpipe-encode-rp-*_[0-3].out"))
    assert len(logs) == 4
    verify = run_cli("cache", "verify", "--store", tmp_path / "cluster")
    assert "0 problem(s)" in verify.stdout


@pytest.mark.slurm
def test_scancel_one_task_then_resubmit_completes_without_recomputing(slurm_env, tmp_path):
    n, tasks, store = 12, 2, tmp_path / "cluster"  # shards of 4 and 8 items
    victims = [i for i in item_ids(n) if shard_of(i, tasks) == 1]
    assert len(victims) == 8
    local_run(tmp_path / "local", n)
    submit = [sys.executable, "-m", "featpipe", "submit", "--backend", "slurm", "--tasks",
              str(tasks), "--wait", "--", *sleepy_cmd(store, "s", n, "--sleep", 0.3)]
    env = _env(**slurm_env)
    proc = subprocess.Popen(submit, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    job_id = re.search(r"submitted array job (\d+)", proc.stdout.readline()).group(1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until task 1 has written its first item
        ledgers = (store / "stages").glob("sleepy-*/ledger/*.jsonl")
        if any(f'"id": "{victims[0]}", "status": "done"' in path.read_text()
               for path in ledgers):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("array task 1 wrote nothing within 60 s")
    victim = 1
    subprocess.run(["scancel", f"{job_id}_{victim}"], check=True, env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "not complete" in err and "submit the same command again" in err
    first = done_lines(store, "s")
    assert 1 <= sum(i in first for i in victims) < len(victims)  # killed mid-shard

    again = run_cli(*submit[3:], env=slurm_env, cwd=tmp_path, timeout=120)
    assert f"status: complete: {n} done, 0 failed, 0 pending" in again.stdout
    counts = done_lines(store, "s")
    assert sorted(counts) == sorted(item_ids(n))  # none missing
    assert set(counts.values()) == {1}  # none computed twice
    verify = run_cli("cache", "verify", "--store", store)
    assert "0 problem(s)" in verify.stdout  # none corrupt
    cluster = load_all(store, "s")
    assert_same_items(cluster, load_all(tmp_path / "local", "s"))
    assert_matches_literal(cluster)
