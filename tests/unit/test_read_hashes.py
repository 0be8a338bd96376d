"""The read-hash record held compactly (:class:`featpipe.store.content.ReadHashes`): the same
mapping as the JSON it is scanned from, whatever the ids, in a fraction of a dict's memory."""

import hashlib
import json
import tracemalloc

import pytest

from featpipe.store.content import ReadHashes, _record_pairs, read_hashes_record

ODD_IDS = ["a", "b/c \"q\" é", "x\\y", "tab\there", "日本/クリップ", "", "  ", "v\u0000z"]


def _hashes(ids):
    return {item_id: (None if k % 3 == 1 else hashlib.sha256(item_id.encode()).hexdigest())
            for k, item_id in enumerate(ids)}


def test_the_scanned_record_is_the_json_mapping_for_any_ids():
    hashes = _hashes(ODD_IDS + [f"v{i:05d}" for i in range(500)])
    raw = read_hashes_record(hashes)
    assert json.loads(raw) == hashes
    held = ReadHashes(lambda: _record_pairs(raw))
    assert held == hashes and dict(held) == hashes and len(held) == len(hashes)
    for item_id, digest in hashes.items():
        assert item_id in held and held[item_id] == digest
    assert "absent" not in held and held.get("absent", "no") == "no" and 3 not in held
    with pytest.raises(KeyError):
        held["absent"]
    assert ReadHashes(lambda: _record_pairs(b"{}")) == {}
    again = ReadHashes(lambda: _record_pairs(raw))  # two tables: compared as tables
    assert again == held and held == held
    other = dict(hashes, a="0" * 64)
    assert ReadHashes(lambda: _record_pairs(read_hashes_record(other))) != held
    assert ReadHashes(lambda: _record_pairs(read_hashes_record({"a": None}))) != held


@pytest.mark.parametrize("raw", [b'{"a": 1}', b'["a"]', b'{"a": "abc"}',
                                 b'{"a": null,"b": null}', b'{"a": null;;"b": null}',
                                 b'{"a": null'])
def test_another_layout_is_refused_by_the_scanner(raw):
    with pytest.raises(ValueError):
        list(_record_pairs(raw))


def test_memory_per_item_is_a_fraction_of_a_dicts():
    hashes = _hashes([f"class{i % 101:03d}/v_{i:07d}" for i in range(20_000)])
    raw = read_hashes_record(hashes)
    tracemalloc.start()
    held = ReadHashes(lambda: _record_pairs(raw))
    compact = tracemalloc.get_traced_memory()[0]
    as_dict = json.loads(raw)
    both = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert held == as_dict
    assert compact < 64 * len(hashes) < (both - compact) / 2, (compact, both - compact)
