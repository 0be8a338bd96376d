"""Tests for the survivors of the mutation run of featpipe/stages/cache.py (issue 39 §6)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.checksums import seal_json
from featpipe.fileio import HOST
from featpipe.manifest import Manifest, from_rows
from featpipe.stages.cache import gc
from featpipe.store import RUNNING_DIR, Store, pointer_bytes, record_owner
from featpipe.store import index as stage_index
from featpipe.store.batches import BATCH_DIR
from featpipe.store.pack import pack_stage
from tests._stores import imported_store, make_old, named_view
from tests.conftest import one_line_error
from tests.stages.test_fault_recovery import filled_stage
from tests.stages.test_integrity_probes import problems, replace_bytes
from tests.stages.test_store_faults import make_stage, mounted


def aged(path, seconds: float = 3600) -> None:
    """Everything under ``path`` last written ``seconds`` ago."""
    past = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (past, past))


def flip_middle_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def damage_first_ledger_line(stage):
    """A digit of the first line's ``seconds`` changed: the line no longer passes its seal."""
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    text = ledger.read_bytes()
    at = text.index(b'"seconds": ') + len(b'"seconds": ')
    ledger.write_bytes(text[:at] + (b"7" if text[at:at + 1] != b"7" else b"8") + text[at + 1:])
    return ledger


def folder_bytes(path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.lstat().st_size for p in files), len(files)


def test_verify_claims_no_item_checked_while_the_item_list_is_damaged(tmp_path, cli):
    """Without a trusted item list no item can be checked: the summary says 0 checked, not
    12, and adds no "not computed" count (all 12 are done); ``--repair`` removes the list."""
    store, _ = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    replace_bytes(stage.path / "items.csv", b",c1,", b",c2,")
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1
    assert problems(verify)[0].startswith(
        f"problem: stage {stage.name}: record items.csv: damaged: {stage.path / 'items.csv'}: "
        "checksum crc32:"), verify.output
    assert f"BAD: stage {stage.name}: 0 items checked" in verify.output.splitlines()
    assert "verified 0 items in 1 stages: 1 problem(s)" in verify.output
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert "removed damaged items.csv" in repair.output
    assert "verified 0 items in 1 stages: 1 problem(s), 1 repaired" in repair.output


def test_repair_and_gc_refuse_a_read_only_store_before_anything_is_tried(tmp_path, cli):
    """``verify --repair`` and ``gc`` say up front that the store is read-only and that nothing
    was written, with damage to remove and an unnamed stage to collect; ``verify`` and
    ``gc --dry-run`` still run."""
    store, _ = imported_store(tmp_path, cli)
    item = Store(store).resolve("feat").item_path("v03")
    item.write_bytes(item.read_bytes()[:-8])
    orphan = make_stage(Store(store), "orphan")
    with mounted("--bind", store, tmp_path / "ro") as ro:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        verify = cli("cache", "verify", "--store", ro)
        assert verify.exit_code == 1 and "'v03'" in verify.output, verify.output
        dry = cli("cache", "gc", "--store", ro, "--min-age", "0", "--dry-run")
        assert dry.exit_code == 0 and f"would remove stage {orphan.name}" in dry.output
        for args in (["verify", "--repair"], ["gc", "--min-age", "0"]):
            line = one_line_error(cli("cache", *args, "--store", ro))
            assert "is read-only" in line and "nothing was written" in line, (args, line)
    assert orphan.path.exists()


def test_gc_refuses_a_negative_or_undefined_min_age_and_removes_nothing(tmp_path, cli):
    """``--min-age -1`` would remove the stages written a moment ago, ``nan`` and ``inf``
    mean no age at all: each is a usage error, and the fresh unnamed stage stays."""
    orphan = make_stage(Store(tmp_path / "s"), "orphan")
    for value in ("-1", "nan", "inf"):
        result = cli("cache", "gc", "--store", tmp_path / "s", "--min-age", value)
        assert one_line_error(result, code=2).startswith("error: --min-age must be a number "
                                                         "of minutes >= 0"), value
        assert orphan.path.exists(), value


