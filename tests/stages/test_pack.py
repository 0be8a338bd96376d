"""featpipe cache pack: HDF5 shards, bit-exact round trip, transparent reads, safe repacking."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from featpipe.cli.cache_pack import pack
from featpipe.errors import FeatpipeError
from featpipe.fileio import safe_stem, shard_of
from featpipe.parallel import run_items
from featpipe.store import Store
from featpipe.store.pack import pack_stage, repair_pack
from tests._computes import SleepyCompute, expected_array, sleepy_stage
from tests._stores import assert_same_items, load_all, write_npy_dataset


def finished_stage(tmp_path, n=20):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, n)
    run_items(stage, stage.items.ids, SleepyCompute())
    store.set_name("s", stage)
    return store, stage


def loose_files(stage):
    return sorted((stage.path / "items").rglob("*.npy"))


def test_pack_command_moves_items_into_hdf5_and_reads_stay_identical(tmp_path):
    store, stage = finished_stage(tmp_path)
    before = {i: (stage.read_item(i), stage.extras_of(i)) for i in stage.items.ids}
    result = CliRunner().invoke(pack, ["--store", str(tmp_path / "s"), "s", "--shards", "3"])
    assert result.exit_code == 0, result.output
    assert "packed 20 items into 3 HDF5 file(s)" in result.output
    assert "removed 40 loose file(s)" in result.output  # 20 arrays + 20 timestamps sidecars
    assert loose_files(stage) == []
    files = sorted((stage.path / "packed").glob("shard-*.h5"))
    assert [f.name.split(".")[0] for f in files] == [f"shard-{k:04d}-of-0003" for k in range(3)]
    for k, path in enumerate(files):  # each file holds exactly its shard's items
        with h5py.File(path, "r") as handle:
            ids = handle["ids"].asstr()[()].tolist()
            assert ids and all(shard_of(i, 3) == k for i in ids)
            assert set(handle["items"]) == {safe_stem(i) for i in ids}
    reopened = Store(tmp_path / "s").resolve("s")
    assert reopened.done_ids() == set(stage.items.ids) and reopened.is_complete()
    for item_id, (array, extras) in before.items():
        got = reopened.read_item(item_id)
        assert got.dtype == array.dtype and got.tobytes() == array.tobytes()
        assert got.tobytes() == expected_array(item_id).tobytes()
        assert reopened.extras_of(item_id).keys() == extras.keys()
        assert reopened.read_extra(item_id, "timestamps").tobytes() == \
            extras["timestamps"].tobytes()
    again = run_items(reopened, reopened.items.ids, SleepyCompute())
    assert (again.done, again.skipped) == (0, 20)  # a packed stage stays complete
    with pytest.raises(FeatpipeError, match="not computed"):
        reopened.read_item("no-such-id")


def test_repack_replaces_old_files_and_keep_files(tmp_path):
    _, stage = finished_stage(tmp_path, n=8)
    summary = pack_stage(stage, shards=2, keep_files=True)
    assert summary.removed == 0 and len(loose_files(stage)) == 16
    first = set((stage.path / "packed").glob("*.h5"))
    pack_stage(stage, shards=1)  # reads loose files, writes a new generation, removes the old
    files = set((stage.path / "packed").glob("*.h5"))
    assert len(files) == 1 and not files & first and loose_files(stage) == []
    pack_stage(stage, shards=4, jobs=2)  # repack from the packed files, 2 processes
    packed = stage.packed()
    assert packed.n_shards == 4 and len(set((stage.path / "packed").glob("*.h5"))) == 4
    for item_id in stage.items.ids:
        assert stage.read_item(item_id).tobytes() == expected_array(item_id).tobytes()


def test_pack_refuses_unfinished_stage_and_keeps_files(tmp_path):
    store = Store(tmp_path / "s")
    stage = sleepy_stage(store, 6)
    run_items(stage, stage.items.ids[:4], SleepyCompute())
    store.set_name("s", stage)
    result = CliRunner().invoke(pack, ["--store", str(tmp_path / "s"), "s"])
    assert result.exit_code == 1
    assert "is not finished (4 of 6 items done" in str(result.exception)
    assert len(loose_files(stage)) == 8 and not (stage.path / "packed").exists()


def test_item_rewritten_after_packing_wins_over_the_pack(tmp_path):
    _, stage = finished_stage(tmp_path, n=4)
    pack_stage(stage)
    item_id = stage.items.ids[0]
    stage.write_item(item_id, np.zeros((2, 5), np.float32))
    assert stage.read_item(item_id).tobytes() == np.zeros((2, 5), np.float32).tobytes()
    assert stage.read_item(stage.items.ids[1]).tobytes() == \
        expected_array(stage.items.ids[1]).tobytes()
    assert stage.extras_of(item_id) == {}  # the packed sidecars belonged to the old array
    assert stage.read_extra(item_id, "timestamps") is None


def test_encode_reads_a_packed_input_stage_transparently(cli, tmp_path):
    manifest = write_npy_dataset(tmp_path, n=6)
    results = {}
    for store, packed in (("plain", False), ("packed", True)):
        args = ["--store", tmp_path / store]
        assert cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--name",
                   "feats", *args).exit_code == 0
        if packed:
            assert cli("cache", "pack", *args, "feats").exit_code == 0
            feats = Store(tmp_path / store).resolve("feats")
            assert loose_files(feats) == [] and feats.is_complete()
            verified = cli("cache", "verify", *args, "feats")
            assert verified.exit_code == 0, verified.output
        result = cli("encode", "--input", "feats", "--method", "rankpool", "--name", "rp", *args)
        assert result.exit_code == 0, result.output
        results[store] = load_all(tmp_path / store, "rp")
    assert_same_items(results["packed"], results["plain"])


def test_a_second_packer_is_refused_while_one_runs(tmp_path):
    _, stage = finished_stage(tmp_path, n=3)
    with stage.exclusive("pack", lambda: None), \
            pytest.raises(FeatpipeError, match="is being packed by another process"):
        pack_stage(stage)
    assert len(loose_files(stage)) == 6 and stage.packed() is None


def test_a_pack_repair_is_refused_while_a_pack_runs(tmp_path):
    """cache verify --repair rewrites packed files (integrity) under the pack lock (faults):
    never while a pack writes the same stage's files."""
    _, stage = finished_stage(tmp_path, n=3)
    pack_stage(stage)
    index = (stage.path / "packed" / "pack.json").read_bytes()
    files = sorted(p.name for p in (stage.path / "packed").glob("shard-*.h5"))
    with stage.exclusive("pack", lambda: None), \
            pytest.raises(FeatpipeError, match="is being packed by another process"):
        repair_pack(stage, set(), set(files))
    assert (stage.path / "packed" / "pack.json").read_bytes() == index
    assert sorted(p.name for p in (stage.path / "packed").glob("shard-*.h5")) == files
