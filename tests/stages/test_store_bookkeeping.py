"""The store's bookkeeping at its edges: what the key holds, which ledger line wins, what resume
trusts, what ``cache verify`` calls damage (issue 31 §4: each test kills a mutation of
``featpipe/store.py`` that the older tests let live; ``benchmarks/mutation_sample.py``)."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

import featpipe.store
from featpipe import FORMAT_VERSION
from featpipe.manifest import from_rows
from featpipe.store import Store


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


def _line(item_id, status, at, error=None) -> str:
    return json.dumps({"id": item_id, "status": status, "seconds": 0.5, "error": error,
                       "time": at}) + "\n"


def test_a_new_format_version_gives_every_stage_a_new_key(tmp_path, monkeypatch):
    items = from_rows([("x", "x.npy", ["a"], ["train"])], root=tmp_path)
    store = Store(tmp_path / "s")
    now = store.stage("import", {"p": 1}, items=items)
    monkeypatch.setattr(featpipe.store, "FORMAT_VERSION", FORMAT_VERSION + 1)
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
    _ledger_file(stage, 1).write_text(_line("x", "done", 200.0) + _line("y", "failed", 100.0)
                                      + _line("z", "failed", 300.0, "late error"))
    _ledger_file(stage, 2).write_text(_line("x", "failed", 100.0, "early error")
                                      + _line("y", "done", 200.0)
                                      + _line("z", "failed", 150.0, "early error"))
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
        handle.write(b"\n" + _line("z", "failed", 1.0).encode())
    problems = stage.ledger_problems()
    assert len(problems) == 1 and f"{ledger.name} line 3: not JSON" in problems[0]
    result = cli("cache", "verify", "--store", stage.store.root)
    assert result.exit_code == 1 and "line 3: not JSON" in result.output


@pytest.mark.parametrize(("line", "reason"), [
    ('["x"]', "not a JSON object"),
    ('{"status": "done"}', "'id' missing"),
    ('{"id": "x", "status": "ok"}', "'status' must be 'done' or 'failed'"),
    ('{"id": "x", "status": "done", "seconds": -1}', "'seconds' must be >= 0"),
    ('{"id": "x", "status": "done", "seconds": true}', "'seconds' must be a number"),
    ('{"id": "x", "status": "done", "time": 1e300}', "in the future"),
    ('{"id": "x", "status": "done", "seconds": 1e300}', "more than the time since 1970"),
    ('{"id": "x", "status": "done", "error": 3}', "'error' must be a string or null"),
])
def test_a_malformed_ledger_line_is_named_and_does_not_count(tmp_path, line, reason):
    stage = _stage(tmp_path)
    stage.write_item("y", np.ones(3))
    _put_file(stage, "x")
    _ledger_file(stage, 1).write_text(line + "\n" + _line("y", "done", 1.0))
    problems = stage.ledger_problems()
    assert len(problems) == 1 and "line 1: " in problems[0] and reason in problems[0]
    assert stage.done_ids() == {"y"}


def test_a_well_formed_line_with_defaults_counts(tmp_path):
    """``seconds``, ``time`` and ``error`` may be absent (0, 0, null); a line with them all
    at their limits is read as written."""
    stage = _stage(tmp_path)
    for item_id in ("x", "y"):
        _put_file(stage, item_id)
    _ledger_file(stage, 1).write_text('{"id": "x", "status": "done"}\n'
                                      '{"id": "y", "status": "done", "seconds": 0, "time": 0, '
                                      '"error": null}\n')
    assert stage.ledger_problems() == []
    assert stage.done_ids() == {"x", "y"}
    entry = stage.item_states()["x"]
    assert (entry.seconds, entry.time, entry.error) == (0.0, 0.0, None)