def test_gc_keeps_a_stage_whose_only_recent_write_is_a_ledger_line(tmp_path):
    """A run that only appended a line to its ledger file (an item failed) changed no
    folder's mtime, only the file's: the stage is still in use and gc keeps it."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(4)], store.root)
    stage = store.stage("extract", {"n": 4}, items=items)
    for i in range(3):
        stage.write_item(f"v{i}", np.full((2, 3), i, np.float32))
    aged(stage.path)
    stage.record("v3", "failed", error="decoder gave up")
    assert gc(store).removed == [] and stage.path.exists()
    aged(stage.path)
    assert gc(store).removed == [stage.path]


def test_gc_min_age_is_in_minutes_for_stages_and_every_leftover(tmp_path, cli):
    """``--min-age 6000`` (100 hours): an unnamed stage, a stage folder without its record,
    an unlisted shard file and an unnamed batch file are kept at 99 hours, removed at 101."""
    store = Store(tmp_path / "s")
    named = filled_stage(store, 3)
    orphan = make_stage(store, "orphan")
    shard = named.path / "packed" / "shard-0000-of-0001.0123abcd.h5"
    batch = named.path / BATCH_DIR / "host-1-0123456789ab.00000000.npz"
    half = store.stages_dir / "encode-0123456789abcdef"
    for path in (shard, batch):
        path.parent.mkdir()
        path.write_bytes(b"left by a killed command")
    half.mkdir()
    for hours, gone in ((99, False), (101, True)):
        aged(store.root, hours * 3600)
        result = cli("cache", "gc", "--store", store.root, "--min-age", "6000")
        assert [p.exists() for p in (orphan.path, half, shard, batch)] == [not gone] * 4, \
            (hours, result.output)
    assert named.path.exists() and store.resolve("feats").is_complete()


def test_verify_counts_a_done_item_whose_file_is_gone_as_not_computed(tmp_path, cli):
    """A complete stage has no "not computed" note; once a done item's file is gone, the
    item is counted among those a re-run computes, though its ledger line says done."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 4)
    lines = cli("cache", "verify", "--store", store.root, check=True).output.splitlines()
    assert f"ok: stage {stage.name}: 4 items checked" in lines
    assert not [line for line in lines if line.startswith("note:")]  # every item has sums
    stage.item_path("v0002").unlink()
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert f"BAD: stage {stage.name}: 3 items checked (1 of 4 not computed)" in \
        verify.output.splitlines()


def test_gc_with_a_name_of_a_missing_stage_warns_and_still_collects(tmp_path, cli):
    """A name whose stage folder is gone keeps nothing (it is not a name that cannot be
    read): gc warns about it, keeps the named stage and removes the unnamed one."""
    store = Store(tmp_path / "s")
    kept = make_stage(store, "kept", name="k")
    orphan = make_stage(store, "orphan")
    (store.names_dir / "gone").write_bytes(pointer_bytes("gone", "encode-0123456789abcdef"))
    aged(store.root)
    result = cli("cache", "gc", "--store", store.root)
    assert result.exit_code == 0, result.output
    assert "warning: name 'gone' points to missing stage encode-0123456789abcdef" in \
        result.stderr
    assert not orphan.path.exists() and kept.path.exists()


def test_gc_leaves_the_tables_of_a_damaged_index_to_verify(tmp_path, cli):
    """gc does not guess which index table a damaged ``index.json`` names: it finishes,
    removes no table, and ``verify --repair`` then removes the index."""
    store, _ = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    tables = sorted(stage.path.glob(f"{stage_index.TABLE_PREFIX}*.npz"))
    assert tables
    flip_middle_byte(stage.path / stage_index.INDEX_FILE)
    aged(store)
    gc_run = cli("cache", "gc", "--store", store, "--min-age", "0")
    assert gc_run.exit_code == 0 and "Traceback" not in gc_run.output, gc_run.output
    assert sorted(stage.path.glob(f"{stage_index.TABLE_PREFIX}*.npz")) == tables
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert "removed the index (the next run writes it again)" in repair.output


