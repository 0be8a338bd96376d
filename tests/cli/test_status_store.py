"""``featpipe status`` times a running stage by the work its run recorded (issue 47 item 4),
and without NAME reports the whole store: every named stage and every stage a run computes,
each with its state, counts and time left (issue 47 item 6)."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pytest

from featpipe.fileio import HOST, atomic_write_bytes, make_dirs
from featpipe.manifest import from_rows
from featpipe.progress import WORK_DIR, WorkPlan
from featpipe.stages.base import RUNNING, mark_running, unmark_running
from featpipe.store import Store, pointer_bytes


class FakeTime:
    """``time.time`` of every module, moved by the test."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _stage(store: Store, tag: str, lengths: dict[str, int]):
    """An encode stage (nothing computed) over items of the given lengths (rows)."""
    manifest = from_rows([(i, "", ["a"], ["train"]) for i in lengths], store.root)
    return store.stage("encode", {"method": "avg", "test": tag}, items=manifest)


def _write(stage, item_id: str, rows: int) -> None:
    stage.write_item(item_id, np.ones((rows, 3), np.float32))


def test_status_times_a_run_by_the_work_it_recorded(tmp_path, cli, monkeypatch):
    """Items of 10, 40 and 400 rows, small first, at 0.1 s a row: with the two small ones done
    5 s after the start, 40 s are left; the items' rate (2 done, the first 1 s in) says 4 s."""
    clock = FakeTime(1_000_000.0)
    monkeypatch.setattr(time, "time", clock)
    store = Store(tmp_path / "s")
    lengths = {"a": 10, "b": 40, "c": 400}
    stage = _stage(store, "work", lengths)
    mark_running(store, "enc", stage, WorkPlan(list(lengths), lengths))
    try:
        record = stage.path / WORK_DIR / f"{HOST}-{os.getpid()}.json"
        assert record.is_file()
        clock.now += 1.0
        _write(stage, "a", 10)
        clock.now += 4.0
        _write(stage, "b", 40)
        data = json.loads(cli("status", "--store", store.root, "enc", "--json",
                              check=True).stdout)
        assert data["running"] is True and data["eta_from"] == "work"
        assert data["work"]["done"] == 50 and data["work"]["left"] == 400
        assert data["eta_seconds"] == pytest.approx(40.0)
        items_eta = 1 / data["items_per_second"]  # 1 item left at the items' rate: 4 s
        assert 40.0 / items_eta >= 3
        text = cli("status", "--store", store.root, "enc", check=True).stdout
        assert re.search(r"^rate: .*about 40 s left \(400 rows left at 10 rows/s since the "
                         r"run started\)$", text, re.M), text
        clock.now += 15.0  # the big item is computed meanwhile
        data = json.loads(cli("status", "--store", store.root, "enc", "--json").stdout)
        assert data["eta_seconds"] == pytest.approx(25.0)
        whole = json.loads(cli("status", "--store", store.root, "--json", check=True).stdout)
        (entry,) = whole["stages"]
        assert entry["state"] == "running" and entry["unfinished_runs"] == ["enc"]
        assert entry["eta_seconds"] == pytest.approx(25.0) and entry["eta_from"] == "work"
    finally:
        unmark_running(stage)
    assert not record.exists()  # the run's record goes with it
    data = json.loads(cli("status", "--store", store.root, "enc", "--json").stdout)
    assert data["running"] is False and data["eta_seconds"] is None and data["work"] is None


def _store_of_every_state(tmp_path):
    store = Store(tmp_path / "s")
    done = _stage(store, "done", {"a": 2, "b": 3})
    _write(done, "a", 2)
    _write(done, "b", 3)
    store.set_name("done", done)
    failed = _stage(store, "failed", {"a": 2, "b": 3})
    _write(failed, "a", 2)
    failed.record("b", "failed", error="bad test item")
    store.set_name("bad", failed)
    killed = _stage(store, "killed", {"a": 2, "b": 3, "c": 4})  # its run was killed
    _write(killed, "a", 2)
    make_dirs(store.names_dir / RUNNING)
    atomic_write_bytes(store.names_dir / RUNNING / "half", pointer_bytes("half", killed.name))
    model = store.stage("fit", {"test": "model"}, inputs=[done], items=from_rows([], store.root))
    model.save_model("m", {"x": np.zeros(2, np.float32)}, {})
    store.set_name("model", model)
    unnamed = _stage(store, "unnamed", {"a": 2, "b": 3})  # computed now, no name
    return store, done, failed, killed, model, unnamed


