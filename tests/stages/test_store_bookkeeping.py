"""The store's bookkeeping at its edges: what the key holds, which ledger line wins, what resume
trusts, what ``cache verify`` calls damage (issue 31 §4: each test kills a mutation of
``featpipe/store.py`` that the older tests let live; ``benchmarks/mutation_sample.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket

import numpy as np
import pytest

import featpipe.store.keys
import featpipe.store.ledger
import featpipe.store.records
from featpipe import FORMAT_VERSION
from featpipe.checksums import file_checksum, npy_file_checksum
from featpipe.errors import FeatpipeError
from featpipe.manifest import from_rows
from featpipe.store import Store
from featpipe.store.ledger import ledger_entry as _ledger_entry
from tests._stores import sealed_line


def _stage(tmp_path, ids=("x", "y")):
    items = from_rows([(i, f"{i}.npy", ["a"], ["train"]) for i in ids], root=tmp_path)
    return Store(tmp_path / "s").stage("import", {"p": 1}, items=items)


def _ledger_file(stage, pid: int):
    """A ledger of another process of this host (``ledger/<host>-<pid>.jsonl``, docs/store.md)."""
    folder = stage.path / "ledger"
    folder.mkdir(exist_ok=True)
    return folder / f"{socket.gethostname()}-{pid}.jsonl"


def _put_file(stage, item_id) -> None:
    """An item file without a ledger line of this process (another process wrote it)."""
    stage.item_path(item_id).parent.mkdir(parents=True, exist_ok=True)
    np.save(stage.item_path(item_id), np.ones(3, np.float32))


def _line(stage, item_id, status, at, error=None) -> str:
    """A ledger line of ``stage`` as featpipe writes it (sealed; a done line with the checksum
    of the item's file)."""
    entry = {"id": item_id, "status": status, "seconds": 0.5, "error": error, "time": at}
    if status == "done":
        entry["sums"] = {".npy": npy_file_checksum(stage.item_path(item_id))}
    return sealed_line(stage, entry)


def test_a_new_format_version_gives_every_stage_a_new_key(tmp_path, monkeypatch):
    items = from_rows([("x", "x.npy", ["a"], ["train"])], root=tmp_path)
    store = Store(tmp_path / "s")
    now = store.stage("import", {"p": 1}, items=items)
    monkeypatch.setattr(featpipe.store.keys, "FORMAT_VERSION", FORMAT_VERSION + 1)
    monkeypatch.setattr(featpipe.store.records, "FORMAT_VERSION", FORMAT_VERSION + 1)
    later = store.stage("import", {"p": 1}, items=items)
    assert later.key != now.key and later.path != now.path
    assert json.loads((later.path / "stage.json").read_text())["format"] == FORMAT_VERSION + 1


def test_a_later_failed_line_never_undoes_a_done_item(tmp_path):
    stage = _stage(tmp_path)
    stage.write_item("x", np.ones(3))
    stage.write_item("y", np.ones(3))
    stage.record("x", "failed", error="a second run failed it")
    assert stage.done_ids() == {"x", "y"} and stage.is_complete()
    assert stage.failed() == {}
    assert stage.item_states()["x"].status == "done"


def test_the_latest_line_wins_across_the_ledgers_of_several_processes(tmp_path):
    """Lines are ordered by their time, not by ledger file: a done line of one process and
    a failed one of another, in either order; two failures keep the later error."""
    stage = _stage(tmp_path, ids=("x", "y", "z"))
    for item_id in ("x", "y"):
        _put_file(stage, item_id)
    _ledger_file(stage, 1).write_text(_line(stage, "x", "done", 200.0)
                                      + _line(stage, "y", "failed", 100.0)
                                      + _line(stage, "z", "failed", 300.0, "late error"))
    _ledger_file(stage, 2).write_text(_line(stage, "x", "failed", 100.0, "early error")
                                      + _line(stage, "y", "done", 200.0)
                                      + _line(stage, "z", "failed", 150.0, "early error"))
    assert stage.done_ids() == {"x", "y"}
    assert stage.failed() == {"z": "late error"}
    assert stage.item_states()["z"].time == 300.0


def test_resume_does_not_trust_a_done_line_whose_file_was_deleted(tmp_path):
    stage = _stage(tmp_path)
    stage.write_item("x", np.ones(3))
    stage.write_item("y", np.ones(3))
    stage.item_path("x").unlink()
    assert stage.done_ids() == {"y"}
    assert not stage.is_complete()
    assert stage.failed() == {}  # not failed either: simply to be computed again


def test_a_failed_item_is_listed_with_its_error_until_it_is_done(tmp_path):
    stage = _stage(tmp_path)
    stage.record("x", "failed", error="bad video")
    stage.record("y", "failed")
    assert stage.failed() == {"x": "bad video", "y": "failed"}
    stage.write_item("x", np.ones(3))
    assert stage.failed() == {"y": "failed"} and stage.done_ids() == {"x"}


def test_verify_skips_the_cut_last_line_of_a_killed_ledger_but_reports_a_cut_middle_one(
        tmp_path, cli):
    stage = _stage(tmp_path)
    stage.write_item("x", np.ones(3))
    stage.write_item("y", np.ones(3))
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    with open(ledger, "ab") as handle:  # a process killed while writing its third line
        handle.write(b'{"id": "z", "stat')
    assert stage.ledger_problems() == []
    assert stage.done_ids() == {"x", "y"}
    result = cli("cache", "verify", "--store", stage.store.root)
    assert result.exit_code == 0, result.output
    assert "0 problem(s)" in result.output and "ledger" not in result.output
    with open(ledger, "ab") as handle:  # another line after it: the cut one is damage now
        handle.write(b"\n" + _line(stage, "z", "failed", 1.0).encode())
    problems = stage.ledger_problems()
    assert len(problems) == 1 and f"{ledger.name} line 3: not JSON" in problems[0]
    result = cli("cache", "verify", "--store", stage.store.root)
    assert result.exit_code == 1 and "line 3: not JSON" in result.output


@pytest.mark.parametrize(("line", "reason"), [
    ('["x"]', "not a JSON object"),
    ('{"status": "done"}', "'id' missing"),
    ('{"id": "x", "status": "ok"}', "'status' must be 'done', 'failed' or 'removed'"),
    ('{"id": "x", "status": "done", "seconds": -1}', "'seconds' must be >= 0"),
    ('{"id": "x", "status": "done", "seconds": true}', "'seconds' must be a number"),
    ('{"id": "x", "status": "done", "time": 1e300}', "in the future"),
    ('{"id": "x", "status": "done", "seconds": 1e300}', "more than the time since 1970"),
    ('{"id": "x", "status": "done", "error": 3}', "'error' must be a string or null"),
    ('{"id": "x", "status": "done", "sums": {".npy": "md5:0"}}', "'sums' must map file"),
    ('{"id": "x", "status": "done", "sums": {"npy": "crc32:00000000"}}', "'sums' must map"),
    ('{"id": "x", "status": "done", "sums": [".npy"]}', "'sums' must map file suffixes"),
    ('{"id": "x", "status": "done", "sums": {".npy": "crc32:00000000"}, "batch": "x.npz"}',
     "'batch' must name a batch file"),
])
def test_a_malformed_ledger_line_is_named_and_does_not_count(tmp_path, line, reason):
    stage = _stage(tmp_path)
    stage.write_item("y", np.ones(3))
    _put_file(stage, "x")
    _ledger_file(stage, 1).write_text(line + "\n" + _line(stage, "y", "done", 1.0))
    problems = stage.ledger_problems()
    assert len(problems) == 1 and "line 1: " in problems[0] and reason in problems[0]
    assert stage.done_ids() == {"y"}


def test_a_well_formed_line_with_defaults_counts(tmp_path):
    """``seconds``, ``time`` and ``error`` may be absent (0, 0, null); a line with them all
    at their limits is read as written."""
    stage = _stage(tmp_path)
    for item_id in ("x", "y"):
        _put_file(stage, item_id)
    sums = {i: {".npy": npy_file_checksum(stage.item_path(i))} for i in ("x", "y")}
    _ledger_file(stage, 1).write_text(
        sealed_line(stage, {"id": "x", "status": "done", "sums": sums["x"]})
        + sealed_line(stage, {"id": "y", "status": "done", "seconds": 0, "time": 0,
                              "error": None, "sums": sums["y"]}))
    assert stage.ledger_problems() == []
    assert stage.done_ids() == {"x", "y"}
    entry = stage.item_states()["x"]
    assert (entry.seconds, entry.time, entry.error) == (0.0, 0.0, None)


def test_a_planned_stage_writes_nothing(tmp_path):
    """A dry run plans a stage (its key and items) without creating it: every write refuses
    in one line and leaves the store without a stage folder; a model saved to it is a
    stand-in kept in memory (later steps of the dry run are sized on it), never written."""
    items = from_rows([("x", "x.npy", ["a"], ["train"])], root=tmp_path)
    planned = Store(tmp_path / "s").stage("import", {"p": 1}, items=items, create=False)
    assert not planned.path.exists() and planned.items.ids == ["x"]
    writes = [lambda: planned.write_item("x", np.ones(3)),
              lambda: planned.record("x", "failed", error="e"),
              lambda: planned.record_removed(["x"], "damaged"),
              planned.batch_writer,
              lambda: planned.make_view(planned, slice(None), []),
              planned.mark_running,
              lambda: planned.exclusive("run", lambda: None).__enter__()]
    for write in writes:
        with pytest.raises(FeatpipeError, match="is only planned"):
            write()
    with pytest.raises(FeatpipeError, match="has no model 'm'"):
        planned.load_model("m")
    planned.save_model("m", {"a": np.ones(2)}, meta={"k": 3})
    arrays, meta = planned.load_model("m")
    assert arrays["a"].tolist() == [1.0, 1.0] and meta == {"k": 3}
    assert not planned.path.exists() and not (tmp_path / "s" / "stages").exists()


def test_an_item_records_the_seconds_it_took(tmp_path):
    """... and 0 when it was not timed (never a made-up time)."""
    stage = _stage(tmp_path)
    stage.write_item("x", np.ones(3), seconds=1.25)
    stage.record("y", "failed", seconds=0.5, error="e")
    stage.write_item("z", np.ones(3))
    stage.record("w", "failed", error="e")
    states = stage.item_states()
    assert [states[i].seconds for i in "xyzw"] == [1.25, 0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="ledger status must be 'done', 'failed' or 'removed'"):
        stage.record("x", "skipped")


def test_running_processes_are_the_live_markers_of_this_host_and_fresh_ones_of_others(
        tmp_path):
    import os
    import subprocess
    import sys
    import time

    from featpipe.fileio import HOST

    stage = _stage(tmp_path)
    assert stage.running_processes() == []
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    folder = stage.path / "running"
    folder.mkdir()
    (folder / f"{HOST}-{gone.stdout.strip()}").touch()  # a process of this host, ended
    (folder / f"{HOST}-notapid").touch()
    (folder / "elsewhere-12").touch()  # another host, seen recently
    (folder / "faraway-13").touch()
    old = time.time() - 3 * 86400
    os.utime(folder / "faraway-13", (old, old))  # another host, silent for three days
    stage.mark_running()
    me = f"{HOST}-{os.getpid()}"
    assert stage.running_processes() == sorted(["elsewhere-12", me])
    assert not (folder / f"{HOST}-{gone.stdout.strip()}").exists()  # removed as stale
    stage.unmark_running()
    assert stage.running_processes() == ["elsewhere-12"]


def test_a_store_folder_is_required_to_be_one(tmp_path):
    with pytest.raises(FeatpipeError, match="the folder does not exist"):
        Store(tmp_path / "none").require()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FeatpipeError, match="the folder is not a folder|is not a folder"):
        Store(tmp_path / "file").require()
    (tmp_path / "other").mkdir()
    assert Store(tmp_path / "other").require().root == tmp_path / "other"  # empty: a new store
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(FeatpipeError, match="is not a featpipe store"):
        Store(tmp_path / "other").require()
    (tmp_path / "other" / "names").mkdir()
    assert Store(tmp_path / "other").require()