@pytest.mark.parametrize("how", ["damaged", "deleted"])
def test_gc_with_a_damaged_or_lost_pack_index(tmp_path, cli, how):
    """A ``packed/pack.json`` cut short: gc cannot tell which shard files it lists and removes
    none; a deleted one lists none, so its shard files are those of a killed pack."""
    store, _ = imported_store(tmp_path, cli)
    cli("cache", "pack", "--store", store, "feat", check=True)
    packed = Store(store).resolve("feat").path / "packed"
    shards = sorted(packed.glob("shard-*.h5"))
    assert shards
    if how == "damaged":
        index = packed / "pack.json"
        index.write_bytes(index.read_bytes()[:40])
    else:
        (packed / "pack.json").unlink()
    aged(store)
    result = cli("cache", "gc", "--store", store, "--min-age", "0")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    if how == "damaged":
        assert sorted(packed.glob("shard-*.h5")) == shards
    else:
        assert not list(packed.glob("shard-*.h5"))
        assert all(f"removed shard file of a killed pack {path}" in result.output
                   for path in shards)


def test_show_names_a_cycle_in_the_inputs_chain_instead_of_recursing(tmp_path, cli):
    """A ``stage.json`` edited by hand (and sealed again) that makes a stage its own input,
    through its child: ``cache show`` of the child prints the chain up to the cycle."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(2)], tmp_path)
    base = store.stage("import", {"n": 2}, items=items)
    child = store.stage("encode", {"m": 1}, inputs=[base])
    store.set_name("c", child)
    text = json.dumps(dict(base.meta, inputs=[child.name]), indent=2, sort_keys=True)
    (base.path / "stage.json").write_bytes(
        seal_json(text.encode() + b"\n", record_owner(base.name, "stage.json")))
    show = cli("cache", "show", "--store", store.root, "c", check=True)
    assert f"{child.name} (c): cycle in the inputs chain" in show.output


def test_a_deleted_sidecar_is_named_and_its_item_removed_by_repair(tmp_path, cli):
    """The ledger line lists the item's sidecar: once the file is gone, verify names it and
    ``--repair`` removes the item, which a re-run then computes again."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 3)
    sidecar = stage.item_path("v0001").with_name(
        stage.item_path("v0001").name.removesuffix(".npy") + "+timestamps.npy")
    sidecar.unlink()
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert [p for p in problems(verify) if "item 'v0001': sidecar file(s) +timestamps.npy "
            "missing" in p], verify.output
    cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert not stage.item_path("v0001").exists()
    assert Store(store.root).resolve("feats").done_ids() == {"v0000", "v0002"}


def test_the_sidecars_of_items_written_before_checksums_are_not_strays(tmp_path, cli):
    """A ledger line from before checksums lists no files: the item's sidecars are its own,
    not files of no item, and ``--repair`` leaves them."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 3)
    make_old(store.root, item_sums=False)
    files = sorted((stage.path / "items").rglob("*.npy"))
    assert len(files) == 6
    verify = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert "verified 3 items in 1 stages: 0 problem(s), 0 repaired" in verify.output
    assert "note: 3 item(s) were written before featpipe kept checksums" in verify.output
    assert sorted((stage.path / "items").rglob("*.npy")) == files


def test_repair_leaves_the_ledger_of_a_stage_being_computed(tmp_path, cli):
    """While a process (here one of another host, seen recently) computes the stage, its
    ledger files are being appended to: ``--repair`` refuses to rewrite them, and does once
    no process computes the stage."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 3)
    ledger = damage_first_ledger_line(stage)
    before = ledger.read_bytes()
    marker = stage.path / RUNNING_DIR / "otherhost-4242"
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    line = one_line_error(cli("cache", "verify", "--store", store.root, "--repair"))
    assert f"stage {stage.name} is being computed now" in line
    assert ledger.read_bytes() == before
    marker.unlink()
    repair = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert f"rewrote ledger {ledger.name} without its 1 damaged line(s)" in repair.output
    assert Store(store.root).resolve("feats").done_ids() == {"v0001", "v0002"}


