"""Tests for the survivors of the mutation run of featpipe/store.py (issue 39 §6)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import featpipe.store.items
import featpipe.store.layout
import featpipe.store.records
import featpipe.store.running
from featpipe.checksums import DamagedItem, name_checksum
from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import HOST
from featpipe.manifest import from_rows
from featpipe.stages.cache import verify_stage
from featpipe.store import CACHE_NAME, DamagedName, Store, stage_key
from tests._stores import deny, imported_store, make_old
from tests.conftest import one_line_error
from tests.stages.test_fault_recovery import filled_stage


# -- files no ledger line accounts for, and damaged sidecars, are never read as data ---------
def test_an_item_file_no_ledger_line_says_is_done_is_never_read(tmp_path):
    """A file in an item's place that featpipe did not record (copied there by hand, or its
    ledger line lost) is refused with the item and the file named, never returned."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v000{i}", "", ["c"], ["train"]) for i in range(3)], store.root)
    stage = store.stage("import", {"n": 3}, items=items)
    for item_id in ("v0000", "v0001"):
        stage.write_item(item_id, np.ones((4, 3), np.float32))
    stranger = stage.item_path("v0002")
    stranger.parent.mkdir(parents=True, exist_ok=True)
    stranger.write_bytes(stage.item_path("v0001").read_bytes())
    with pytest.raises(ItemError, match=r"^v0002: not computed in stage .*no ledger line says "
                                        r"it is done, so .*is not used") as err:
        stage.read_item("v0002")
    assert str(stranger) in str(err.value)


def test_a_sidecar_put_beside_a_done_item_by_hand_is_damage_never_read(tmp_path):
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    stray = stage.item_path("v0000", "positions")
    np.save(stray, np.zeros((4, 2), np.float32))
    for read in (lambda: stage.read_extra("v0000", "positions"),
                 lambda: stage.extras_of("v0000")):
        with pytest.raises(DamagedItem, match=r"^v0000: damaged: .*\+positions\.npy: no "
                                              r"checksum of it in the item's ledger line"):
            read()
    np.testing.assert_array_equal(stage.read_extra("v0000", "timestamps"), np.arange(4.0))


def test_a_damaged_sidecar_file_is_damage_naming_the_item_and_the_file(tmp_path):
    """A sidecar's bytes are checked against its ledger line's checksum on every read, as
    the item's own are."""
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    sidecar = stage.item_path("v0000", "timestamps")
    data = bytearray(sidecar.read_bytes())
    data[-1] ^= 0x40
    sidecar.write_bytes(bytes(data))
    for read in (lambda: stage.read_extra("v0000", "timestamps"),
                 lambda: stage.extras_of("v0000")):
        with pytest.raises(DamagedItem, match=r"^v0000: damaged: .*\+timestamps\.npy"):
            read()
    assert stage.read_item("v0000").shape == (4, 3)


# -- items whose file is cut short or too big ------------------------------------------------
def test_an_item_too_big_for_memory_is_one_error_naming_it_and_its_size(tmp_path, monkeypatch):
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.00 TiB for an array")

    monkeypatch.setattr(featpipe.store.items, "load_npy", no_memory)
    with pytest.raises(ItemError, match=r"^v0000: array .* \(176 bytes\) does not fit in "
                                        r"memory") as err:
        stage.read_item("v0000")
    assert str(stage.item_path("v0000")) in str(err.value)


# -- models ----------------------------------------------------------------------------------
def test_a_model_checksum_file_that_holds_no_checksums_is_damage_verify_names(tmp_path):
    """``models/<name>.sums`` that holds anything but the two checksums (``{}``, a list), or
    is cut short, is damage naming it: the model is never loaded unchecked, and verify names
    it."""
    stage = Store(tmp_path / "s").stage("fit-pca", {"dim": 2})
    stage.save_model("pca", {"w": np.eye(2)})
    for held in ({}, {".npz": None, ".json": None}, ["crc32:00000000"]):
        (stage.path / "models" / "pca.sums").write_text(json.dumps(held))
        with pytest.raises(FeatpipeError, match=r"model 'pca' of stage .*pca\.sums does not "
                                                r"hold the checksums of the \.npz and \.json"):
            stage.load_model("pca")
        found = verify_stage(stage)
        assert found.models == ["pca"]
        assert any("model 'pca'" in p and "pca.sums" in p for p in found.problems)
    (stage.path / "models" / "pca.sums").write_text('{".npz": "crc32:0')  # cut short
    with pytest.raises(FeatpipeError, match=r"model 'pca' of stage .*pca\.sums is unreadable"):
        stage.load_model("pca")
    assert verify_stage(stage).models == ["pca"]