def test_names_resolve_to_stages_and_nothing_else(tmp_path):
    stage = _stage(tmp_path)
    store = stage.store
    assert store.names() == {}
    with pytest.raises(FeatpipeError, match=r"no stage named 'x' .*\(names: none yet"):
        store.resolve("x")
    store.set_name("feat", stage)
    assert store.names() == {"feat": stage.name} and store.resolve("feat") == stage
    assert store.resolve(stage.name) == stage
    missing = stage.name[:-1] + ("0" if stage.name[-1] != "0" else "1")
    with pytest.raises(FeatpipeError, match=f"no stage named '{missing}'"):
        store.resolve(missing)  # a well-formed folder name that is no stage
    (store.names_dir / "gone").write_text(missing + "\n")
    with pytest.raises(FeatpipeError, match=f"name 'gone' points to missing stage {missing}"):
        store.resolve("gone")


def test_models_are_listed_and_an_object_array_is_refused_naming_it(tmp_path):
    from tests.conftest import object_npy_bytes

    stage = Store(tmp_path / "s").stage("fit-pca", {"dim": 2})
    assert stage.model_names() == [] and not stage.has_model("pca")
    stage.save_model("pca", {"w": np.eye(2)})
    assert stage.model_names() == ["pca"] and stage.has_model("pca")
    (stage.path / "models" / "pca.json").unlink()
    assert not stage.has_model("pca")
    import zipfile

    with zipfile.ZipFile(stage.path / "models" / "bad.npz", "w") as archive:
        archive.writestr("w.npy", object_npy_bytes())
    (stage.path / "models" / "bad.json").write_text("{}")
    (stage.path / "models" / "bad.sums").write_text(json.dumps(  # whole: only the array is bad
        {suffix: file_checksum(stage.path / "models" / f"bad{suffix}")
         for suffix in (".npz", ".json")}))
    with pytest.raises(FeatpipeError, match=r"array 'w' in .*bad.npz is an object array "
                       r"\(featpipe never unpickles\)"):
        stage.load_model("bad")