def test_repair_removes_the_packed_files_of_a_lost_pack_index(tmp_path, cli):
    """``packed/pack.json`` deleted: the packed items are lost to reads, verify says so, and
    ``--repair`` removes the packed files; the re-run computes the items again."""
    store, command = imported_store(tmp_path, cli)
    cli("cache", "pack", "--store", store, "feat", check=True)
    packed = Store(store).resolve("feat").path / "packed"
    shards = sorted(packed.glob("shard-*.h5"))
    (packed / "pack.json").unlink()
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1
    assert [p for p in problems(verify) if f"packed/pack.json: missing, while {len(shards)} "
            "packed file(s) are there and 12 done item(s) have no file" in p], verify.output
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert all(f"removed packed/{path.name} (its pack index is lost)" in repair.output
               for path in shards)
    assert "12 done item(s) whose file is missing: recomputed by a re-run" in repair.output
    assert not list(packed.glob("shard-*.h5"))
    assert "12 done, 0 skipped" in cli(*command, check=True).output
    assert "0 problem(s)" in cli("cache", "verify", "--store", store, check=True).output


def test_repair_removes_an_old_stage_folder_without_its_record(tmp_path, cli):
    """A stage folder an hour old without ``stage.json`` (a creation killed before its
    record): verify names it, ``--repair`` removes it and the store verifies clean."""
    store = Store(tmp_path / "s")
    kept = make_stage(store, "kept", name="k")
    half = store.stages_dir / "encode-0123456789abcdef"
    (half / "items").mkdir(parents=True)
    aged(store.root)
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert "problem: stage encode-0123456789abcdef: stage.json missing; `featpipe cache " \
        "verify --repair` removes the stage" in verify.output
    repair = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert "removed stage encode-0123456789abcdef" in repair.output and not half.exists()
    assert kept.path.exists()
    assert "0 problem(s)" in cli("cache", "verify", "--store", store.root, check=True).output