def test_a_model_whose_checksums_file_is_gone_is_damage_in_a_checksummed_stage(tmp_path):
    stage = Store(tmp_path / "s").stage("fit-pca", {"dim": 2})
    stage.save_model("pca", {"w": np.eye(2)})
    (stage.path / "models" / "pca.sums").unlink()
    assert not stage.has_model("pca")
    with pytest.raises(FeatpipeError, match=r"model 'pca' of stage .* is damaged: .*pca\.sums "
                                            r"is missing, and the stage was written with "
                                            r"checksums; `featpipe cache verify --repair` "
                                            r"removes the model"):
        stage.load_model("pca")
    assert verify_stage(stage).models == ["pca"]


def test_model_metadata_that_is_not_an_object_in_an_old_store_is_one_error(tmp_path):
    """A store written before model checksums: metadata that is JSON but not an object is
    refused (one line naming the file), and verify names the model."""
    store = Store(tmp_path / "s")
    stage = store.stage("fit-pca", {"dim": 2})
    stage.save_model("pca", {"w": np.eye(2)})
    make_old(store.root, item_sums=False)
    (stage.path / "models" / "pca.json").write_text("[1, 2]")
    old = store.stage_by_folder(stage.name)
    assert not old.checksummed
    with pytest.raises(FeatpipeError, match=r"model 'pca' of stage .*pca\.json is not a JSON "
                                            r"object"):
        old.load_model("pca")
    assert verify_stage(old).models == ["pca"]


def test_a_missing_or_unreadable_model_of_an_old_store_is_one_error_naming_it(tmp_path):
    """A store written before model checksums: a model never fitted, one whose file is gone
    and one whose arrays are cut short are each one error line naming the model."""
    store = Store(tmp_path / "s")
    stage = store.stage("fit-pca", {"dim": 2})
    stage.save_model("pca", {"w": np.eye(2)})
    stage.save_model("cut", {"w": np.eye(2)})
    stage.save_model("gone", {"w": np.eye(2)})
    make_old(store.root, item_sums=False)
    old = store.stage_by_folder(stage.name)
    cut = stage.path / "models" / "cut.npz"
    cut.write_bytes(cut.read_bytes()[:40])
    (stage.path / "models" / "gone.npz").unlink()
    assert old.load_model("pca")[0]["w"].tolist() == np.eye(2).tolist()
    for name in ("never", "gone"):
        with pytest.raises(FeatpipeError, match=rf"stage .* has no model '{name}' \(not fitted "
                                                r"yet\?\)"):
            old.load_model(name)
    with pytest.raises(FeatpipeError, match=r"model 'cut' of stage .*cut\.npz is unreadable "
                                            r"\("):
        old.load_model("cut")
    assert verify_stage(old).models == ["cut", "gone"]


def test_a_planned_stage_lists_and_has_the_stand_in_models_of_its_dry_run(tmp_path):
    """A dry run fits nothing: the planned fit stage holds a stand-in of each model, which
    the later steps (and the plan's sizes) see as its models."""
    from featpipe.stages.dryrun import model_bytes

    planned = Store(tmp_path / "s").stage("fit-pca", {"dim": 2}, create=False)
    assert planned.model_names() == [] and not planned.has_model("pca")
    planned.save_model("pca", {"w": np.eye(2)})
    assert planned.model_names() == ["pca"]
    assert planned.has_model("pca") and not planned.has_model("gmm")
    assert model_bytes(planned) >= np.eye(2).nbytes
    assert not (tmp_path / "s").exists()


# -- process markers and locks ---------------------------------------------------------------
def test_without_file_locks_a_marker_is_alive_while_its_process_lives(tmp_path, monkeypatch):
    """Where ``flock`` is not supported (some network file systems) a marker of this host is
    judged by whether its pid lives."""
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (stage.path / "running").mkdir()
        for pid in (ended.pid, living.pid):
            (stage.path / "running" / f"{HOST}-{pid}").touch()

        def no_locks(*args):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

        monkeypatch.setattr(fcntl, "flock", no_locks)
        assert stage.running_processes() == [f"{HOST}-{living.pid}"]
    finally:
        living.kill()
        living.wait()


