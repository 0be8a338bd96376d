"""``extract --features dt`` on dask workers (a real distributed.LocalCluster) equals the local
run: the stateful tracker runs in each batch's decoding worker there."""

from __future__ import annotations

import pytest

from tests._stores import assert_same_items, done_lines, load_all
from tests.cli.test_extract_cli import write_manifest
from tests.cluster.test_dask import scheduler  # noqa: F401 - the fixture
from tests.stages.test_extract_trajectories import SMALL, write_clips

pytest.importorskip("distributed")


def test_dask_dt_extract_equals_local_run(scheduler, cli, tmp_path):  # noqa: F811
    ids = write_clips(tmp_path)
    manifest = write_manifest(tmp_path, [(i, f"{i}.avi", i, "train") for i in ids])
    args = ["extract", "-m", manifest, "-f", "dt", "-n", "t",
            *[f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]]
    assert cli(*args, "-s", tmp_path / "local").exit_code == 0
    result = cli(*args, "-s", tmp_path / "dask", "--executor", "dask", "--scheduler", scheduler)
    assert result.exit_code == 0, result.output
    assert "summary: 2 done, 0 skipped (already complete), 0 failed" in result.output
    assert_same_items(load_all(tmp_path / "dask", "t"), load_all(tmp_path / "local", "t"))
    assert set(done_lines(tmp_path / "dask", "t").values()) == {1}