def test_show_lists_a_broken_or_missing_input_with_its_problem(tmp_path, cli):
    """``cache show`` of a stage whose input stage is damaged, then gone, still shows the
    stage, and names the input with what is wrong with it."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(2)], tmp_path)
    base = store.stage("import", {"n": 2}, items=items)
    child = store.stage("encode", {"m": 1}, inputs=[base])
    store.set_name("c", child)
    for damage, problem in ((lambda: (base.path / "stage.json").write_bytes(b"{"),
                             "stage.json: corrupt stage metadata"),
                            (lambda: shutil.rmtree(base.path), "(stage.json missing)")):
        damage()
        show = cli("cache", "show", "--store", store.root, "c", check=True)
        assert [line for line in show.output.splitlines()
                if line.startswith(f"  {base.name}: ") and problem in line], show.output


def test_show_and_gc_count_every_byte_and_file_of_a_stage(tmp_path, cli):
    """``cache show --json`` gives the bytes and the file count of the stage folder; gc frees
    the bytes of the stage and of the leftover folder it removes, to the byte."""
    store = Store(tmp_path / "s")
    make_stage(store, "kept", name="k")
    orphan = make_stage(store, "orphan")
    shown = json.loads(cli("cache", "show", "--store", store.root, "k", "--json",
                           check=True).stdout)
    assert (shown["size_bytes"], shown["files"]) == folder_bytes(store.resolve("k").path)
    assert shown["item_example"] == {"id": "kept0", "shape": [4, 3], "dtype": "float32",
                                     "extras": []}
    half = store.stages_dir / "encode-0123456789abcdef"
    (half / "items").mkdir(parents=True)
    (half / "items" / "a.npy").write_bytes(b"x" * 1000)
    expected = folder_bytes(orphan.path)[0] + 1000
    aged(store.root)
    result = gc(store, min_age=0)
    assert result.removed == [orphan.path] and not half.exists()
    assert result.freed == expected


def test_gc_spares_each_folder_holding_a_store_and_collects_the_rest(tmp_path, cli):
    """An unnamed stage and a leftover stage folder, each holding a store moved in by hand:
    gc names both as problems, removes neither, and still removes the plain unnamed stage."""
    store = Store(tmp_path / "s")
    make_stage(store, "kept", name="k")
    holder = make_stage(store, "holder")
    plain = make_stage(store, "plain")
    half = store.stages_dir / "encode-0123456789abcdef"
    half.mkdir()
    for k, folder in enumerate((holder.path / "items" / "nested", half / "nested")):
        make_stage(Store(tmp_path / f"other{k}"), "inner", name="mine")
        os.rename(tmp_path / f"other{k}", folder)
    aged(store.root)
    result = cli("cache", "gc", "--store", store.root, "--min-age", "0")
    assert result.exit_code == 1
    assert result.stderr.count("holds a featpipe store of its own") == 2, result.stderr
    assert "gc: removed 1 stage(s), 0 leftover(s) of killed commands" in result.stdout
    assert not plain.path.exists() and holder.path.exists() and half.exists()
    assert Store(half / "nested").resolve("mine").is_complete()


def test_verify_names_the_true_shape_and_dtype_of_items_of_a_store_before_checksums(
        tmp_path, cli):
    """Without checksums an item rewritten behind featpipe's back is found by its values: a
    2-d item of another feature size is named with its whole shape, a complex one with its
    dtype."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 4)
    make_old(store.root, item_sums=False)
    np.save(stage.item_path("v0002"), np.ones((6, 5), np.float32))
    np.save(stage.item_path("v0003"), np.ones((4, 3), np.complex64))
    found = problems(cli("cache", "verify", "--store", store.root))
    assert f"problem: stage {stage.name}: item 'v0002': shape (6, 5) but 3 other items are " \
        "arrays of shape (N, 3); a re-run of the stage's command with --force recomputes it" \
        in found, found
    assert f"problem: stage {stage.name}: item 'v0003': array has non-numeric dtype " \
        "complex64; a re-run of the stage's command with --force recomputes it" in found, found
    assert len(found) == 2, found


def test_a_view_of_a_source_with_a_damaged_pack_index_leaves_the_count_to_its_source(
        tmp_path, cli):
    """The source's pack index is damaged: its own lines say so and count its items not
    computed; the view reading it adds no count of its own."""
    store, source, view = named_view(tmp_path / "s")
    pack_stage(source)
    index = source.path / "packed" / "pack.json"
    index.write_bytes(index.read_bytes()[:40])
    lines = cli("cache", "verify", "--store", store.root).output.splitlines()
    assert f"BAD: stage {source.name}: 0 items checked (3 of 3 not computed)" in lines
    assert f"ok: stage {view.name}: 0 items checked" in lines


def test_ls_lists_a_fit_stage_by_its_model_names_without_reading_the_models(tmp_path, cli):
    """``cache ls`` shows a fit stage's model names; it reads no model, so a model file cut
    short (``verify`` names it) does not hide its stage from the listing."""
    store = Store(tmp_path / "s")
    base = make_stage(store, "import", name="b")
    fit = store.stage("fit", {"k": 2}, inputs=[base], items=Manifest([]))
    fit.save_model("pca", {"mean": np.zeros(3)}, {"n": 3})
    store.set_name("p", fit)
    npz = fit.path / "models" / "pca.npz"
    npz.write_bytes(npz.read_bytes()[:20])
    listed = json.loads(cli("cache", "ls", "--store", store.root, "--json", check=True).stdout)
    rows = {row["stage"]: row for row in listed["stages"]}
    assert rows[fit.name]["models"] == ["pca"] and rows[fit.name]["items"] is None
    assert listed["problems"] == []
    table = cli("cache", "ls", "--store", store.root, check=True).stdout.splitlines()
    assert ["p", fit.name, "fit", "model"] in [line.split()[:4] for line in table]


