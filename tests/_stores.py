"""Helpers to compare stores in cluster tests: load every item, count ledger lines."""

from __future__ import annotations

from collections import Counter

import numpy as np

from featpipe.manifest import from_rows
from featpipe.store import Store
from tests._computes import expected_array


def load_all(store_dir, name) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Every item of stage ``name`` with its sidecars; fails on a missing or corrupt item."""
    stage = Store(store_dir).resolve(name)
    loaded = {}
    for item_id in stage.items.ids:
        array = stage.read_item(item_id)
        assert np.all(np.isfinite(array)), item_id
        loaded[item_id] = (array, stage.extras_of(item_id))
    return loaded


def assert_same_items(left, right) -> None:
    """Byte-equal arrays and sidecars, same ids, same dtypes and shapes."""
    assert left.keys() == right.keys()
    for item_id, (array, extras) in left.items():
        other, other_extras = right[item_id]
        assert array.dtype == other.dtype and array.shape == other.shape, item_id
        assert array.tobytes() == other.tobytes(), item_id
        assert extras.keys() == other_extras.keys(), item_id
        for key in extras:
            assert extras[key].tobytes() == other_extras[key].tobytes(), (item_id, key)


def assert_matches_literal(loaded) -> None:
    for item_id, (array, _) in loaded.items():
        assert array.tobytes() == expected_array(item_id).tobytes(), item_id


def named_or_only_stage(store_dir, name):
    """The stage ``name`` points to, or, while it has no name yet (a name moves to a stage only
    once the stage is complete), the store's only stage."""
    store = Store(store_dir)
    if name in store.names():
        return store.resolve(name)
    stages = store.all_stages()
    assert len(stages) == 1, f"no stage named {name!r} and {len(stages)} stages"
    return stages[0]


def done_lines(store_dir, name) -> Counter:
    """How many ``done`` ledger lines each item has, over all ledgers."""
    stage = named_or_only_stage(store_dir, name)
    return Counter(e.id for e in stage.ledger() if e.status == "done")


def write_npy_dataset(folder, n: int = 12, dim: int = 8):
    """A manifest and one (T, dim) float32 .npy per item (T varies): input for `import`."""
    (folder / "npy").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["id,path,label,split1"]
    for i in range(n):
        np.save(folder / "npy" / f"v{i:02d}.npy",
                rng.standard_normal((5 + i % 7, dim)).astype(np.float32))
        rows.append(f"v{i:02d},npy/v{i:02d}.npy,c{i % 3},{'train' if i % 2 else 'test'}")
    manifest = folder / "m.csv"
    manifest.write_text("\n".join(rows) + "\n")
    return manifest


def six_sequences(root) -> Store:
    """A store at ``root/s`` with six labelled (12, 3) sequences, t0..t3 train and t4, t5
    test, as an import stage named ``seq``."""
    rng = np.random.default_rng(0)
    rows = [(f"t{i}", f"t{i}.mp4", ["up" if i % 2 else "down"], ["train" if i < 4 else "test"])
            for i in range(6)]
    store = Store(root / "s")
    stage = store.stage("import", {"seq": 1}, items=from_rows(rows, root=root))
    for item_id, *_ in rows:
        stage.write_item(item_id, rng.random((12, 3)).astype(np.float32))
    store.set_name("seq", stage)
    return store


def sealed_line(stage, entry: dict) -> str:
    """A ledger line of ``stage`` as featpipe writes it (sealed to the stage), for tests that
    write ledgers by hand."""
    import json

    from featpipe.checksums import seal_json
    from featpipe.store import ledger_owner

    text = json.dumps(entry, ensure_ascii=False).encode("utf-8")
    return seal_json(text, ledger_owner(stage.name)).decode("utf-8") + "\n"


def make_old(root, item_sums: bool = True) -> None:
    """Turn the store at ``root`` into one written before featpipe kept checksums of its
    records (issue 39): ``stage.json`` without ``checksums``, ``files`` and its seal, ledger
    lines, ``pack.json`` and ``content-hashes.json`` without seals, name files of one line;
    without ``item_sums`` also as before issue 31: ledger lines without ``sums``, no model
    ``.sums``, ``pack.json`` without ``sums``."""
    import json
    from pathlib import Path

    root = Path(root)

    def rewrite_json(path, drop, indent=None):
        value = json.loads(path.read_text())
        value = {k: v for k, v in value.items() if k not in drop}
        path.write_text(json.dumps(value, indent=indent, sort_keys=indent is not None))

    for meta in root.glob("stages/*/stage.json"):
        rewrite_json(meta, {"checksums", "files", "crc32"}, indent=2)
    drop = {"crc32"} | (set() if item_sums else {"sums"})
    for ledger in root.glob("stages/*/ledger/*.jsonl"):
        lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
        ledger.write_text("".join(json.dumps({k: v for k, v in line.items() if k not in drop})
                                  + "\n" for line in lines))
    for index in root.glob("stages/*/packed/pack.json"):
        rewrite_json(index, drop)
    if (root / "content-hashes.json").exists():
        rewrite_json(root / "content-hashes.json", {"crc32"})
    for name in [*root.glob("names/*"), *root.glob("names/.running/*")]:
        if name.is_file():
            name.write_text(name.read_text().splitlines()[0] + "\n")
    if not item_sums:
        for sums in root.glob("stages/*/models/*.sums"):
            sums.unlink()


def imported_store(tmp_path, cli) -> tuple:
    """A store with the items of :func:`write_npy_dataset` imported as ``feat``: (the store's
    path, the import command that made it)."""
    manifest = write_npy_dataset(tmp_path)
    store = tmp_path / "s"
    command = ("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
               "--name", "feat")
    cli(*command, check=True)
    return store, command


def first_encoded(store: Store, proc, seconds: float = 120):
    """The encode stage of ``store`` once the process ``proc`` running it has finished an
    item (the test fails when ``proc`` ends first or nothing is done in time)."""
    import time

    deadline = time.monotonic() + seconds
    stage = None
    while time.monotonic() < deadline:
        stage = next((s for s in store.all_stages() if s.kind == "encode"), None)
        if stage is not None and stage.done_ids():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    assert stage is not None and stage.done_ids(), "no item finished in time"
    return stage



def deny(monkeypatch, method: str, denied) -> None:
    """``path.<method>()`` fails with EACCES for the paths ``denied(path)`` is true of, as
    for another user's file (the tests run as root, who may read or delete anything); undone
    with the ``monkeypatch`` (``pytest.MonkeyPatch.context()`` for a part of a test)."""
    import errno
    import os
    from pathlib import Path

    real = getattr(Path, method)

    def no_permission(self, *args, **kwargs):
        if denied(self):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, method, no_permission)


def named_view(root):
    """A store with an extract stage of three (5, 8) items and a view ``part`` of its columns
    2:6: (store, source, view)."""
    store = Store(root)
    items = from_rows([(f"v{i}", "", ["c"], ["train"]) for i in range(3)], root.parent)
    source = store.stage("extract", {"n": 3}, items=items)
    for i in range(3):
        source.write_item(f"v{i}", np.full((5, 8), i, np.float32))
    view = store.stage("encode", {"part": 1}, inputs=[source], items=items)
    view.make_view(source, slice(2, 6), [])
    store.set_name("part", view)
    return store, source, view