def test_without_file_locks_a_run_and_a_pack_go_on_unlocked(tmp_path, monkeypatch, cli):
    """Where ``flock`` is not supported the stage's locks are skipped, never an error: the
    ledger keeps two runs correct."""
    def no_locks(*args):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    store, command = imported_store(tmp_path, cli)
    assert "0 done, 12 skipped" in cli(*command, check=True).output
    cli("cache", "pack", "--store", store, "feat", check=True)
    assert Store(store).resolve("feat").packed() is not None


def test_another_hosts_marker_counts_as_running_for_one_day_after_its_last_touch(
        tmp_path, monkeypatch):
    """A process of another host cannot be asked whether it lives: its marker counts for
    ``max_age_s`` (a day) after it was last touched, not a moment longer (the boundary
    pinned either side, the clock stopped)."""
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    (stage.path / "running").mkdir()
    marker = stage.path / "running" / "elsewhere-12"
    marker.touch()
    os.utime(marker, (1.5e9, 1.5e9))
    for age, running in ((86399.5, True), (86400, False), (86400.5, False)):
        monkeypatch.setattr(featpipe.store.running.time, "time", lambda age=age: 1.5e9 + age)
        assert stage.running_processes() == (["elsewhere-12"] if running else []), age


def test_a_marker_gone_when_it_is_checked_is_stale_and_removed(tmp_path):
    """Another process's marker may go (its run ends) between the listing of ``running/``
    and its check: that is a process not running, never an error (a dangling link stands in
    for a file removed in that moment)."""
    stage = filled_stage(Store(tmp_path / "s"), 1, name=None)
    (stage.path / "running").mkdir()
    gone = stage.path / "running" / f"{HOST}-{os.getpid() + 1}"
    gone.symlink_to(tmp_path / "removed")
    assert stage.running_processes() == []
    stage.mark_running()
    try:
        assert stage.running_processes() == [f"{HOST}-{os.getpid()}"]
        assert not os.path.lexists(gone)
    finally:
        stage.unmark_running()


# -- the store folder and its stage folders --------------------------------------------------
def test_a_store_with_only_unnamed_stages_still_refuses_a_store_inside_it(tmp_path):
    """A store made through the library holds stages but no name and no content-hash cache:
    it is a store all the same, and no store is made inside it."""
    outer = Store(tmp_path / "s")
    filled_stage(outer, 1, name=None)
    assert not outer.names_dir.exists() and not (outer.root / CACHE_NAME).exists()
    inner = Store(tmp_path / "s" / "sub")
    with pytest.raises(FeatpipeError, match=r"is inside the store"):
        filled_stage(inner, 1, name=None)
    assert not inner.root.exists()


def test_a_store_whose_every_stage_was_removed_is_still_a_store(tmp_path, cli):
    """``cache rm`` of its only stage leaves the store its content-hash cache (and empty
    folders): still a store, so no store is made inside it."""
    store, command = imported_store(tmp_path, cli)
    cli("cache", "rm", "--store", store, "feat", check=True)
    assert not any(Store(store).stages_dir.iterdir()) and (store / CACHE_NAME).is_file()
    inner = list(command)
    inner[inner.index("--store") + 1] = store / "inner"
    assert "inside the store" in one_line_error(cli(*inner), code=2)
    with pytest.raises(FeatpipeError, match="is inside the store"):
        Store(store / "inner").check_not_nested()
    assert not (store / "inner").exists()


def test_a_parent_folder_that_cannot_be_listed_does_not_stop_a_store(tmp_path, monkeypatch):
    """Whether a parent folder is a store is asked of every parent of a new store; one whose
    ``stages/`` this user may not list (another user's) is taken for no store."""
    (tmp_path / "stages").mkdir()
    closed = tmp_path / "stages"
    deny(monkeypatch, "iterdir", lambda path: path == closed)
    stage = filled_stage(Store(tmp_path / "mine"), 1, name="feats")
    assert Store(tmp_path / "mine").resolve("feats") == stage


@pytest.mark.parametrize("kind", ["../escape", "Encode", "", "en code"])
def test_a_stage_kind_that_is_not_a_folder_name_is_refused_before_anything_is_written(
        tmp_path, kind):
    with pytest.raises(ValueError, match=r"must match \[a-z\]\[a-z0-9-\]\*"):
        Store(tmp_path / "s").stage(kind, {"n": 1})
    assert list(tmp_path.iterdir()) == []