def test_verify_and_repair_names_of_a_missing_stage_and_of_one_without_its_record(
        tmp_path, cli):
    """Name ``gone`` points to no folder, name ``half`` to a folder whose ``stage.json`` was
    deleted (a named stage was complete: it is not one being created): verify names both and
    counts the broken stage, ``--repair`` removes both names and the folder."""
    store = Store(tmp_path / "s")
    make_stage(store, "kept", name="k")
    (store.names_dir / "gone").write_bytes(pointer_bytes("gone", "encode-0123456789abcdef"))
    half = make_stage(store, "half", name="half")
    (half.path / "stage.json").unlink()
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert problems(verify) == [
        "problem: name 'gone' points to missing stage encode-0123456789abcdef; `--repair` "
        "removes it and a re-run of the command that named it names it again",
        f"problem: stage {half.name}: stage.json missing, and name 'half' points to it; "
        "`featpipe cache verify --repair` removes the stage (and the names pointing at it); "
        "then run the command that computed it again"], verify.output
    assert "verified 3 items in 2 stages: 2 problem(s)" in verify.output
    repair = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert "2 problem(s), 2 repaired" in repair.output
    assert set(store.names()) == {"k"} and not half.path.exists()
    assert "0 problem(s)" in cli("cache", "verify", "--store", store.root, check=True).output


def test_verify_of_named_stages_counts_a_damaged_one_once(tmp_path, cli):
    """``verify k half``: ``half``'s ``stage.json`` is cut short; the summary counts the two
    stages asked for, one of them with its problem, and ``--repair`` removes it."""
    store = Store(tmp_path / "s")
    make_stage(store, "kept", name="k")
    half = make_stage(store, "half", name="half")
    meta = half.path / "stage.json"
    meta.write_bytes(meta.read_bytes()[:40])
    verify = cli("cache", "verify", "--store", store.root, "k", "half")
    assert verify.exit_code == 1
    assert "verified 3 items in 2 stages: 1 problem(s)" in verify.output
    repair = cli("cache", "verify", "--store", store.root, "k", "half", "--repair")
    assert repair.exit_code == 0 and "1 problem(s), 1 repaired" in repair.output
    assert not half.path.exists() and set(store.names()) == {"k"}


def test_repair_of_a_deleted_record_file_lets_the_rerun_write_it_again(tmp_path, cli):
    """``items.csv`` and ``read-hashes.json`` deleted: verify names each, ``--repair``
    succeeds though there is nothing to remove, and the re-run writes them again."""
    store, command = imported_store(tmp_path, cli)
    stage = Store(store).resolve("feat")
    for name in ("items.csv", "read-hashes.json"):
        (stage.path / name).unlink()
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1
    assert len([p for p in problems(verify) if "items.csv" in p or "read-hashes.json" in p]) \
        == 2, verify.output
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert "removed damaged items.csv" in repair.output
    assert "removed damaged read-hashes.json" in repair.output
    cli(*command, check=True)
    assert "0 problem(s)" in cli("cache", "verify", "--store", store, check=True).output


