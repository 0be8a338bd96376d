"""--executor dask on a real distributed.LocalCluster (2 worker processes, 1 thread each)."""

from __future__ import annotations

import os

import pytest

from featpipe.errors import FeatpipeError
from featpipe.parallel import run_items
from featpipe.store import Store
from tests._computes import SleepyCompute, item_ids, sleepy_stage
from tests._stores import (
    assert_same_items,
    done_lines,
    load_all,
    write_npy_dataset,
)
from tests.conftest import REPO, run_cli

distributed = pytest.importorskip("distributed")

@pytest.fixture(scope="module")
def scheduler():
    """Address of a LocalCluster whose worker processes can import featpipe and tests."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None, host="127.0.0.1") as cluster:
            yield cluster.scheduler_address
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def test_submit_dask_encode_equals_local_run(scheduler, cli, tmp_path):
    manifest = write_npy_dataset(tmp_path)
    encode = ["encode", "--input", "feats", "--method", "rankpool", "--name", "rp"]
    for store in ("local", "dask"):
        assert cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--name",
                   "feats", "--store", tmp_path / store).exit_code == 0
    assert cli(*encode, "--store", tmp_path / "local").exit_code == 0
    proc = run_cli("submit", "--backend", "dask", "--scheduler", scheduler, "--",
                   "featpipe", *encode, "--store", tmp_path / "dask")
    assert f"--executor dask --scheduler {scheduler}" in proc.stdout
    assert "summary: 12 done, 0 skipped (already complete), 0 failed" in proc.stdout
    local, dask = Store(tmp_path / "local").resolve("rp"), Store(tmp_path / "dask").resolve("rp")
    assert local.name == dask.name
    assert_same_items(load_all(tmp_path / "dask", "rp"), load_all(tmp_path / "local", "rp"))
    assert set(done_lines(tmp_path / "dask", "rp").values()) == {1}
    workers = {source for source, _ in dask.ledger_with_source()}
    assert 1 <= len(workers) <= 2  # the dask workers wrote their own ledgers


def test_dask_failed_item_and_resume(scheduler, tmp_path):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 12)
    bad = item_ids(12)[5]
    summary = run_items(stage, stage.items.ids, SleepyCompute(bad=[bad]), executor="dask",
                        scheduler=scheduler, batch_size=4, on_error="skip")
    assert summary.done == 11 and summary.failed == {bad: "bad test item"}
    with pytest.raises(FeatpipeError, match=f"{bad}: bad test item"):
        run_items(stage, stage.items.ids, SleepyCompute(bad=[bad]), executor="dask",
                  scheduler=scheduler)
    again = run_items(stage, stage.items.ids, SleepyCompute(), executor="dask",
                      scheduler=scheduler, batch_size=4)
    assert (again.done, again.skipped, again.failed) == (1, 11, {})
    assert set(done_lines(tmp_path / "s", stage.name).values()) == {1}


def test_dask_extract_equals_local_run(scheduler, cli, tmp_path):
    """Extraction on dask workers: each batch runs the pipeline there and writes its items."""
    from tests.cli.test_extract_cli import write_manifest
    from tests.unit.test_video import write_video

    for k in range(4):
        write_video(tmp_path / f"v{k}.mp4", n_frames=10 + k, size=(96, 80))
    manifest = write_manifest(tmp_path, [(f"v{k}", f"v{k}.mp4", "a", "train")
                                         for k in range(4)])
    args = ["extract", "-m", manifest, "-f", "dsift", "--sizes", "8", "--step", "8",
            "--every", "3", "--encode", "spatial-grid", "-n", "grid"]
    assert cli(*args, "-s", tmp_path / "local").exit_code == 0
    result = cli(*args, "-s", tmp_path / "dask", "--executor", "dask", "--scheduler",
                 scheduler)
    assert result.exit_code == 0, result.output
    assert "summary: 4 done, 0 skipped (already complete), 0 failed" in result.output
    assert_same_items(load_all(tmp_path / "dask", "grid"), load_all(tmp_path / "local", "grid"))
    assert set(done_lines(tmp_path / "dask", "grid").values()) == {1}
