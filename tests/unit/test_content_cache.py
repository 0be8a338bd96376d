"""The content-hash cache in memory (issue 38 §5: a folder import of 10^6 files): each entry
packed, the file scanned entry by entry, the bytes written equal to the sealed JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest

from featpipe.checksums import seal_json
from featpipe.store import content

ENTRIES = {
    "/data/v0000001.npy": [1234, 1_700_000_000_123_456_789, 1_700_000_000_223_456_789, 42,
                           "0123456789abcdef" * 4],
    "/data/caf\u00e9 \"quoted\" \\ back.npy": [0, -5, 7, 2**64 - 1, "f" * 64],
    "/data/\U0001f600.npy": [2**63 - 1, 0, 0, 0, "a" * 64],
}


def _written(entries: dict) -> bytes:
    handle = io.BytesIO()
    content.write_cache(handle, entries.items())
    return handle.getvalue()


@pytest.mark.parametrize("entries", [{}, dict(list(ENTRIES.items())[:1]), ENTRIES])
def test_the_cache_is_written_as_its_sealed_json_and_read_back_packed(tmp_path, entries):
    path = tmp_path / "content-hashes.json"
    path.write_bytes(_written(entries))
    assert path.read_bytes() == content.cache_bytes(entries)
    assert content.load_cache(path, strict=True) == entries
    packed = content.load_packed_cache(path)
    assert {k: content._unpacked(v) for k, v in packed.items()} == entries


def test_a_cache_it_wrote_is_scanned_not_loaded_as_json(tmp_path, monkeypatch):
    """The file :func:`write_cache` writes is read entry by entry (the dict of lists JSON
    would build is the memory this avoids at 10^6 files): never through ``load_cache``."""
    path = tmp_path / "content-hashes.json"
    path.write_bytes(_written(ENTRIES))
    monkeypatch.setattr(content, "load_cache", lambda *a, **k: pytest.fail("loaded as JSON"))
    assert len(content.load_packed_cache(path)) == len(ENTRIES)
    path.write_bytes(json.dumps(ENTRIES).encode())  # unsealed, the same layout: scanned too
    assert len(content.load_packed_cache(path)) == len(ENTRIES)


@pytest.mark.parametrize("layout", ["unsealed", "indented", "sealed-indented", "odd-entry",
                                    "huge-entry"])
def test_a_cache_of_another_layout_is_read_as_json(tmp_path, layout):
    """A cache the scanner does not recognise (an older, unsealed one; one a tool rewrote
    with indentation; an entry of another form) is read whole as JSON, as before; an entry
    that is not of the form is dropped (its file is hashed again)."""
    entries = dict(ENTRIES)
    if layout == "odd-entry":
        entries["/data/odd.npy"] = [1, 2, 3, "not an inode", "b" * 64]
    elif layout == "huge-entry":  # of the scanned form, but no 64-bit inode
        entries["/data/odd.npy"] = [1, 2, 3, 2**64, "b" * 64]
    text = json.dumps(entries, indent=1 if "indented" in layout else None)
    raw = text.encode() if layout in ("unsealed", "indented", "odd-entry") else \
        seal_json(text.encode(), content.CACHE_NAME)
    path = tmp_path / "content-hashes.json"
    path.write_bytes(raw)
    packed = content.load_packed_cache(path)
    expected = {k: v for k, v in entries.items() if k != "/data/odd.npy"}
    assert {k: content._unpacked(v) for k, v in packed.items() if v is not None} == expected
    assert ("/data/odd.npy" in packed) == (layout in ("odd-entry", "huge-entry"))


@pytest.mark.parametrize("damage", ["byte", "truncated", "empty"])
def test_a_damaged_cache_is_empty_with_a_warning(tmp_path, caplog, damage):
    path = tmp_path / "content-hashes.json"
    raw = bytearray(_written(ENTRIES))
    if damage == "byte":
        raw[30] ^= 1
    elif damage == "truncated":
        raw = raw[:-40]
    else:
        raw = b""
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        assert content.load_packed_cache(path) == {}
    assert "is damaged" in caplog.text and "hashed again" in caplog.text


def test_hashes_come_from_the_cache_until_a_file_changes(tmp_path):
    """ContentHashes with its packed cache: a second object reads no byte of an unchanged
    file, hashes a rewritten one again, and saves what it hashed."""
    files = [tmp_path / f"v{i}.npy" for i in range(3)]
    for i, path in enumerate(files):
        path.write_bytes(bytes([i]) * (i + 1))
    cache = tmp_path / "store" / "content-hashes.json"
    first = content.ContentHashes(cache)
    digests = [first.file_hash(path) for path in files]
    first.save()
    assert first.read_bytes == 6
    second = content.ContentHashes(cache)
    assert [second.file_hash(path) for path in files] == digests
    assert second.read_bytes == 0
    files[1].write_bytes(b"changed")
    assert second.file_hash(files[1]) == (7, content.sha256_of(files[1]))
    assert second.read_bytes == 7
    second.save()
    saved = content.load_cache(cache, strict=True)
    assert saved[str(files[1])][4] == content.sha256_of(files[1])
    assert saved[str(files[0])] == second.seen[str(files[0])]