def test_gc_leaves_the_shard_files_of_a_pack_that_holds_its_lock(tmp_path):
    """While a pack holds the stage's pack lock (here this process, as ``cache pack`` does),
    an unlisted shard file may be the one it is writing: gc leaves it; once the lock is
    free, gc removes it as the file of a killed pack."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 3)
    shard = stage.path / "packed" / "shard-0000-of-0001.0123abcd.h5"
    shard.parent.mkdir()
    shard.write_bytes(b"being written")
    aged(store.root)

    def refuse():
        raise AssertionError("gc waited for the pack lock")

    with stage.exclusive("pack", refuse):
        assert gc(store, min_age=0).problems == [] and shard.exists()
    gc(store, min_age=0)
    assert not shard.exists()


def test_gc_counts_each_temporary_file_once_and_not_those_of_a_removed_stage(tmp_path, cli):
    """A stale temporary file (its process is gone) in ``stages/`` is a temporary file, not a
    folder of a killed gc; one inside a stage gc removes goes with the stage and is not
    listed or counted again, with ``--dry-run`` as without."""
    store = Store(tmp_path / "s")
    make_stage(store, "kept", name="k")
    orphan = make_stage(store, "orphan")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    loose = store.stages_dir / f"x.tmp.{HOST}.{int(dead.stdout)}"
    inner = orphan.path / "items" / f"y.npy.tmp.{HOST}.{int(dead.stdout)}"
    for path in (loose, inner):
        path.write_bytes(b"partial")
    aged(store.root)
    for verb, args in (("would remove", ["--dry-run"]), ("removed", [])):
        result = cli("cache", "gc", "--store", store.root, "--min-age", "0", *args,
                     check=True)
        assert f"{verb} temporary file {loose}" in result.output
        assert str(inner) not in result.output
        assert f"gc: {verb} 1 stage(s), 0 leftover(s) of killed commands and 1 temporary " \
            "file(s)" in result.output
    assert not loose.exists() and not orphan.path.exists()


def test_gc_reports_freed_space_in_decimal_megabytes(tmp_path, cli):
    """A stage of exactly 50,000 bytes is 0.05 MB (10^6 bytes), which ``.1f`` shows as 0.1,
    in its line and in the summary."""
    store = Store(tmp_path / "s")
    orphan = make_stage(store, "orphan")
    (orphan.path / "pad").write_bytes(b"x" * (50_000 - folder_bytes(orphan.path)[0]))
    assert folder_bytes(orphan.path)[0] == 50_000
    aged(store.root)
    result = cli("cache", "gc", "--store", store.root, "--min-age", "0", check=True)
    assert f"removed stage {orphan.name} (0.1 MB)" in result.output
    assert "temporary file(s), 0.1 MB; kept" in result.output


def test_repair_of_a_model_whose_array_file_is_gone_removes_the_fits_models(tmp_path, cli):
    """One fit wrote models ``pca`` and ``gmm``; ``pca.npz`` deleted: verify names the model,
    ``--repair`` removes what is left of it and the other model of the same fit, so that its
    re-run fits both again."""
    store = Store(tmp_path / "s")
    base = make_stage(store, "import", name="b")
    fit = store.stage("fit", {"k": 2}, inputs=[base], items=Manifest([]))
    fit.save_model("pca", {"mean": np.zeros(3)}, {"n": 3})
    fit.save_model("gmm", {"w": np.ones(2)}, {"k": 2})
    store.set_name("p", fit)
    (fit.path / "models" / "pca.npz").unlink()
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert [p for p in problems(verify) if "model 'pca': unreadable" in p], verify.output
    repair = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert "removed damaged model 'pca'" in repair.output
    assert "removed model 'gmm' (fitted with the damaged one" in repair.output
    assert list((fit.path / "models").iterdir()) == []


def test_show_lists_each_model_array_by_name_with_its_shape_and_dtype(tmp_path, cli):
    """``cache show --json`` of a fit stage reads the arrays' headers: names, shapes and
    dtypes as the fit saved them."""
    store = Store(tmp_path / "s")
    base = make_stage(store, "import", name="b")
    fit = store.stage("fit", {"k": 2}, inputs=[base], items=Manifest([]))
    fit.save_model("pca", {"mean": np.zeros(3), "components": np.ones((2, 3), np.float32)},
                   {"n": 3})
    store.set_name("p", fit)
    shown = json.loads(cli("cache", "show", "--store", store.root, "p", "--json",
                           check=True).stdout)
    assert shown["models"]["pca"]["arrays"] == {
        "mean": {"shape": [3], "dtype": "float64"},
        "components": {"shape": [2, 3], "dtype": "float32"}}
    assert shown["models"]["pca"]["meta"]["n"] == 3


def test_repair_rebuilds_the_content_hash_cache_from_the_files_still_there(tmp_path, cli):
    """The cache's seal no longer matches and one hashed source file is gone: ``--repair``
    hashes the 11 files still there again and leaves the gone one out."""
    store, _ = imported_store(tmp_path, cli)
    cache = store / "content-hashes.json"
    text = cache.read_bytes()
    at = text.rindex(b'"crc32:') + len(b'"crc32:')
    cache.write_bytes(text[:at] + (b"0" if text[at:at + 1] != b"0" else b"1") + text[at + 1:])
    (tmp_path / "npy" / "v05.npy").unlink()
    verify = cli("cache", "verify", "--store", store)
    assert verify.exit_code == 1
    assert [p for p in problems(verify) if p.startswith("problem: content-hashes.json: damaged")]
    repair = cli("cache", "verify", "--store", store, "--repair", check=True)
    assert "repaired: hashed 11 file(s) of content-hashes.json again" in repair.output
    assert "0 problem(s)" in cli("cache", "verify", "--store", store, check=True).output


def test_a_file_no_ledger_line_accounts_for_is_a_stray_unless_a_run_is_committing_it(
        tmp_path, cli):
    """An item file without its done line: while a process computes the stage it may be an
    item being committed (its line comes next), so verify says nothing; once none does, the
    file is named and ``--repair`` removes it."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(4)], store.root)
    stage = store.stage("extract", {"n": 4}, items=items)
    for i in range(3):
        stage.write_item(f"v{i}", np.full((2, 3), i, np.float32))
    stray = stage.item_path("v3")
    stray.parent.mkdir(parents=True, exist_ok=True)
    np.save(stray, np.ones((2, 3), np.float32))
    marker = stage.path / RUNNING_DIR / "otherhost-4242"
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    assert "0 problem(s)" in cli("cache", "verify", "--store", store.root, check=True).output
    marker.unlink()
    verify = cli("cache", "verify", "--store", store.root)
    assert verify.exit_code == 1
    assert [p for p in problems(verify) if f"file {stray.relative_to(stage.path)}: no ledger "
            "line says its item is done" in p], verify.output
    repair = cli("cache", "verify", "--store", store.root, "--repair", check=True)
    assert f"removed {stray.relative_to(stage.path)} (no ledger line accounts for it)" in \
        repair.output
    assert not stray.exists() and stage.done_ids() == {"v0", "v1", "v2"}


