"""What the checksums at rest (issue 31 §1, :mod:`featpipe.checksums`) cost on the write path
and on the read path, measured in the same run with and without them.

Write path: an item written as the store writes it (:func:`featpipe.fileio.atomic_save_npy`:
temporary file, write, fsync, rename) and an item appended row block by row block
(:class:`featpipe.store.item_files.RowFile`, the streaming path), each timed with the CRC and
with the CRC replaced by a no-op (the same code otherwise); ``np.save`` through the same atomic
write (the path before checksums) is printed too.  Read path: :func:`featpipe.fileio.load_npy` of
an item with and without its checksum checked (warm page cache: the case where the check
weighs most), and the read of a folder item by ``import``, which hashes the bytes it parses
(SHA-256, the key's hash), against ``load_npy``.  Timings interleave the variants, best of
``--repeats``, wall and CPU time of this process (CPU time is what a loaded machine distorts
least).  Usage:

    python benchmarks/bench_checksums.py [--items 200] [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from featpipe import checksums, fileio  # noqa: E402
from featpipe.store import item_files  # noqa: E402

#: (label, shape): a short sequence, a dense SIFT item, a VGG-16 fc6 item
SHAPES = [("(20, 64)", (20, 64)), ("(2000, 128)", (2000, 128)), ("(300, 4096)", (300, 4096))]


@contextlib.contextmanager
def crc(enabled: bool):
    """The same code with the CRC computed, or replaced by a no-op."""
    if enabled:
        yield
        return
    real = zlib.crc32
    zlib.crc32 = lambda data, value=0: 0
    try:
        yield
    finally:
        zlib.crc32 = real


def timed(run) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def interleaved(variants, repeats: int) -> dict:
    """Best wall and CPU time of each ``{label: run}``, run in turn ``repeats`` times."""
    best: dict = {}
    for _ in range(repeats):
        for label, run in variants.items():
            wall, cpu = timed(run)
            old = best.get(label, (wall, cpu))
            best[label] = (min(old[0], wall), min(old[1], cpu))
    return best


def line(what: str, a: str, b: str, times: dict, count: int) -> str:
    (wa, ca), (wb, cb) = times[a], times[b]
    return (f"  {what:28s} {a} {wa / count * 1e6:8.1f} us/item, {b} {wb / count * 1e6:8.1f} "
            f"us/item: ratio {wa / wb:.3f} wall, {ca / cb:.3f} CPU")


def write_items(folder: Path, arrays, how: str) -> None:
    for k, array in enumerate(arrays):
        path = folder / f"{k}.npy"
        if how == "np.save":
            fileio.atomic_write(path, lambda h, a=array: np.save(h, a, allow_pickle=False))
        elif how == "rows":
            rows = item_files.RowFile(fileio.tmp_path(path), array.dtype)
            for start in range(0, len(array), 8):  # 8 frames' rows per append
                rows.append(array[start:start + 8])
            rows.close()
            os.replace(rows.path, path)
        else:
            fileio.atomic_save_npy(path, array)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"zlib {zlib.ZLIB_RUNTIME_VERSION}")
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as root:
        folder = Path(root)
        for label, shape in SHAPES:
            count = max(4, min(args.items, (48 << 20) // (4 * int(np.prod(shape)))))
            arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]
            mb = arrays[0].nbytes / 2**20
            print(f"\n{count} items of {label} float32 ({mb:.3f} MiB each)")
            for how in ("atomic_save_npy", "rows"):
                def write(enabled, how=how, arrays=arrays):
                    with crc(enabled):
                        write_items(folder, arrays, how)

                times = interleaved({"with CRC": lambda w=write: w(True),
                                     "without": lambda w=write: w(False),
                                     "np.save": lambda a=arrays: write_items(folder, a,
                                                                             "np.save")},
                                    args.repeats)
                print(line(f"write {how}", "with CRC", "without", times, count))
                if how == "atomic_save_npy":
                    print(line("write vs. before checksums", "with CRC", "np.save", times,
                               count))
            write_items(folder, arrays, "atomic_save_npy")
            paths = [folder / f"{k}.npy" for k in range(count)]
            sums = [checksums.npy_file_checksum(p) for p in paths]

            def read(enabled, paths=paths, sums=sums):
                for path, expected in zip(paths, sums, strict=True):
                    fileio.load_npy(path, checksum=expected if enabled else None)

            times = interleaved({"checked": lambda r=read: r(True),
                                 "unchecked": lambda r=read: r(False)}, args.repeats)
            print(line("read load_npy (warm cache)", "checked", "unchecked", times, count))

            def import_read(paths=paths):  # what `import` does per folder item now
                for path in paths:
                    data = path.read_bytes()
                    hashlib.sha256(data).hexdigest()
                    fileio.npy_from_bytes(data)

            def import_before(paths=paths):
                for path in paths:
                    fileio.load_npy(path)

            times = interleaved({"hashed": import_read, "load_npy": import_before},
                                args.repeats)
            print(line("import read (SHA-256 on read)", "hashed", "load_npy", times, count))
            data = paths[0].read_bytes()
            started = time.perf_counter()
            for _ in range(20):
                zlib.crc32(data)
            print(f"  CRC-32 alone: {len(data) * 20 / (time.perf_counter() - started) / 1e9:.2f} "
                  "GB/s")


if __name__ == "__main__":
    main()