def test_a_float32_stage_keeps_the_key_of_its_parameters_alone(tmp_path):
    """float32, the default, is left out of the key (the stages of stores made before
    ``--dtype`` existed are found again); any other dtype is part of it."""
    store = Store(tmp_path / "s")
    plain = store.stage("import", {"n": 1})
    assert plain.key == stage_key("import", {"n": 1}, [])
    assert store.stage("import", {"n": 1}, dtype="float32") == plain
    half = store.stage("import", {"n": 1}, dtype="float16")
    assert half.key == stage_key("import", {"n": 1, "dtype": "float16"}, []) != plain.key
    assert half.dtype == np.float16


def test_a_stage_another_process_creates_meanwhile_is_opened_not_an_error(tmp_path,
                                                                          monkeypatch):
    """Two processes may create the same stage at once: the one whose ``stage.json`` comes
    second opens the first one's (same key, same record), and leaves no temporary file."""
    real_seal = featpipe.store.records.seal_json

    def another_process_first(text, owner):
        monkeypatch.setattr(featpipe.store.records, "seal_json", real_seal)
        Store(tmp_path / "s").stage("import", {"n": 1})  # the other process wins the race
        return real_seal(text, owner)

    monkeypatch.setattr(featpipe.store.records, "seal_json", another_process_first)
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"n": 1})
    assert featpipe.store.records.seal_json is real_seal  # the other process did run meanwhile
    assert store.all_stages() == [stage] and stage.params == {"n": 1}
    assert sorted(p.name for p in stage.path.iterdir()) == ["stage.json"]


def test_a_stage_folder_without_its_record_is_named_only_once_a_full_minute_passed(
        tmp_path, monkeypatch):
    """``scan`` leaves a stage folder without ``stage.json`` alone for ``CREATION_GRACE_S``
    (60 s) after its last change, exactly 60 s included (the clock stopped)."""
    store = Store(tmp_path / "s")
    filled_stage(store, 1)
    folder = store.stages_dir / ("import-" + "a" * 16)
    folder.mkdir()
    os.utime(folder, (1.5e9, 1.5e9))
    for age, named in ((60, False), (60.5, True)):
        monkeypatch.setattr(featpipe.store.layout.time, "time", lambda age=age: 1.5e9 + age)
        assert store.scan()[1] == ([(folder.name, "stage.json missing")] if named else []), age


