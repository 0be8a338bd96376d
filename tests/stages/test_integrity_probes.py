"""The held-out fault probes of issue 39, each as a user's disk or hands would do it: every
one failed on main at b04aebc (silent wrong results, states no command recovered) and
passes now.  Through the command line, in-process (``cli``), unless the process is what is
tested."""

from __future__ import annotations

import json
import os
import re

import h5py
import numpy as np
import pytest

from featpipe.checksums import seal_json
from featpipe.fileio import safe_stem
from featpipe.manifest import from_rows
from featpipe.store import Stage, Store, ledger_owner
from featpipe.store.packed import open_h5
from tests._stores import imported_store
from tests.conftest import one_line_error, run_cli


def problems(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("problem:")]


@pytest.fixture
def feat(tmp_path, cli):
    """A store with 12 imported (T, 8) items named ``feat`` and the command that made it."""
    return imported_store(tmp_path, cli)


def exported(cli, store, tmp_path, name="feat"):
    out = tmp_path / f"{name}-{len(list(tmp_path.glob('*.npz')))}.npz"
    cli("export", "--store", store, name, "-o", out, check=True)
    with np.load(out, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def same_export(left, right):
    assert left.keys() == right.keys()
    for key in left:
        assert left[key].tobytes() == right[key].tobytes(), key


def replace_bytes(path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) >= 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new, 1))


# -- silent wrong results -----------------------------------------------------------------------
def test_a_label_changed_in_items_csv_is_damage_not_a_new_label(feat, tmp_path, cli):
    store, command = feat
    before = exported(cli, store, tmp_path)
    items = Store(store).resolve("feat").path / "items.csv"
    replace_bytes(items, b",c1,", b",c2,")  # one byte: a label a -> b
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any("items.csv" in p and "damaged" in p
                                         for p in problems(verify)), verify.output
    export = cli("export", "--store", store, "feat", "-o", tmp_path / "x.npz")
    assert "items.csv" in one_line_error(export) and not (tmp_path / "x.npz").exists()
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    cli(*command, check=True)
    same_export(exported(cli, store, tmp_path), before)


def test_one_id_changed_in_items_csv_is_found_and_recovered(feat, tmp_path, cli):
    store, command = feat
    before = exported(cli, store, tmp_path)
    replace_bytes(Store(store).resolve("feat").path / "items.csv", b"v07,", b"v77,")
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any("items.csv" in p for p in problems(verify))
    encode = cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e")
    assert "items.csv" in one_line_error(encode)
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    cli(*command, check=True)
    same_export(exported(cli, store, tmp_path), before)
    cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e", check=True)


def _strip(line: str, *keys: str) -> str:
    entry = json.loads(line)
    return json.dumps({k: v for k, v in entry.items() if k not in keys})


@pytest.mark.parametrize("resealed", [False, True], ids=["seal-lost", "resealed"])
def test_a_ledger_line_that_lost_its_sums_is_damage_and_its_item_is_never_used(
        feat, cli, resealed):
    """The sums lost with the line's seal, or lost and the line sealed again (a writer that
    dropped them): either way the done line of a checksummed stage is damage."""
    store, command = feat
    stage = Store(store).resolve("feat")
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    lines = ledger.read_text().splitlines()
    at = next(k for k, line in enumerate(lines) if '"id": "v03"' in line)
    lines[at] = _strip(lines[at], "sums", "crc32")  # the record lost, the line still JSON
    if resealed:
        lines[at] = seal_json(lines[at].encode(), ledger_owner(stage.path.name)).decode()
    ledger.write_text("\n".join(lines) + "\n")
    path = stage.item_path("v03")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1, verify.output
    assert "written before featpipe kept checksums" not in verify.output
    assert any("line" in p and "damaged" in p for p in problems(verify))
    if resealed:
        assert any("without the checksum of its file" in p for p in problems(verify))
    encode = cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e")
    assert encode.exit_code == 1 and not Store(store).names().get("e")  # v03 is not used
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    assert "1 done, 11 skipped" in cli(*command, check=True).output
    cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e", check=True)
    assert cli("cache", "verify", "--store", store).exit_code == 0


def test_a_repaired_item_is_recorded_removed_and_counted_pending(feat, cli):
    """``verify --repair`` writes a ``removed`` ledger line for each item it removes, so the
    stage no longer counts it done (status says pending; the rerun computes it alone)."""
    store, command = feat
    path = Store(store).resolve("feat").item_path("v03")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    stage = Store(store).resolve("feat")
    assert stage.item_states()["v03"].status == "removed"
    assert "v03" not in stage.done_ids() and len(stage.done_ids()) == 11
    assert "1 done, 11 skipped" in cli(*command, check=True).output


