"""`featpipe cache ls|verify|gc|pack`."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.fileio import HOST
from featpipe.manifest import from_rows
from featpipe.store import Store, pointer_bytes
from tests._stores import make_old


@pytest.fixture
def filled(tmp_path):
    """A store with a named import stage (4 items, one failed), a named child stage computed
    from it, an unnamed parent of nothing, and an unnamed orphan."""
    store = Store(tmp_path / "s")
    items = from_rows([(f"v/{n}", "", ["c"], ["train"]) for n in range(4)], tmp_path)
    base = store.stage("import", {"src": 1}, items=items)
    for n in range(3):
        base.write_item(f"v/{n}", np.full((n + 2, 3), n, np.float32),
                        extras={"timestamps": np.arange(n + 2) / 10})
    base.record("v/3", "failed", error="decode error")
    child = store.stage("encode", {"method": "avg"}, inputs=[base])
    for n in range(3):
        child.write_item(f"v/{n}", np.full(3, n, np.float32))
    child.save_model("scaler", {"mean": np.zeros(3)}, {"n": 3})
    orphan = store.stage("encode", {"method": "max"}, inputs=[base])
    orphan.write_item("v/0", np.ones(3))
    store.set_name("enc", child)
    return store, base, child, orphan


def age(path, seconds=3600):
    """Make a stage look untouched for an hour (gc keeps recently written stages)."""
    past = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (past, past))


def test_ls_lists_names_kinds_and_counts(filled, cli):
    store, base, child, orphan = filled
    result = cli("cache", "ls", "--store", store.root)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAMES", "STAGE", "KIND", "DONE", "FAILED", "TOTAL", "SIZE",
                                "CREATED", "INPUTS", "PARAMS"]
    table = {line.split()[1]: line.split() for line in lines[1:]}
    assert table[base.name][:6] == ["-", base.name, "import", "3", "1", "4"]
    assert table[base.name][8:] == ["-", "src=1"]
    assert table[child.name][:6] == ["enc", child.name, "encode", "3", "0", "4"]
    assert table[child.name][8:] == [base.name, 'method="avg"']
    assert table[orphan.name][3:6] == ["1", "0", "4"]
    for row in table.values():
        assert re.fullmatch(r"\d+(\.\d)?(B|KiB|MiB)", row[6]), row
        assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\dZ", row[7]), row


def test_verify_ok_then_each_kind_of_damage_is_named(filled, cli):
    store, base, child, orphan = filled
    ok = cli("cache", "verify", "--store", store.root)
    assert ok.exit_code == 0, ok.output
    assert "verified 7 items in 3 stages: 0 problem(s)" in ok.output
    assert f"ok: stage {base.name}: 3 items checked (1 of 4 not computed)" in ok.output
    # truncated file, NaN written behind featpipe's back, ragged item, missing file
    path = base.item_path("v/0")
    path.write_bytes(path.read_bytes()[:-4])
    np.save(base.item_path("v/1"), np.array([[np.nan, 0, 0]] * 3, np.float32))
    np.save(child.item_path("v/2"), np.ones(4, np.float32))
    orphan.item_path("v/0").unlink()
    result = cli("cache", "verify", "--store", store.root)
    assert result.exit_code == 1
    problems = sorted(line for line in result.output.splitlines()
                      if line.startswith("problem:"))
    assert len(problems) == 4
    assert any(p.startswith(f"problem: stage {base.name}: item 'v/0': unreadable (")
               for p in problems)
    for stage, item_id in ((base, "v/1"), (child, "v/2")):  # written behind featpipe's back
        assert any(p.startswith(f"problem: stage {stage.name}: item {item_id!r}: damaged (")
                   and "checksum crc32:" in p for p in problems), problems
    assert any(p.startswith(f"problem: stage {orphan.name}: item 'v/0': the ledger says done "
                            "but") for p in problems)
    only_child = cli("cache", "verify", "--store", store.root, "enc")
    assert only_child.exit_code == 1 and "in 1 stages: 1 problem(s)" in only_child.output
    make_old(store.root, item_sums=False)  # a store from before checksums
    old = cli("cache", "verify", "--store", store.root)
    problems = [line for line in old.output.splitlines() if line.startswith("problem:")]
    assert any(p.startswith(f"problem: stage {base.name}: item 'v/1': ") and
               "contains NaN or Inf; a re-run of the stage's command with --force "
               "recomputes it" in p for p in problems)
    assert (f"problem: stage {child.name}: item 'v/2': shape (4,) but 2 other items are "
            "vectors of shape (3,); a re-run of the stage's command with --force recomputes "
            "it") in problems
    assert "note: 5 item(s) were written before featpipe kept checksums" in old.output


def test_gc_keeps_named_and_needed_stages_and_removes_stale_tmp(filled, cli):
    store, base, child, orphan = filled
    for stage in (base, child, orphan):
        age(stage.path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    folder = base.item_path("v/0").parent
    stale = folder / f"x.npy.tmp.{HOST}.{dead_pid}"
    alive = folder / f"y.npy.tmp.{HOST}.1"  # pid 1 always runs
    other_host_recent = folder / f"z.npy.tmp.otherhost.{dead_pid}"
    for tmp in (stale, alive, other_host_recent):
        tmp.write_bytes(b"partial")
    dry = cli("cache", "gc", "--store", store.root, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"would remove stage {orphan.name}" in dry.output
    assert f"would remove temporary file {stale}" in dry.output
    assert orphan.path.exists() and stale.exists()
    result = cli("cache", "gc", "--store", store.root)
    assert result.exit_code == 0, result.output
    assert "removed 1 stage(s), 0 leftover(s) of killed commands and 1 temporary file(s)" \
        in result.output
    assert not orphan.path.exists() and not stale.exists()
    assert alive.exists() and other_host_recent.exists()
    assert base.path.exists() and child.path.exists()  # base is needed by the named child
    assert {s.name for s in store.all_stages()} == {base.name, child.name}
    np.testing.assert_array_equal(store.resolve("enc").read_item("v/1"), [1, 1, 1])


def test_gc_keeps_recently_written_unnamed_stages(filled, cli):
    store, base, child, orphan = filled
    result = cli("cache", "gc", "--store", store.root)
    assert f"kept stage {orphan.name}: written to less than 10 min ago" in result.output
    assert orphan.path.exists()
    result = cli("cache", "gc", "--store", store.root, "--min-age", "0")
    assert not orphan.path.exists()


def test_refs_lists_names_dependents_and_runs(filled, cli):
    """Issue 23: what refers to a stage, by name, folder or key."""
    store, base, child, orphan = filled
    store.set_name("raw", base)
    marker = store.names_dir / ".running" / "next"
    marker.parent.mkdir()
    marker.write_bytes(pointer_bytes("next", base.name))
    for query in ("raw", base.name, base.key):
        result = cli("cache", "refs", "--store", store.root, query)
        assert result.exit_code == 0, result.output
        assert result.output.splitlines() == [
            f"stage {base.name} (import)", "names: raw", "unfinished runs for: next",
            "input of: " + ", ".join(sorted([f"{child.name} (enc)", orphan.name])),
            "needed by names: enc"]
    result = cli("cache", "refs", "--store", store.root, "enc", "--json")
    assert json.loads(result.output) == {
        "stage": child.name, "kind": "encode", "names": ["enc"], "running": [],
        "dependents": {}, "needed_by": [], "unreadable": []}


def test_rm_removes_a_name_and_its_stage_only_when_nothing_else_refers_to_it(filled, cli):
    """Issue 23: ``cache rm NAME`` (``--dry-run``); a stage another name or stage needs is
    kept, and the command says which references keep it."""
    store, base, child, orphan = filled
    store.set_name("raw", base)
    store.set_name("enc2", child)
    dry = cli("cache", "rm", "--store", store.root, "enc", "--dry-run")
    assert dry.output.splitlines() == [
        f"would remove name enc (pointed to {child.name})",
        f"kept stage {child.name}: still referred to by name(s) enc2"]
    assert sorted(store.names()) == ["enc", "enc2", "raw"]
    result = cli("cache", "rm", "--store", store.root, "enc")
    assert result.exit_code == 0 and sorted(store.names()) == ["enc2", "raw"]
    assert child.path.exists()
    # raw's stage is the input of the child (named enc2) and of the unnamed orphan
    result = cli("cache", "rm", "--store", store.root, "raw")
    assert result.output.splitlines()[1] == (
        f"kept stage {base.name}: still referred to by input of "
        + ", ".join(sorted([f"{child.name} (enc2)", orphan.name])))
    assert base.path.exists() and "raw" not in store.names()
    dry = cli("cache", "rm", "--store", store.root, "enc2", "--dry-run")
    assert dry.output.splitlines()[1] == f"would remove stage {child.name} (nothing else " \
                                         "refers to it)"
    assert child.path.exists()
    result = cli("cache", "rm", "--store", store.root, "enc2")
    assert result.exit_code == 0 and not child.path.exists() and store.names() == {}
    # an unnamed stage by its folder: the orphan, then the base nothing needs any more
    assert cli("cache", "rm", "--store", store.root, orphan.name).exit_code == 0
    result = cli("cache", "rm", "--store", store.root, base.key)
    assert result.output == f"removed stage {base.name} (nothing else refers to it)\n"
    assert store.all_stages() == []
    missing = cli("cache", "rm", "--store", store.root, "enc")
    assert missing.exit_code == 1 and "no stage named 'enc'" in missing.output


def test_rm_keeps_a_stage_while_a_stage_folder_is_unreadable(filled, cli):
    store, base, child, orphan = filled
    broken = store.stages_dir / "encode-0123456789abcdef"
    broken.mkdir()
    (broken / "stage.json").write_text("{not json")
    result = cli("cache", "rm", "--store", store.root, "enc")
    assert "kept stage" in result.output and "unreadable stage(s) encode-0123456789abcdef" \
        in result.output
    assert child.path.exists() and "enc" not in store.names()


def test_rm_refuses_a_name_whose_run_is_computing(filled, cli):
    store, base, child, orphan = filled
    marker = store.names_dir / ".running" / "enc"
    marker.parent.mkdir()
    marker.write_bytes(pointer_bytes("enc", orphan.name))
    orphan.write_item("v/1", np.ones(3))  # this process's ledger, but no run marks the stage
    assert cli("cache", "rm", "--store", store.root, "enc", "--dry-run").exit_code == 0
    orphan.mark_running()  # this process, alive: a live run
    try:
        result = cli("cache", "rm", "--store", store.root, "enc")
    finally:
        orphan.unmark_running()
    assert result.exit_code == 1
    assert f"a run for 'enc' is computing stage {orphan.name} now" in result.output
    assert marker.exists() and "enc" in store.names()


def test_ls_fits_the_terminal_width_and_wide_shows_all(filled, cli):
    """Issue 23: the table fits $COLUMNS (the terminal's width): PARAMS shortened, then
    columns dropped with a note on stderr; --wide shows every column; a pipe gets all."""
    store, base, child, orphan = filled
    args = ("cache", "ls", "--store", store.root)
    full = cli(*args, env={"COLUMNS": ""}, check=True).stdout.splitlines()
    assert full[0].split()[-1] == "PARAMS" and max(map(len, full)) > 100
    for columns in (100, 80, 60, 40):
        proc = cli(*args, env={"COLUMNS": str(columns)}, check=True)
        lines = proc.stdout.splitlines()
        assert max(map(len, lines)) <= columns, (columns, lines)
        header = lines[0].split()
        assert header[:2] == ["NAMES", "STAGE"] and len(lines) == 4
        left_out = [c for c in full[0].split() if c not in header]
        if left_out:
            note = re.fullmatch(r"note: (.+) left out to fit (\d+) columns; --wide shows "
                                r"every column\n", proc.stderr)
            assert note and note.group(2) == str(columns)
            assert sorted(note.group(1).split(", ")) == sorted(left_out)
        else:
            assert proc.stderr == ""
    narrow = cli(*args, env={"COLUMNS": "60"}, check=True).stdout.splitlines()
    assert narrow[0].split() == ["NAMES", "STAGE", "KIND", "DONE", "FAILED", "TOTAL"]
    assert narrow[1:] == [line[:len(narrow[1])].rstrip() for line in narrow[1:]]
    wide = cli(*args, "--wide", env={"COLUMNS": "40"}, check=True)
    assert wide.stdout.splitlines() == full and wide.stderr == ""