def test_show_gives_the_first_done_items_own_shape(tmp_path, cli):
    """The imported items have 5 to 11 rows: ``cache show`` names the first done item and
    gives that item's shape and sidecars."""
    store, _ = imported_store(tmp_path, cli)
    shown = json.loads(cli("cache", "show", "--store", store, "feat", "--json",
                           check=True).stdout)
    assert shown["item_example"]["id"] == "v00"
    assert shown["item_example"]["shape"] == list(np.load(tmp_path / "npy" / "v00.npy").shape)


def test_gc_with_an_unreadable_needed_stage_removes_no_stage_but_still_its_temporary_files(
        tmp_path, cli):
    """The named stage's input has a damaged ``stage.json``: gc cannot tell what that input
    needs, so it names the problem and removes no stage (the unnamed one stays), but a
    temporary file of a process that is gone still goes."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(2)], tmp_path)
    base = store.stage("import", {"n": 2}, items=items)
    child = store.stage("encode", {"m": 1}, inputs=[base])
    store.set_name("c", child)
    orphan = make_stage(store, "orphan")
    (base.path / "stage.json").write_bytes(b"{")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    tmp = child.path / f"x.tmp.{HOST}.{int(dead.stdout)}"
    tmp.write_bytes(b"partial")
    aged(store.root)
    result = cli("cache", "gc", "--store", store.root, "--min-age", "0")
    assert result.exit_code == 1
    assert f"problem: stage {base.name}: " in result.stderr
    assert "gc removes no stage while a name or a needed stage cannot be read" in result.stderr
    assert f"removed temporary file {tmp}" in result.stdout and not tmp.exists()
    assert orphan.path.exists() and child.path.exists()
