"""The index (featpipe/store/index.py) folds ledger lines in pieces, in any order, into what the
rule of its docstring gives over all lines at once; written, read back and refolded, it
stays equal to that reference, here a literal transcription of the rule."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.store import Store
from featpipe.store import index as stage_index
from featpipe.store.ledger import ledger_entry as _ledger_entry
from tests._stores import sealed_line


def reference(lines: list[dict]) -> dict[str, tuple]:
    """Per item: (status, sums, batch) by the rule: done when a done line is later than its
    last removed line, failed when a failed line is, else removed; sums and batch of the
    latest done line."""
    states = {}
    for item_id in {line["id"] for line in lines}:
        mine = [line for line in lines if line["id"] == item_id]

        def latest(status, mine=mine):
            found = [line for line in mine if line["status"] == status]
            return max(found, key=lambda line: line["time"]) if found else None

        done, failed, removed = latest("done"), latest("failed"), latest("removed")
        cut = removed["time"] if removed else -1.0
        if done and done["time"] > cut:
            states[item_id] = ("done", done.get("sums"), done.get("batch"))
        elif failed and failed["time"] > cut:
            states[item_id] = ("failed", None, None)
        else:
            states[item_id] = ("removed", None, None)
    return states


def random_lines(rng, n_ids: int, n_lines: int) -> list[dict]:
    times = rng.permutation(n_lines) * 1.5 + 1000.0  # distinct times, in any order
    lines = []
    for time in times:
        status = rng.choice(["done", "done", "failed", "removed"])
        line = {"id": f"i{rng.integers(n_ids)}", "status": status, "seconds": 0.1,
                "error": "bad" if status == "failed" else None, "time": float(time)}
        if status == "done":
            line["sums"] = {".npy": f"crc32:{rng.integers(2**32):08x}"}
            if rng.random() < 0.5:
                line["sums"]["+timestamps.npy"] = f"crc32:{rng.integers(2**32):08x}"
            if rng.random() < 0.5:
                line["batch"] = f"h-1-{rng.integers(2**40):012x}.0000abcd.npz"
        lines.append(line)
    return lines


def folded(stage) -> dict[str, tuple]:
    table = stage.index(need_table=True).table
    return {item_id: (s.status, *((s.sums, s.batch) if s.status == "done" else (None, None)))
            for item_id, s in table.items()}


@pytest.mark.parametrize("seed", range(4))
def test_folding_in_pieces_in_any_order_equals_the_rule(tmp_path, seed, monkeypatch):
    monkeypatch.setattr(stage_index, "MERGE_EVERY", 7)  # merge into the arrays often
    rng = np.random.default_rng(seed)
    items = from_rows([(f"i{k}", "", [], []) for k in range(40)], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {"seed": seed}, items=items)
    lines = random_lines(rng, 40, 400)
    ledgers = [stage.path / "ledger" / f"h-{k}.jsonl" for k in range(3)]
    ledgers[0].parent.mkdir()
    written: list[dict] = []
    for start in range(0, len(lines), 50):  # ledgers grow between compactions
        for line in lines[start:start + 50]:
            with open(ledgers[rng.integers(3)], "a") as handle:
                handle.write(sealed_line(stage, line))
            written.append(line)
        if rng.random() < 0.6:
            assert stage.compact_index()
        assert folded(stage) == reference(written)
        index = stage.index()
        expected = reference(written)
        assert index.done == sum(s[0] == "done" for s in expected.values())
        assert set(index.failed) == {i for i, s in expected.items() if s[0] == "failed"}
    assert stage.index_problems() == []
    assert (stage.path / stage_index.INDEX_FILE).exists()


def test_an_index_read_folds_only_what_was_appended_since(tmp_path, monkeypatch):
    items = from_rows([(f"i{k}", "", [], []) for k in range(30)], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    for k in range(30):
        stage.record(f"i{k}", "done", sums={".npy": "crc32:00000001"})
    assert stage.compact_index() and not stage.compact_index()  # nothing new: no write
    calls = []
    fold = stage_index._fold_line
    monkeypatch.setattr(stage_index, "_fold_line", lambda *a: calls.append(a) or fold(*a))
    index = stage.index()
    assert (index.done, calls, index.table) == (30, [], None)  # counts only: no table read
    stage.record("i3", "removed", error="gone")
    stage.record("x", "failed", error="bad")
    index = stage.index()
    assert len(calls) == 2 and (index.done, index.failed) == (29, {"x": "bad"})


@pytest.mark.parametrize("edit", ["rewrite", "truncate", "replace", "remove"])
def test_a_ledger_that_is_not_a_longer_copy_is_folded_again(tmp_path, edit):
    items = from_rows([(f"i{k}", "", [], []) for k in range(5)], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    for k in range(5):
        stage.record(f"i{k}", "done", sums={".npy": "crc32:00000001"})
    assert stage.compact_index()
    ledger = next((stage.path / "ledger").glob("*.jsonl"))
    lines = ledger.read_text().splitlines(keepends=True)
    if edit == "rewrite":  # same size, first line now failed
        ledger.write_text(lines[0].replace('"done"', '"fail"') + "".join(lines[1:]))
    elif edit == "truncate":
        ledger.write_text("".join(lines[:2]))
    elif edit == "replace":
        other = ledger.with_suffix(".new")
        other.write_text("".join(lines[1:]))
        other.replace(ledger)
    else:
        ledger.unlink()
    expected = {"rewrite": 4, "truncate": 2, "replace": 4, "remove": 0}[edit]
    assert stage.index().done == expected  # stale: this first read writes it again (51.4)
    assert stage.index_problems() == []
    assert not stage.compact_index() and stage.index(need_table=True).done == expected


def test_a_damaged_index_is_folded_again_and_named(tmp_path):
    items = from_rows([(f"i{k}", "", [], []) for k in range(5)], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    for k in range(5):
        stage.record(f"i{k}", "done", sums={".npy": "crc32:00000001"})
    stage.record("i0", "failed", error="e")
    assert stage.compact_index()
    record = stage.path / stage_index.INDEX_FILE
    text = record.read_text()
    assert '"done": 5,' in text
    record.write_text(text.replace('"done": 5,', '"done": 6,'))  # valid JSON, wrong count
    assert stage.index().done == 5  # its checksum differs: folded from the ledgers
    assert "damaged" in stage.index_problems()[0]
    assert stage.compact_index()  # a run writes it again
    table = next(stage.path.glob(f"{stage_index.TABLE_PREFIX}*.npz"))
    data = bytearray(table.read_bytes())
    data[-100] ^= 1
    table.write_bytes(bytes(data))
    assert stage.index(need_table=True).done == 5
    assert "damaged" in stage.index_problems()[0]


def test_a_removed_line_undoes_the_done_lines_before_it_only(tmp_path):
    items = from_rows([("a", "", [], []), ("b", "", [], [])], tmp_path)
    stage = Store(tmp_path / "s").stage("import", {}, items=items)
    entry = _ledger_entry
    sums = {".npy": "crc32:00000001"}  # a done line of a stage with checksums has them
    for raw in ({"id": "a", "status": "done", "time": 1.0, "sums": sums},
                {"id": "a", "status": "removed", "time": 2.0, "error": "damaged"},
                {"id": "b", "status": "removed", "time": 1.0},
                {"id": "b", "status": "done", "time": 2.0, "sums": sums}):
        assert not isinstance(entry(raw), str)
        stage.path.joinpath("ledger").mkdir(exist_ok=True)
        with open(stage.path / "ledger" / "h-1.jsonl", "a") as handle:
            handle.write(sealed_line(stage, raw))
    for item_id in ("a", "b"):
        stage.item_path(item_id).parent.mkdir(parents=True, exist_ok=True)
        np.save(stage.item_path(item_id), np.ones(2))
    assert stage.done_ids() == {"b"} and stage.failed() == {}
    assert stage.item_states()["a"].status == "removed"