def test_a_ledger_time_up_to_a_day_ahead_is_clock_skew_beyond_it_damage(monkeypatch):
    """A line's ``time`` may run ahead of this clock by a day (another host's clock); past
    that it is a writer gone wrong (the boundary pinned either side, the clock stopped)."""
    monkeypatch.setattr(featpipe.store.ledger.time, "time", lambda: 1.5e9)
    line = {"id": "x", "status": "done", "sums": {".npy": "crc32:00000001"}}
    assert not isinstance(_ledger_entry(dict(line, time=1.5e9 + 86399.5), True), str)
    assert not isinstance(_ledger_entry(dict(line, time=1.5e9 + 86400), True), str)
    assert not isinstance(_ledger_entry(dict(line, seconds=1.5e9), True), str)  # since 1970
    assert "since 1970" in _ledger_entry(dict(line, seconds=1.5e9 + 1), True)
    assert "is in the future" in _ledger_entry(dict(line, time=1.5e9 + 86400.5), True)


def test_a_blank_line_in_a_ledger_is_no_line(tmp_path):
    """An empty line (an editor's, or a hand's) holds nothing to lose: skipped, not damage."""
    stage = _stage(tmp_path)
    stage.write_item("x", np.ones(3))
    stage.write_item("y", np.ones(3))
    (ledger,) = (stage.path / "ledger").glob("*.jsonl")
    first, second = ledger.read_text().splitlines()
    ledger.write_text(f"{first}\n\n  \n{second}\n")
    assert stage.ledger_problems(fresh=True) == [] and stage.done_ids() == {"x", "y"}


def test_a_process_that_writes_many_stages_holds_a_bounded_number_of_ledgers_open(tmp_path):
    """The ledger writer keeps a descriptor per stage for its next line, but at most
    OPEN_AT_MOST of them (the least recently used closed): a Python loop over many stages, or
    a test suite, does not run out of descriptors; a closed ledger is reopened and appended."""
    from featpipe.store.ledger import LedgerWriter

    def open_ledgers() -> int:
        links = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # listdir's own descriptor, closed by now
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return sum(str(tmp_path) in link and link.endswith(".jsonl") for link in links)

    folders = [tmp_path / f"stage{i}" / "ledger" for i in range(LedgerWriter.OPEN_AT_MOST + 8)]
    for folder in folders:
        LedgerWriter.append(folder, {"id": "a", "status": "done"})
    assert open_ledgers() == LedgerWriter.OPEN_AT_MOST
    LedgerWriter.append(folders[0], {"id": "b", "status": "done"})  # closed, then reopened
    assert open_ledgers() == LedgerWriter.OPEN_AT_MOST
    (ledger,) = folders[0].glob("*.jsonl")
    assert len(ledger.read_bytes().splitlines()) == 2
