"""Items of local features: one record for what extraction writes and local encoders read.

A stored item of local features (``featpipe extract --features dsift|vgg16-conv5_3``):

==============  ===========  ============================================================
array           (N, D)       the descriptors of all sampled frames, frame after frame
``frame_index`` (N,) int32   the sampled frame each row belongs to (0-based)
``timestamps``  (T,) float64 seconds of each sampled frame (the frame's own time)
``positions``   (N, 3) f32   x, y (frame pixels) and scale of each row (optional)
``image_size``  (2,) int64   frame height and width in pixels (optional)
==============  ===========  ============================================================

:meth:`LocalFeatures.from_item` also reads the layouts other stages hold: (N, D) without
``frame_index`` (one image), (H, W, D) (one conv map) and (T, H, W, D) (a conv map per frame).
:meth:`LocalFeatures.frames` gives the item frame by frame as :class:`Frame` records, the unit
extraction hands to an encoder while a video decodes (``encoder.stream(sink)``, see
:class:`FrameStream`), so the two-stage path (extract, then encode) and the streaming path
(``extract --encode``) feed encoders the same records.  They are written to the store row by
row as they come (:class:`featpipe.store.item_files.ItemFiles`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from featpipe.errors import InputError

# -- the record -------------------------------------------------------------------------------

@dataclass
class Frame:
    """The local features of one sampled frame: ``descriptors`` (n, D), the frame's number
    ``index`` among the item's sampled frames, its time ``seconds`` (None when unknown),
    ``positions`` (n, >=2: x, y[, scale]) and ``image_size`` (height, width) when known."""

    descriptors: np.ndarray
    index: int
    seconds: float | None = None
    positions: np.ndarray | None = None
    image_size: tuple[int, int] | None = None


@dataclass
class LocalFeatures:
    """One item of local features and its sidecars (module docstring).

    ``frame_index`` is None for an item without frames (one image); ``timestamps`` holds one
    time per frame.
    """

    descriptors: np.ndarray
    frame_index: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    positions: np.ndarray | None = None
    image_size: tuple[int, int] | None = None

    @classmethod
    def from_item(cls, array, extras: Mapping[str, np.ndarray] | None = None,
                  stacked: str = "image") -> LocalFeatures:
        """The record of a stored item; ``stacked`` says what a 3-D array is: ``'image'``
        (H, W, D) one conv map, or ``'frames'`` (F, n, D) n descriptors per frame."""
        extras = extras or {}
        array = np.asarray(array)
        if array.dtype.kind not in "fiu":
            raise InputError(f"local features must be numeric, got dtype {array.dtype}")
        size = extras.get("image_size")
        size = None if size is None else (int(np.ravel(size)[0]), int(np.ravel(size)[1]))
        stamps = extras.get("timestamps")
        stamps = None if stamps is None else np.asarray(stamps, dtype=np.float64).reshape(-1)
        positions = extras.get("positions")
        if array.ndim == 2:
            frame = extras.get("frame_index")
            if frame is None:
                return cls(array, None, stamps, positions, size)
            frame = np.asarray(frame).reshape(-1).astype(np.int64)
            if frame.shape[0] != array.shape[0]:
                raise InputError(f"'frame' sidecar has {frame.shape[0]} entries for "
                                 f"{array.shape[0]} local features")
            if frame.size and frame.min() < 0:
                raise InputError("'frame_index' sidecar holds negative frame numbers")
            count = int(frame.max(initial=-1)) + 1
            if stamps is not None and stamps.shape[0] == array.shape[0] != count:
                stamps = stamps[[int(np.argmax(frame == f)) for f in range(count)]]  # per row
            elif stamps is not None and stamps.shape[0] < count:
                raise InputError(f"'frame_index' {count - 1} beyond the {stamps.shape[0]} "
                                 "timestamps")
            return cls(array, frame, stamps, positions, size)
        if array.ndim == 3 and stacked == "image":
            return cls(array.reshape(-1, array.shape[-1]), None, stamps, positions, size)
        if array.ndim in (3, 4):
            per_frame = array.reshape(array.shape[0], -1, array.shape[-1])
            frame = np.repeat(np.arange(per_frame.shape[0]), per_frame.shape[1])
            return cls(per_frame.reshape(-1, array.shape[-1]), frame, stamps, positions, size)
        raise InputError(f"expected local features (N, D), a conv map (H, W, D) or per-frame "
                         f"maps (T, H, W, D), got shape {array.shape}")

    @property
    def n_frames(self) -> int:
        """Sampled frames: one per timestamp (frames without descriptors included)."""
        if self.frame_index is None:
            return 1
        count = int(self.frame_index.max(initial=-1)) + 1
        return max(count, 0 if self.timestamps is None else len(self.timestamps))

    def frames(self) -> Iterator[Frame]:
        """The item frame by frame, in order; a frame without descriptors has n = 0."""
        if self.frame_index is None:
            seconds = None if self.timestamps is None or not len(self.timestamps) \
                else float(self.timestamps[0])
            yield Frame(self.descriptors, 0, seconds, self.positions, self.image_size)
            return
        order = np.argsort(self.frame_index, kind="stable")
        bounds = np.searchsorted(self.frame_index[order], np.arange(self.n_frames + 1))
        for index in range(self.n_frames):
            rows = order[bounds[index]:bounds[index + 1]]
            contiguous = rows.size == 0 or rows[-1] - rows[0] + 1 == rows.size
            take = slice(rows[0], rows[-1] + 1) if rows.size and contiguous else rows
            yield Frame(self.descriptors[take], index,
                        None if self.timestamps is None else float(self.timestamps[index]),
                        None if self.positions is None else np.asarray(self.positions)[take],
                        self.image_size)


def frame_sidecars(frames: Sequence[Frame]) -> dict[str, np.ndarray]:
    """Per-row sidecars of a sequence with one row per frame: ``frame_index`` and (when every
    frame has one) ``timestamps``."""
    sidecars = {"frame_index": np.asarray([f.index for f in frames], dtype=np.int64)}
    if frames and all(f.seconds is not None for f in frames):
        sidecars["timestamps"] = np.asarray([f.seconds for f in frames], dtype=np.float64)
    return sidecars


def frame_rows(frames: Sequence[Frame]) -> tuple[np.ndarray, np.ndarray]:
    """The descriptors of ``frames`` (at least one) in one (N, D) array, and where each
    frame's rows start (F + 1 offsets)."""
    counts = [np.shape(f.descriptors)[0] for f in frames]
    x = np.asarray(frames[0].descriptors) if len(frames) == 1 else \
        np.concatenate([np.asarray(f.descriptors) for f in frames])
    return x, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