def test_a_ledger_line_damaged_after_the_index_folded_it_is_found_by_verify(tmp_path, cli):
    """The index keeps the problems of the lines it folded and notices a changed ledger by
    its size, inode and the CRCs of its first and last 4 KiB; ``verify`` reads every line
    again, so bit rot in the middle of a long ledger (a flipped digit, size and times as
    they were) is named there, and the item of that line is not trusted."""
    items = from_rows([(f"v{i:03d}", "", ["c"], ["train"]) for i in range(120)], tmp_path)
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"n": 120}, items=items)
    for item_id in items.ids:
        stage.write_item(item_id, np.ones(2), seconds=0.125)
    assert stage.compact_index() and stage.index().done == 120
    assert stage.ledger_problems() == []
    (ledger,) = (stage.path / "ledger").glob("*.jsonl")
    text, before = ledger.read_bytes(), ledger.stat()
    assert len(text) > 3 * 4096
    at = text.index(b'"seconds": 0.125', len(text) // 2) + len(b'"seconds": 0.1')
    line = text[:at].count(b"\n") + 1
    ledger.write_bytes(text[:at] + b"3" + text[at + 1:])
    os.utime(ledger, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert Stage(stage.path).ledger_problems() == []  # the index did not notice
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    found = problems(verify)
    assert len(found) == 3, found
    assert f"{ledger.name} line {line}: damaged" in found[0]
    assert "index index.json: its counts differ from its ledgers'" in found[1]
    assert "v060" in found[2] and "no ledger line says its item is done" in found[2]


def test_a_packed_stage_that_lost_its_sums_and_crc_attributes_is_damage(feat, cli):
    store, command = feat
    cli("cache", "pack", "--store", store, "feat", "--shards", "2", check=True)
    stage = Store(store).resolve("feat")
    index = stage.path / "packed" / "pack.json"
    index.write_text(_strip(index.read_text(), "sums", "crc32"))
    for shard in (stage.path / "packed").glob("shard-*.h5"):
        with open_h5(shard, "r+") as handle:
            handle.visit(lambda key, h=handle: h[key].attrs.pop("crc32", None)
                         if isinstance(h[key], h5py.Dataset) else None)
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any("pack.json" in p for p in problems(verify))
    assert "written before featpipe kept checksums" not in verify.output
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    cli(*command, check=True)
    assert cli("cache", "verify", "--store", store).exit_code == 0


# -- states no command recovered ----------------------------------------------------------------
def sources(folder) -> dict[str, bytes]:
    """The bytes each item of ``write_npy_dataset`` imports (read from its own file, never
    through the store)."""
    return {p.stem: np.load(p).tobytes() for p in sorted((folder / "npy").glob("*.npy"))}


def _packed(feat, cli):
    """The store packed into two shards by another process (this one keeps no HDF5 file of
    it open: an open handle would read a file cut short after it was opened)."""
    store, command = feat
    run_cli("cache", "pack", "--store", store, "feat", "--shards", "2")
    stage = Store(store).resolve("feat")
    shards = sorted((stage.path / "packed").glob("shard-*.h5"))
    return store, command, stage, shards


def test_a_flipped_byte_in_a_shards_ids_is_repaired_and_recomputed(feat, tmp_path, cli):
    store, command, stage, shards = _packed(feat, cli)
    before = sources(tmp_path)
    with open_h5(shards[0]) as handle:
        ids = handle["ids"].asstr()[()].tolist()
        offset = handle["ids"].id.get_offset()
    data = bytearray(shards[0].read_bytes())
    if offset is None:  # ids stored in the global heap: find the first id's bytes
        offset = bytes(data).index(ids[0].encode())
    data[offset] ^= 0x01
    shards[0].write_bytes(bytes(data))
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any(shards[0].name in p for p in problems(verify))
    repair = cli("cache", "verify", "--store", store, "--repair")
    assert repair.exit_code == 0, repair.output
    cli(*command, check=True)
    again = Store(store).resolve("feat")
    assert {i: again.read_item(i).tobytes() for i in again.items.ids} == before
    assert cli("cache", "verify", "--store", store).exit_code == 0
    exported(cli, store, tmp_path)


def test_a_truncated_shard_is_repaired_and_recomputed(feat, tmp_path, cli):
    store, command, stage, shards = _packed(feat, cli)
    before = sources(tmp_path)
    shards[1].write_bytes(shards[1].read_bytes()[:shards[1].stat().st_size // 2])
    assert cli("cache", "verify", "--store", store).exit_code == 1
    repair = cli("cache", "verify", "--store", store, "--repair")
    assert repair.exit_code == 0, repair.output
    cli(*command, check=True)
    again = Store(store).resolve("feat")
    assert {i: again.read_item(i).tobytes() for i in again.items.ids} == before
    exported(cli, store, tmp_path)


def test_a_shard_damaged_outside_every_items_data_is_repaired_for_good(feat, cli):
    """A mutant's survivor (issue 39): the damage is in HDF5's own bytes, no item's."""
    store, command, stage, shards = _packed(feat, cli)
    with open_h5(shards[0]) as handle:
        spans = [(handle[f"items/{safe_stem(i)}"].id.get_offset(),
                  handle[f"items/{safe_stem(i)}"].id.get_storage_size())
                 for i in handle["ids"].asstr()[()]]
    data = bytearray(shards[0].read_bytes())
    free = next(k for k in range(len(data) - 1, 0, -1)
                if not any(start <= k < start + size for start, size in spans))
    data[free] ^= 0x01
    shards[0].write_bytes(bytes(data))
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any(shards[0].name in p for p in problems(verify))
    repair = cli("cache", "verify", "--store", store, "--repair")
    assert repair.exit_code == 0 and "0 repaired" not in repair.output, repair.output
    assert cli("cache", "verify", "--store", store).exit_code == 0


@pytest.mark.parametrize("damage", ["corrupt", "wrong key"])
def test_a_damaged_stage_json_is_removed_by_repair_and_recomputed(feat, tmp_path, cli,
                                                                 damage):
    store, command = feat
    before = exported(cli, store, tmp_path)
    meta = Store(store).resolve("feat").path / "stage.json"
    if damage == "corrupt":
        meta.write_bytes(meta.read_bytes()[:40])
    else:
        text = meta.read_text()
        key = json.loads(text)["key"]
        meta.write_text(text.replace(f'"key": "{key}"', f'"key": "{key[::-1]}"'))
    rerun = cli(*command)
    assert "verify --repair" in one_line_error(rerun)  # the error says what to do
    gc = cli("cache", "gc", "--store", store, "--min-age", "0")
    assert "Traceback" not in gc.output
    repair = cli("cache", "verify", "--store", store, "--repair")
    assert repair.exit_code == 0, repair.output
    assert "feat" not in Store(store).names()
    assert cli("cache", "gc", "--store", store, "--min-age", "0").exit_code == 0
    cli(*command, check=True)
    same_export(exported(cli, store, tmp_path), before)


def test_cache_rm_removes_a_name_and_its_damaged_stage(feat, cli):
    store, _ = feat
    stage = Store(store).resolve("feat")
    (stage.path / "stage.json").write_text("{not json")
    removed = cli("cache", "rm", "--store", store, "feat")
    assert removed.exit_code == 0, removed.output
    assert not stage.path.exists() and "feat" not in Store(store).names()
    assert not list((Store(store).stages_dir).iterdir())


def test_a_wrong_sha256_in_the_content_hash_cache_does_not_fail_the_import(feat, cli):
    store, command = feat
    before = Store(store).resolve("feat").name
    cache = store / "content-hashes.json"
    text = cache.read_text()
    sha = re.search(r'"([0-9a-f]{64})"', text).group(1)
    cache.write_text(text.replace(sha, sha[::-1], 1))
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1 and any("content-hashes.json" in p for p in problems(verify))
    rerun = cli(*command)
    assert rerun.exit_code == 0, rerun.output
    assert Store(store).resolve("feat").name == before  # the key of the true content
    assert cli("cache", "verify", "--store", store, "--repair").exit_code == 0
    assert cli("cache", "verify", "--store", store).exit_code == 0


def test_a_store_inside_another_store_is_refused_and_gc_spares_a_store(feat, tmp_path, cli):
    store, _ = feat
    for inner in (store / "stages" / "x", store / "names" / "y", store / "deep" / "z"):
        made = cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "npy",
                   "--store", inner, "--name", "feat")
        assert "inside the store" in one_line_error(made, code=2)
        assert not inner.exists()
    # one moved in by hand (or made before this rule): never deleted with the outer stage
    cli("import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "npy", "--store",
        tmp_path / "other", "--name", "kept", check=True)
    stage = Store(store).resolve("feat")
    nested = stage.path / "items" / "nested"
    os.rename(tmp_path / "other", nested)
    removed = cli("cache", "rm", "--store", store, "feat")
    assert "holds a featpipe store of its own" in one_line_error(removed)
    gc = cli("cache", "gc", "--store", store, "--min-age", "0")
    assert gc.exit_code == 1 and "holds a featpipe store of its own" in gc.output
    assert "kept" in Store(nested).names() and Store(nested).resolve("kept").is_complete()


def test_verify_of_a_name_whose_stage_json_is_damaged_repairs_it(feat, cli):
    store, command = feat
    meta = Store(store).resolve("feat").path / "stage.json"
    meta.write_bytes(meta.read_bytes()[:40])
    verify = cli("cache", "verify", "--store", store, "feat")
    assert verify.exit_code == 1 and "stage.json" in verify.output
    repair = cli("cache", "verify", "--store", store, "feat", "--repair")
    assert repair.exit_code == 0, repair.output
    assert "feat" not in Store(store).names()
    cli(*command, check=True)
    assert cli("cache", "verify", "--store", store, "feat").exit_code == 0
