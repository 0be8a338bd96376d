"""Store inspection (issue 13 item 5: `cache ls` columns, `cache show`, `--json` on `ls` and
`status`, fit stages show their model) and `status` of a stage that stopped (issue 16: 17)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.fileio import HOST
from featpipe.parallel import available_cores
from featpipe.stages.base import latest_stage
from featpipe.store import Store
from tests._stores import write_npy_dataset
from tests.conftest import REPO


def pipeline(tmp_path, run):
    """An import stage (12 items), a standardize model fitted on it, an avg encoding of it,
    each computed by ``run`` (the ``cli`` fixture, or ``run_cli`` for processes that end)."""
    manifest = write_npy_dataset(tmp_path / "data", n=12, dim=4)
    store = tmp_path / "s"
    run("import", "--manifest", manifest, "--from", tmp_path / "data" / "npy", "--store",
        store, "--name", "seq", check=True)
    run("fit", "standardize", "--store", store, "--input", "seq", "--name", "std", check=True)
    run("encode", "--store", store, "--input", "seq", "--method", "avg", "--name", "avg",
        check=True)
    return Store(store)


def test_13_5_ls_json_and_show_of_item_and_fit_stages(tmp_path, cli):
    store = pipeline(tmp_path, cli)
    listing = json.loads(cli("cache", "ls", "--store", store.root, "--json", check=True).stdout)
    by_name = {",".join(row["names"]): row for row in listing["stages"]}
    assert set(by_name) == {"seq", "std", "avg"} and listing["problems"] == []
    seq, std, avg = by_name["seq"], by_name["std"], by_name["avg"]
    assert seq["items"] == {"total": 12, "done": 12, "failed": 0, "pending": 0, "ledgers": 1}
    assert seq["size_bytes"] == sum(p.stat().st_size for p in
                                    (store.root / "stages" / seq["stage"]).rglob("*")
                                    if p.is_file())
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", seq["created"])
    assert avg["params"]["method"] == "avg" and avg["inputs"] == [seq["stage"]]
    assert std["items"] is None and std["models"] == ["standardize"]  # not 0/0/0

    table = cli("cache", "ls", "--store", store.root, check=True).stdout.splitlines()
    row = next(line.split() for line in table if line.startswith("std "))
    assert row[3:6] == ["model", "-", "-"]

    shown = cli("cache", "show", "--store", store.root, "std", check=True).stdout
    assert f"stage {std['stage']} as std (standardize)" in shown
    assert "  split: 1" in shown
    assert f"  {seq['stage']} (seq): " in shown  # the inputs chain
    assert re.search(r"^    mean: \(4,\) float(32|64)$", shown, re.M), shown
    assert re.search(r"^    scale: \(4,\) float(32|64)$", shown, re.M), shown
    model = json.loads(cli("cache", "show", "--store", store.root, "std", "--json",
                           check=True).stdout)
    arrays = model["models"]["standardize"]["arrays"]
    assert arrays["mean"]["shape"] == [4] and model["input_chain"][0]["stage"] == seq["stage"]
    assert model["models"]["standardize"]["meta"] == Store(store.root).resolve(
        "std").load_model("standardize")[1]

    shown = cli("cache", "show", "--store", store.root, "avg", check=True).stdout
    assert "items: 12 total, 12 done, 0 failed, 0 pending" in shown
    assert "  method: \"avg\"" in shown
    assert re.search(r"^item 'v\d\d': \(4,\) float32$", shown, re.M), shown
    assert re.search(r"^timings: .* of compute in 1 process\(es\), ", shown, re.M), shown
    info = json.loads(cli("cache", "show", "--store", store.root, "avg", "--json",
                          check=True).stdout)
    assert info["timings"]["processes"] == 1
    assert isinstance(info["timings"]["compute_seconds"], float)  # recorded, as a number
    assert [node["stage"] for node in info["input_chain"]] == [seq["stage"]]


def test_13_5_status_json_and_status_of_a_fit_stage(tmp_path, cli):
    # computed in this process, which lives on (as a notebook or a dask worker would): the
    # finished stages are not running; while a run marks one, it is
    store = pipeline(tmp_path, cli)
    data = json.loads(cli("status", "--store", store.root, "seq", "--json", check=True).stdout)
    assert data["total"] == 12 and data["done"] == 12 and data["complete"] is True
    assert data["running"] is False and data["eta_seconds"] is None
    assert len(data["ledgers"]) == 1 and data["ledgers"][0]["done"] == 12
    assert data["ledgers"][0]["active"] is False
    stage = latest_stage(store, "seq")
    stage.mark_running()
    try:
        data = json.loads(cli("status", "--store", store.root, "seq", "--json").stdout)
        assert data["running"] is True and data["ledgers"][0]["active"] is True
        text = cli("status", "--store", store.root, "seq").stdout
        assert f"running: computed now by {HOST}-{os.getpid()}" in text
    finally:
        stage.unmark_running()
    fit = cli("status", "--store", store.root, "std", "--check", check=True)
    assert "a fitted-model stage, no items" in fit.stdout
    assert "status: complete: model fitted" in fit.stdout and "0 total" not in fit.stdout


def test_16_17_status_of_a_stopped_failed_stage_shows_no_time_left(tmp_path, cli):
    cmd = [sys.executable, "-m", "tests._computes", "sleepy", "--store", str(tmp_path / "s"),
           "--items", "30", "--name", "s", "--bad", "video/005"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    failed = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    assert failed.returncode == 1 and "video/005" in failed.stderr
    status = cli("status", "--store", tmp_path / "s", "s")
    out = status.stdout
    assert re.search(r"^rate: \S+ items/s while it ran$", out, re.M), out
    assert "left" not in out
    assert "running: no process is computing this stage now" in out
    assert "failed: video/005: bad test item" in out
    data = json.loads(cli("status", "--store", tmp_path / "s", "s", "--json", check=True).stdout)
    assert data["eta_seconds"] is None and data["running"] is False
    assert data["failed_items"] == {"video/005": "bad test item"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.skipif(available_cores() < 2, reason="--jobs 2 runs in-process on one core")
def test_16_16_workers_exit_when_their_parent_is_killed(tmp_path):
    cmd = [sys.executable, "-m", "tests._computes", "sleepy", "--store", str(tmp_path / "s"),
           "--items", "40", "--sleep", "0.5", "--jobs", "2"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # no pipes: orphaned workers would hold them open and a read would wait for them
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, cwd=REPO)
    workers: set[int] = set()
    deadline = time.monotonic() + 120
    while len(workers) < 1 and time.monotonic() < deadline:
        for path in (tmp_path / "s" / "stages").glob("sleepy-*/ledger/*.jsonl"):
            host, _, pid = path.stem.rpartition("-")
            if host == HOST and int(pid) != proc.pid:
                workers.add(int(pid))
        time.sleep(0.05)
    assert workers, "no worker wrote an item within 120 s"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in workers if _alive(pid)]
    for pid in alive:  # leave nothing behind, whatever the outcome
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their SIGKILLed parent"
    assert np.isfinite(Store(tmp_path / "s").all_stages()[0].read_item(
        next(iter(Store(tmp_path / "s").all_stages()[0].done_ids())))).all()