def test_a_folder_a_killed_gc_was_deleting_is_no_stage_and_no_problem(tmp_path, cli):
    """``cache gc`` renames a stage folder to ``<folder>.tmp.<host>.<pid>`` before deleting
    it; killed right after, it leaves the whole stage there: ls and verify skip it (no
    problem), the next gc removes it."""
    store = Store(tmp_path / "s")
    kept = filled_stage(store, 1, name="kept")
    doomed = filled_stage(store, 2, name=None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.replace(doomed.path, doomed.path.with_name(f"{doomed.name}.tmp.{HOST}.{dead.pid}"))
    assert [s.name for s in store.scan()[0]] == [kept.name] and store.scan()[1] == []
    listed = cli("cache", "ls", "--store", store.root, check=True)
    assert doomed.name not in listed.output and "problem" not in listed.output
    assert "0 problem(s)" in cli("cache", "verify", "--store", store.root, check=True).output
    again = cli("cache", "gc", "--store", store.root, "--min-age", "0", check=True)
    assert "folder of a killed gc" in again.output
    assert [p.name for p in store.stages_dir.iterdir()] == [kept.name]


def test_an_empty_store_folder_lists_verifies_and_collects_nothing(tmp_path, cli):
    """A store folder made but not yet written to (no ``stages/``): ls, verify and gc say
    there is nothing, and succeed."""
    (tmp_path / "s").mkdir()
    assert Store(tmp_path / "s").scan() == ([], [])
    assert "no stages" in cli("cache", "ls", "--store", tmp_path / "s", check=True).output
    assert "0 problem(s)" in cli("cache", "verify", "--store", tmp_path / "s",
                                 check=True).output
    assert "removed 0 stage(s)" in cli("cache", "gc", "--store", tmp_path / "s", "--min-age",
                                       "0", check=True).output


# -- names -----------------------------------------------------------------------------------
def test_a_name_file_copied_onto_another_name_is_named_by_its_checksum(tmp_path):
    """Another name's file in this name's place holds a valid checksum, of the other name:
    the error says the checksums differ (not that one is missing)."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 1, name="feats")
    store.set_name("other", stage)
    (store.names_dir / "other").write_bytes((store.names_dir / "feats").read_bytes())
    recorded = (store.names_dir / "feats").read_text().splitlines()[1]
    expected = name_checksum("other", stage.name)
    with pytest.raises(DamagedName, match=rf"name 'other': .* is damaged \(checksum {expected} "
                                          rf"of its name and stage differs from {recorded} "
                                          r"recorded when it was written\)"):
        store.read_name("other")
    assert store.read_name("feats") == stage.name


@pytest.mark.parametrize("cut", [1, 2], ids=["last-newline-lost", "byte-added"])
def test_a_name_file_whose_checksum_holds_but_bytes_differ_says_so(tmp_path, cut):
    """A name file cut just before its last newline (or with a byte added) still holds the
    right checksum: the error says the bytes are not as written, not that a checksum is
    missing or differs."""
    store = Store(tmp_path / "s")
    filled_stage(store, 1, name="feats")
    path = store.names_dir / "feats"
    data = path.read_bytes()
    path.write_bytes(data[:-1] if cut == 1 else data + b" ")
    with pytest.raises(DamagedName, match=r"name 'feats': .* is damaged \(its checksum holds, "
                                          r"but its bytes are not those featpipe writes"):
        store.read_name("feats")
    path.write_bytes(data.split(b"\n")[0])  # the checksum line lost with its newline
    with pytest.raises(DamagedName, match=r"its checksum is missing"):
        store.read_name("feats")


def test_a_name_file_with_a_damaged_second_line_is_damage_in_an_old_store_too(tmp_path):
    """A store written before names had checksums has name files of one line: a second
    line that is no checksum is damage there too, never ignored."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 1, name="feats")
    make_old(store.root)
    assert store.read_name("feats") == stage.name
    (store.names_dir / "feats").write_text(f"{stage.name}\nnot a checksum\n")
    with pytest.raises(DamagedName, match=r"name 'feats': .* is damaged"):
        store.read_name("feats")
    problems: list[str] = []
    assert store.names(problems) == {} and "name 'feats'" in problems[0]


def test_a_name_file_that_is_not_text_is_damage_naming_it(tmp_path):
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 1, name="feats")
    store.set_name("bits", stage)
    (store.names_dir / "bits").write_bytes(b"\xff\xfe" + stage.name.encode()[2:] + b"\n")
    with pytest.raises(DamagedName, match=r"name 'bits': .*bits is damaged \(.*utf-8"):
        store.resolve("bits")
    problems: list[str] = []
    assert store.names(problems) == {"feats": stage.name}
    assert len(problems) == 1 and "name 'bits'" in problems[0]


def test_a_name_file_holding_a_whole_other_file_is_one_short_error_line(tmp_path):
    """A name file overwritten with anything else: the error quotes its first 200
    characters, on one line, never the whole file."""
    store = Store(tmp_path / "s")
    filled_stage(store, 1, name="feats")
    junk = "".join(f"{i:x}" for i in range(5000))
    (store.names_dir / "feats").write_text(junk)
    with pytest.raises(DamagedName) as err:
        store.resolve("feats")
    message = str(err.value)
    assert f"holds {junk[:200]!r}, not a stage folder of this store" in message
    assert junk[:201] not in message and "\n" not in message


def test_a_name_file_that_cannot_be_read_is_one_error_naming_it(tmp_path, monkeypatch):
    """A name file this user may not read (another user's store): one error line naming the
    name and its file; the list of names leaves it out, says why, and keeps the rest."""
    store = Store(tmp_path / "s")
    stage = filled_stage(store, 1, name="feats")
    store.set_name("locked", stage)
    locked = store.names_dir / "locked"
    deny(monkeypatch, "read_bytes", lambda path: path == locked)
    with pytest.raises(FeatpipeError, match=rf"name 'locked': {re.escape(str(locked))} is "
                                            r"unreadable \(.*Permission denied"):
        store.resolve("locked")
    problems: list[str] = []
    assert store.names(problems) == {"feats": stage.name}
    assert len(problems) == 1 and "name 'locked'" in problems[0]


# -- read-only stores ------------------------------------------------------------------------
def test_packing_a_stage_of_a_read_only_store_is_refused_up_front(tmp_path, cli):
    from tests.stages.test_store_faults import mounted

    store, _ = imported_store(tmp_path, cli)
    with mounted("--bind", store, tmp_path / "ro") as ro:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        line = one_line_error(cli("cache", "pack", "--store", ro, "feat"))
        assert f"store {ro} is read-only" in line and "nothing was written" in line, line
    assert not (Store(store).resolve("feat").path / "packed").exists()