# -- encoders that take frames as they come ---------------------------------------------------

class ItemSink(Protocol):
    """Where an encoder puts an item's output: rows as they come, or one array at the end."""

    def append(self, rows: np.ndarray, **row_sidecars: np.ndarray) -> None: ...

    def write(self, array: np.ndarray, **sidecars: np.ndarray) -> None: ...


class FrameStream(Protocol):
    """One item being encoded: ``add`` each frame in order, then ``finish`` writes the output
    to the sink the stream was opened on (``encoder.stream(sink)``)."""

    def add(self, frame: Frame) -> None: ...

    def finish(self) -> None: ...


class PerFrameStream:
    """A stream for encoders that code each frame on its own: frames are buffered ``batch``
    at a time, coded by ``encode(frames) -> (len(frames), d)`` and appended to the sink with
    :func:`frame_sidecars`; with ``skip_empty`` frames without descriptors are left out
    (pooling needs at least one), else they are coded too."""

    def __init__(self, encode, sink: ItemSink, skip_empty: bool = True, batch: int = 8):
        self.encode = encode
        self.sink = sink
        self.skip_empty = skip_empty
        self.batch = max(1, int(batch))
        self.buffer: list[Frame] = []

    def add(self, frame: Frame) -> None:
        if frame.descriptors.shape[0] or not self.skip_empty:
            self.buffer.append(frame)
        if len(self.buffer) >= self.batch:
            self.finish()

    def finish(self) -> None:
        if self.buffer:
            frames, self.buffer = self.buffer, []
            self.sink.append(np.asarray(self.encode(frames)), **frame_sidecars(frames))


def encode_per_frame(encode, arrays, extras) -> list:
    """The two-stage path of a per-frame encoder over a batch of stored items: an item with
    frames becomes (T, d) with :func:`frame_sidecars` (frames without descriptors left out),
    one without becomes one (d,) vector; ``encode(frames)`` codes all frames of the batch at
    once (equal-shaped ones can be stacked)."""
    from featpipe.parallel import ItemOutput

    records = [LocalFeatures.from_item(a, e) for a, e in zip(arrays, extras, strict=True)]
    split = [[f for f in r.frames() if f.descriptors.shape[0]] if r.frame_index is not None
             else [next(r.frames())] for r in records]
    codes = np.asarray(encode([f for frames in split for f in frames]))
    outputs, start = [], 0
    for record, frames in zip(records, split, strict=True):
        block = codes[start:start + len(frames)]
        start += len(frames)
        outputs.append(block[0] if record.frame_index is None
                       else ItemOutput(block, frame_sidecars(frames)))
    return outputs


class MemorySink:
    """An :class:`ItemSink` in memory: the output of the two-stage encode path."""

    def __init__(self):
        self.rows: list[np.ndarray] = []
        self.row_sidecars: dict[str, list[np.ndarray]] = {}
        self.array = None
        self.sidecars: dict[str, np.ndarray] = {}

    def append(self, rows, **row_sidecars):
        self.rows.append(np.asarray(rows))
        for name, values in row_sidecars.items():
            self.row_sidecars.setdefault(name, []).append(np.asarray(values))

    def write(self, array, **sidecars):
        self.array = np.asarray(array)
        self.sidecars.update(sidecars)

    def output(self, dim: int | None = None):
        """The array (whole item) or an ``ItemOutput`` (rows with sidecars); ``dim`` sizes an
        item whose stream appended no rows (0 frames)."""
        from featpipe.parallel import ItemOutput

        if self.array is not None:
            return ItemOutput(self.array, self.sidecars) if self.sidecars else self.array
        rows = (np.concatenate(self.rows) if self.rows
                else np.zeros((0, dim or 0), np.float32))
        sidecars = {k: np.concatenate(v) for k, v in self.row_sidecars.items()}
        return ItemOutput(rows, sidecars)


def stream_item(encoder, record: LocalFeatures, dim: int | None = None):
    """Encode a whole stored item through ``encoder.stream``: the two-stage path."""
    sink = MemorySink()
    stream = encoder.stream(sink)
    for frame in record.frames():
        stream.add(frame)
    stream.finish()
    return sink.output(dim)
