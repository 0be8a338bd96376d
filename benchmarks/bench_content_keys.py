"""Keying an ``import --from FOLDER`` by content: what it costs on a UCF101-sized folder.

Writes N small ``.npy`` files (default 13,320, UCF101's clip count; each a (T, 64) float32
sequence, T 10..40: 2.7-10 kB) and a manifest, then times, in the same run:

- the reference: locating each item's file and ``stat``-ing it (what a key by path, size and
  mtime needs);
- the content key, cold: every file read and hashed (SHA-256), the cache written;
- the content key, warm: the cache answers every file (one ``stat`` each);
- the content key after one file was rewritten (one file read again).

    python benchmarks/bench_content_keys.py [--items 13320] [--folder /tmp/bench-keys]

Prints each time and its ratio to the reference.  The cold time depends on the page cache:
the files were just written, so they are read from memory (``--drop`` is not attempted).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from featpipe.io.importers import NpyDirSource, source_fingerprint
from featpipe.manifest import Manifest
from featpipe.store.content import ContentHashes


def write_folder(root: Path, n: int) -> Path:
    folder = root / "npy"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["id,path,label,split1"]
    for i in range(n):
        np.save(folder / f"v{i:05d}.npy",
                rng.standard_normal((10 + i % 31, 64)).astype(np.float32))
        rows.append(f"v{i:05d},npy/v{i:05d}.npy,c{i % 101},{'train' if i % 3 else 'test'}")
    manifest = root / "m.csv"
    manifest.write_text("\n".join(rows) + "\n")
    return manifest


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=13_320)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    root = Path(args.folder or tempfile.mkdtemp(prefix="bench-keys-"))
    manifest_path = write_folder(root, args.items)
    manifest = Manifest.read(manifest_path)
    source = NpyDirSource(root / "npy", manifest)
    total = sum(p.stat().st_size for p in (root / "npy").iterdir())
    print(f"{args.items} files, {total / 1e6:.1f} MB, in {root}")

    def by_stat():
        return [os.stat(source.locate(item)).st_size for item in manifest]

    reference, _ = timed(by_stat)
    print(f"locate + stat (key by path/size/mtime): {reference:7.3f} s")
    cache = root / "content-hashes.json"

    def content():
        hashes = ContentHashes(cache)
        key = source_fingerprint(source, manifest, hashes)
        hashes.save()
        return key, hashes.read_bytes

    cold, (key, read) = timed(content)
    print(f"content key, cold (read {read / 1e6:.1f} MB): {cold:7.3f} s  "
          f"{cold / reference:5.1f}x the reference")
    warm, (again, read) = timed(content)
    assert again == key and read == 0
    print(f"content key, warm (cache, read {read} B):   {warm:7.3f} s  "
          f"{warm / reference:5.1f}x the reference")
    target = root / "npy" / "v00001.npy"
    np.save(target, np.load(target) + 1)
    changed, (third, read) = timed(content)
    assert third != key and 0 < read < 20_000
    print(f"content key, one file rewritten (read {read} B): {changed:7.3f} s  "
          f"{changed / reference:5.1f}x the reference")


if __name__ == "__main__":
    main()