def test_status_of_the_whole_store_says_each_stages_state(tmp_path, cli):
    store, done, failed, killed, model, unnamed = _store_of_every_state(tmp_path)
    _stage(store, "garbage", {"a": 1})  # neither named nor running: not listed
    mark_running(store, None, unnamed, WorkPlan(["a", "b"], {"a": 2, "b": 3}))
    try:
        _write(unnamed, "a", 2)
        data = json.loads(cli("status", "--store", store.root, "--json", check=True).stdout)
        states = {e["stage"]: (e["names"] + e["unfinished_runs"], e["state"], e["items"])
                  for e in data["stages"]}
        assert states == {
            done.name: (["done"], "done", {"total": 2, "done": 2, "failed": 0, "pending": 0}),
            failed.name: (["bad"], "failed", {"total": 2, "done": 1, "failed": 1,
                                               "pending": 0}),
            killed.name: (["half"], "incomplete", {"total": 3, "done": 1, "failed": 0,
                                                    "pending": 2}),
            model.name: (["model"], "done", None),
            unnamed.name: ([], "running", {"total": 2, "done": 1, "failed": 0, "pending": 1})}
        assert data["counts"] == {"running": 1, "failed": 1, "incomplete": 1, "done": 2}
        assert [e["stage"] for e in data["stages"]] == [failed.name, done.name, killed.name,
                                                        model.name, unnamed.name]  # by name
        assert data["problems"] == []
        text = cli("status", "--store", store.root).stdout.splitlines()
        assert text[0] == (f"store {store.root}: 5 stage(s) (1 running, 1 failed, "
                           "1 incomplete, 2 done)")
        assert text[1].split() == ["NAMES", "STATE", "DONE", "FAILED", "PENDING", "TOTAL",
                                   "TIME", "LEFT", "STAGE"]
        rows = {line.split()[-1]: line.split() for line in text[2:7]}
        assert rows[done.name][:6] == ["done", "done", "2", "0", "0", "2"]
        assert rows[failed.name][:6] == ["bad", "failed", "1", "1", "0", "2"]
        assert rows[killed.name][:6] == ["half(unfinished)", "incomplete", "1", "0", "2", "3"]
        assert rows[model.name][:6] == ["model", "done", "model", "-", "-", "-"]
        assert rows[unnamed.name][:2] == ["-", "running"]
        assert "`featpipe status NAME` lists" in text[-1]
        checked = cli("status", "--store", store.root, "--check")
        assert checked.exit_code == 1  # not every stage is done
    finally:
        unmark_running(unnamed)
    assert unnamed.name not in cli("status", "--store", store.root).stdout  # nobody on it


def test_status_of_a_store_whose_stages_are_done_checks_and_names_a_broken_one(tmp_path, cli):
    store = Store(tmp_path / "s")
    _stage(store, "garbage", {"a": 2})  # a stage exists, none named or computed
    empty = cli("status", "--store", store.root, "--check", check=True)
    assert empty.stdout == f"store {store.root}: 0 stage(s) named or being computed\n"
    assert json.loads(cli("status", "--store", store.root, "--json").stdout)["stages"] == []
    done = _stage(store, "done", {"a": 2})
    _write(done, "a", 2)
    store.set_name("done", done)
    assert cli("status", "--store", store.root, "--check", check=True).stdout.startswith(
        f"store {store.root}: 1 stage(s) (1 done)")
    (store.names_dir / "lost").write_text("encode-0123456789abcdef\n")
    broken = cli("status", "--store", store.root)
    assert broken.exit_code == 1 and "Traceback" not in broken.stderr
    assert re.search(r"^problem: .*lost.*", broken.stderr, re.M), broken.stderr


def test_a_damaged_work_record_is_left_out_and_the_run_timed_by_its_items(tmp_path, cli):
    store = Store(tmp_path / "s")
    lengths = {"a": 10, "b": 40, "c": 400}
    stage = _stage(store, "damaged", lengths)
    mark_running(store, "enc", stage, WorkPlan(list(lengths), lengths))
    try:
        _write(stage, "a", 10)
        _write(stage, "b", 40)
        record = stage.path / WORK_DIR / f"{HOST}-{os.getpid()}.json"
        record.write_bytes(record.read_bytes().replace(b'"a"', b'"x"'))  # its seal differs
        result = cli("status", "--store", store.root, "enc", "--json", check=True)
        data = json.loads(result.stdout)
        assert data["running"] is True and data["eta_from"] == "items"
        assert data["work"] is None and "Traceback" not in result.stderr
    finally:
        unmark_running(stage)
