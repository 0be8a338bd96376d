"""The on-disk format of a store, byte for byte: a fixed sequence of commands (import, encode,
a batched stage, a fit, a view, names, a damaged item repaired and recomputed, a pack, gc)
writes a store whose every file equals the golden listing ``store_format.json`` beside this
file, which was written by featpipe before ``featpipe/store.py`` became the package
``featpipe/store/`` (issue 48): the move changed no byte.  Since then only the ``.npz`` files
(index tables, models) and the records holding their checksums were written again, once the
``.npz`` writer stopped depending on the Python that runs it (``test_npz_bytes.py``): the same
arrays, the same members, without ``np.savez``'s forced ZIP64 fields.

What differs between two runs of the same commands is fixed while they run (the clock, the
process id, the host name, the random tokens of file names) or, where it cannot be, replaced
after the check that it is sound (a stage's creation time and package versions, inode numbers,
the paths and stat records of the content-hash cache; each replaced record's own checksum is
checked first).  A change of the format on purpose (:data:`featpipe.FORMAT_VERSION`) writes a
new golden listing: ``FEATPIPE_WRITE_GOLDEN=1 python -m pytest tests/stages/test_store_format.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
import time
import zlib
from pathlib import Path

import numpy as np

import featpipe.cli  # noqa: F401 - every module the commands use, imported before the patches
import featpipe.fileio
from featpipe.stages.cache import gc
from featpipe.store import Store
from tests._stores import write_npy_dataset

GOLDEN = Path(__file__).with_name("store_format.json")
_SEAL = re.compile(rb'"crc32": "(crc32:[0-9a-f]{8})"')


class _Clock:
    """``time.time`` and ``time.perf_counter`` standing still within a step, moved on by
    :meth:`tick` between steps (a removal and the recomputation after it keep their order)."""

    def __init__(self):
        self.now = 1.7e9

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 100.0


def _fix_process(monkeypatch) -> _Clock:
    """The clock, the process id, the host name and the random tokens fixed (module docstring)."""
    clock = _Clock()
    monkeypatch.setattr(time, "time", clock)
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    counter = iter(range(1, 10**6))
    monkeypatch.setattr(secrets, "token_hex", lambda n=32: f"{next(counter):0{2 * n}x}")
    real_host = featpipe.fileio.HOST
    for name, module in list(sys.modules.items()):
        if name.startswith("featpipe") and module is not None:
            for attribute in ("HOST", "_HOST"):
                if getattr(module, attribute, None) in (real_host,
                                                        re.sub(r"[^A-Za-z0-9._-]+", "_",
                                                               real_host)):
                    monkeypatch.setattr(module, attribute, "golden")
    return clock


def _batch_modules():
    """The module(s) holding the batch threshold (``MIN_ITEMS``), wherever they live."""
    return [m for n, m in list(sys.modules.items()) if n.startswith("featpipe") and
            n.endswith("batches") and hasattr(m, "MIN_ITEMS")]


def _write_store(root: Path, cli, monkeypatch) -> Path:
    """The fixed sequence of commands; returns the store's folder."""
    clock = _fix_process(monkeypatch)
    manifest = write_npy_dataset(root)
    store = root / "s"

    def step(*args, check=True):
        cli(*args, check=check)
        clock.tick()

    step("import", "--manifest", manifest, "--from", root / "npy", "--store", store,
         "--name", "feat")
    step("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "avg")
    with monkeypatch.context() as patch:
        for module in _batch_modules():
            patch.setattr(module, "MIN_ITEMS", 3)
        step("encode", "-s", store, "-i", "feat", "-m", "max", "-n", "mx")
    step("fit", "pca", "--store", store, "--input", "feat", "--name", "p3", "--dim", "3",
         "--seed", "7")
    step("encode", "-s", store, "-i", "feat", "-m", "tpyramid", "-n", "gone")
    opened = Store(store)
    feat = opened.resolve("feat")
    view = opened.stage("encode", {"part": 1}, inputs=[feat])
    view.make_view(feat, slice(2, 6), [])
    opened.set_name("part", view)
    frames = opened.stage("extract", {"sidecars": 1}, inputs=[feat], dtype="float16")
    rows = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    for item_id in ("v00", "v04"):
        frames.write_item(item_id, rows, {"timestamps": np.arange(4) / 25.0})
    with monkeypatch.context() as patch:
        for module in _batch_modules():
            patch.setattr(module, "MIN_ITEMS", 3)
        writer = frames.batch_writer()
        writer.add("v01", rows * 2, {"frame_index": np.arange(4)}, seconds=0.5)
        writer.add("v02", rows * 3, {}, seconds=0.25)
        writer.fail("v03", 0.125, "decoder gave up")
        writer.commit()
    frames.record_removed(["v04"], "removed by hand")  # its files: strays to --repair
    frames.compact_index()
    opened.set_name("frames", frames)
    framed = opened.stage("encode", {"part": 2}, inputs=[frames])
    framed.make_view(frames, slice(1, 3), ["frame_index"])
    (opened.names_dir / "gone").unlink()  # an unnamed stage for gc
    clock.tick()
    damaged = opened.resolve("avg").item_path("v03")
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    step("cache", "verify", "--store", store, "--repair", check=False)
    step("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "avg")
    step("cache", "pack", "--store", store, "avg")
    gc(Store(store), min_age=0.0)
    clock.tick()
    return store


def _crc(data: bytes, owner: str = "") -> str:
    return f"crc32:{zlib.crc32(data, zlib.crc32(owner.encode())) & 0xFFFFFFFF:08x}"


def _unsealed(raw: bytes, owner: str) -> bytes:
    """``raw`` with its seal replaced, after checking that the seal holds."""
    found = _SEAL.search(raw)
    assert found is not None, owner
    head = raw[:found.start()]
    assert found.group(1).decode() == _crc(head, owner), owner
    return raw[:found.start()] + b'"crc32": "<seal>"' + raw[found.end():]


def _normalised(relative: str, raw: bytes, store: Path, root: Path) -> bytes:
    """The bytes of the file at ``relative`` with what two runs cannot share replaced."""
    if relative.endswith("/stage.json"):
        raw = _unsealed(raw, relative)
        raw = re.sub(rb'"created": "[^"]*"', b'"created": "<created>"', raw)
        raw = re.sub(rb'"versions": \{[^}]*\}', b'"versions": "<versions>"', raw)
        items = (store / relative).with_name("items.csv")
        if items.exists():  # its checksum, of the paths of this run's folder
            crc = _crc(items.read_bytes()).encode()
            assert b'"items.csv": "' + crc + b'"' in raw, relative
            raw = raw.replace(crc, b"<items.csv>")
        return raw
    if relative.endswith("/items.csv"):
        return raw.replace(str(root).encode(), b"<root>")
    if relative == "content-hashes.json":
        raw = _unsealed(raw, relative)
        entries = json.loads(raw)
        entries.pop("crc32")
        return json.dumps(sorted(
            (os.path.relpath(path, root), size, digest)
            for path, (size, _, _, _, digest) in entries.items())).encode()
    if relative.endswith("/index.json"):
        record = json.loads(raw)
        canonical = json.dumps(record["index"], sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode()
        assert record["sum"] == _crc(canonical), relative
        for tally in record["index"]["ledgers"].values():
            tally["inode"] = 0
        return json.dumps(record["index"], sort_keys=True).encode()
    return raw


def _listing(store: Path, root: Path) -> dict[str, list]:
    """``relative path: [size, SHA-256]`` of the normalised bytes of every file in ``store``,
    ``relative path/: []`` of every folder (no link is followed: there is none)."""
    found = {}
    for folder, dirs, files in os.walk(store):
        found.update({(Path(folder) / name).relative_to(store).as_posix() + "/": []
                      for name in dirs})
        for name in files:
            path = Path(folder) / name
            assert not path.is_symlink(), path
            relative = path.relative_to(store).as_posix()
            data = _normalised(relative, path.read_bytes(), store, root)
            found[relative] = [len(data), hashlib.sha256(data).hexdigest()]
    return dict(sorted(found.items()))


def test_a_fixed_sequence_of_commands_writes_the_golden_store_byte_for_byte(
        tmp_path, cli, monkeypatch):
    store = _write_store(tmp_path, cli, monkeypatch)
    listing = _listing(store, tmp_path)
    if os.environ.get("FEATPIPE_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(listing, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert list(listing) == list(golden)  # the same files, by the same names
    differ = [path for path in golden if listing[path] != golden[path]]
    assert not differ, "\n".join(differ)
    # the scenario reached every kind of file it means to compare
    kinds = {"batches/", "packed/pack.json", ".h5", "models/", "view.json", "ledger/",
             "index.json", "read-hashes.json", "items.csv", "names/", "+timestamps.npy",
             "content-hashes.json", "locks/"}
    assert all(any(kind in path for path in listing) for kind in kinds)
