"""Streaming extraction: N decoding processes, one model, and each item's frames written or
encoded as they come (a pipeline *file* is :mod:`featpipe.pipeline`).

Where the work runs:

* **dense SIFT, dense trajectories**: each decoding worker
  (:class:`~featpipe.io.video.DecodePool`) runs the whole chain on its item
  (:class:`LocalFeatureProgram`; trajectories keep one tracker per item): decode (a thread),
  the features,
  then, on a second thread, PCA and the item's output (rows appended to disk, an encoder's
  stream, or a sample); only a small result travels back.  ``--jobs N`` = N workers.
* **a network** (VGG-16, torchvision's models): the workers decode, resize and crop
  (:class:`CropProgram`); the parent packs crops of all items into batches (pinned host
  memory when CUDA is present) and runs the model on a thread of its own (its own CUDA
  stream) while the next batch is packed (:class:`ModelThread`); every frame's features then
  go to its item's output.  A clip model's batches hold clips instead: each item's last T
  crops are kept, and every S-th frame completes a clip (:class:`Network`).  ``--jobs N`` =
  N decoding workers sharing one model; on the CPU the model gets the cores they leave
  (:func:`~featpipe.extract.cpu_inference.model_threads`: ``cores - min(N, cores // 8)``).

Where an item's frames go (:class:`FrameSinks`, one :class:`FrameSink` per item) is one of:
the features themselves, stored row by row (:class:`~featpipe.store.item_files.ItemFiles`); their
encoding by a local-feature encoder of ``featpipe encode`` fed frame by frame
(``encoder.stream``), so raw descriptors never reach the disk; or a seeded sample of at most
N rows for fitting PCA and GMMs.  Memory per item is a few frames, whatever the video's
length.  Items are committed (files renamed into place, then the ledger line) in the parent
as each finishes.
"""

from __future__ import annotations

import glob
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError, ItemError, WriteError, describe_error
from featpipe.fileio import HOST, id_digest, safe_stem
from featpipe.interrupts import critical
from featpipe.io.video import SendFrames
from featpipe.items import Frame
from featpipe.manifest import missing_file, row_fix
from featpipe.store import Stage
from featpipe.store.content import file_changed_since_key
from featpipe.store.item_files import ItemFiles, PendingItem

#: frames queued between dense SIFT and the item's output inside a worker
OUTPUT_DEPTH = 2


# -- what happens to each frame's features ---------------------------------------------------

@dataclass
class FrameSinks:
    """Where every item's frames go; ``open(item_id)`` gives one item's :class:`FrameSink`
    (picklable; built where it runs).

    ``kind``: ``"store"`` (features as rows; ``local`` features also get ``frame_index``,
    ``positions`` when ``positions`` is set, ``timestamps`` and ``image_size`` sidecars;
    per-frame vectors get ``timestamps``), ``"encode"`` (``method`` with ``params``, model
    stages at ``model_paths``), ``"sample"`` (at most ``sample`` rows per item, seeded by
    ``seed`` and the item id).  ``pca_path`` projects the features first.
    """

    stage_path: str
    kind: str = "store"
    local: bool = True
    positions: bool = True
    pca_path: str | None = None
    method: str | None = None
    params: Mapping = field(default_factory=dict)
    model_paths: Mapping[str, str] = field(default_factory=dict)
    sample: int = 0
    seed: int = 0
    #: steps run on each item's output (:mod:`featpipe.chain`); ``keep``: the output itself
    #: is written too; ``partial``: item id -> what to write of an item that has some of it
    #: already (step indexes, -1 for the output itself; an item not listed needs all)
    chain: tuple = ()
    keep: bool = True
    partial: Mapping[str, frozenset] = field(default_factory=dict)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def _built(self):
        if not hasattr(self, "_stage"):
            self._stage = Stage(self.stage_path)
            self._pca = None
            if self.pca_path is not None:
                from featpipe.extract.pca import load_pca

                self._pca = load_pca(Stage(self.pca_path))
            self._encoder = None
            if self.kind == "encode":
                from featpipe.encode.registry import load_methods

                models = {k: Stage.at(p) for k, p in self.model_paths.items()}
                self._encoder = load_methods()[self.method].build(dict(self.params), models)
            self._chain = None
            if self.chain:
                from featpipe.chain import ChainRunner

                self._chain = ChainRunner(self.chain)
        return self._stage, self._pca, self._encoder

    def wanted(self, item_id: str) -> frozenset:
        """What to write of ``item_id``: kept chain steps by index, -1 for the output itself."""
        every = frozenset([-1] * self.keep + [i for i, s in enumerate(self.chain) if s.keep])
        return self.partial.get(item_id, every)

    def open(self, item_id: str) -> FrameSink:
        """The output of one item."""
        stage, pca, encoder = self._built()
        if self.kind == "sample":
            return SampledRows(stage, item_id, pca, self.sample, self.seed)
        files = None
        if self._chain is not None:
            from featpipe.chain import BufferedRows, spill_bytes

            wanted = self.wanted(item_id)
            files = BufferedRows(stage, item_id, 0 if -1 in wanted else spill_bytes())
        if self.kind == "encode":
            sink = EncodedFrames(stage, item_id, pca, encoder, files)
        else:
            sink = StoredFrames(stage, item_id, pca, self.local, self.positions, files)
        return sink if files is None else ChainedFrames(sink, self._chain, wanted)


class FrameSink:
    """One item's frames on their way out: ``add`` each frame, then ``finish`` gives the
    item to commit.  (A computed item handed to the store is
    :class:`featpipe.parallel.ItemOutput`.)"""

    def __init__(self, stage: Stage, item_id: str, pca, files=None):
        self.stage = stage
        self.item_id = item_id
        self.pca = pca
        self.files = ItemFiles(stage, item_id) if files is None else files

    def _projected(self, frame: Frame) -> Frame:
        if self.pca is None:
            return frame
        return Frame(self.pca.transform(frame.descriptors), frame.index, frame.seconds,
                     frame.positions, frame.image_size)

    def add(self, frame: Frame) -> None:
        raise NotImplementedError

    def finish(self) -> PendingItem:
        return self.files.close()

    def abort(self) -> None:
        self.files.abort()


class StoredFrames(FrameSink):
    """The features themselves, appended to the item's files as each frame comes."""

    def __init__(self, stage, item_id, pca, local: bool, positions: bool, files=None):
        super().__init__(stage, item_id, pca, files)
        self.local = local
        self.keep_positions = positions
        self.timestamps: list[float] = []
        self.image_size = None

    def add(self, frame: Frame) -> None:
        frame = self._projected(frame)
        rows = frame.descriptors
        sidecars = {}
        if self.local:
            sidecars["frame_index"] = np.full(len(rows), frame.index, np.int32)
            if self.keep_positions and frame.positions is not None:
                sidecars["positions"] = np.asarray(frame.positions, np.float32)
        self.files.append(rows, **sidecars)
        self.timestamps.append(frame.seconds)
        self.image_size = frame.image_size

    def finish(self) -> PendingItem:
        sidecars = {"timestamps": np.asarray(self.timestamps, dtype=np.float64)}
        if self.local and self.image_size is not None:
            sidecars["image_size"] = np.asarray(self.image_size, dtype=np.int64)
        self.files.set(**sidecars)
        return self.files.close()


class EncodedFrames(FrameSink):
    """The features fed to a local-feature encoder's stream; only its output is written."""

    def __init__(self, stage, item_id, pca, encoder, files=None):
        super().__init__(stage, item_id, pca, files)
        self.stream = encoder.stream(self.files)

    def add(self, frame: Frame) -> None:
        self.stream.add(self._projected(frame))

    def finish(self) -> PendingItem:
        self.stream.finish()
        return self.files.close()


class ChainedFrames(FrameSink):
    """An item's output (``inner``, writing to a :class:`~featpipe.chain.BufferedRows`) fed,
    once complete, to the steps of a chain (:class:`~featpipe.chain.ChainRunner`): what is
    committed is the output itself when ``wanted`` holds -1 and each wanted step's result;
    spilled rows that are not kept are removed."""

    def __init__(self, inner: FrameSink, runner, wanted: frozenset):
        self.inner = inner
        self.item_id = inner.item_id
        self.runner = runner
        self.wanted = wanted

    def add(self, frame: Frame) -> None:
        self.inner.add(frame)

    def finish(self):
        from featpipe.backend import SPILL_FOLDER
        from featpipe.chain import ChainedPending

        files, array, extras = self.inner.finish()
        # what the steps spill (a long video's rank-pooling vectors) stays in the store
        token = SPILL_FOLDER.set(str(self.inner.stage.path))
        try:
            steps = self.runner.run(self.item_id, array, extras, set(self.wanted) - {-1})
        except BaseException:
            if files is not None:
                files.discard()
            raise
        finally:
            SPILL_FOLDER.reset(token)
        del array, extras  # a memory map of a spilled file
        if -1 in self.wanted:
            return ChainedPending(self.item_id, files, steps)
        if files is not None:
            files.discard()
        return ChainedPending(self.item_id, None, steps)

    def abort(self) -> None:
        self.inner.abort()


class SampledRows(FrameSink):
    """At most ``n`` rows drawn uniformly without replacement from all of the item's rows,
    frame by frame: every row gets a uniform key from a generator seeded by (seed, item id),
    and the rows of the ``n`` smallest keys are kept (a reservoir sample), in their order."""

    def __init__(self, stage, item_id, pca, n: int, seed: int):
        super().__init__(stage, item_id, pca)
        self.n = int(n)
        self.rng = np.random.default_rng([int(seed), int(id_digest(item_id)[:15], 16)])
        self.keys = np.zeros(0)
        self.order = np.zeros(0, np.int64)
        self.rows: np.ndarray | None = None
        self.seen = 0

    def add(self, frame: Frame) -> None:
        rows = self._projected(frame).descriptors
        keys = self.rng.random(len(rows))
        order = self.seen + np.arange(len(rows))
        self.seen += len(rows)
        pool = rows if self.rows is None else np.concatenate([self.rows, rows])
        keys, order = np.concatenate([self.keys, keys]), np.concatenate([self.order, order])
        if len(keys) > self.n:
            keep = np.sort(np.argpartition(keys, self.n - 1)[:self.n])
            pool, keys, order = pool[keep], keys[keep], order[keep]
        self.rows, self.keys, self.order = pool, keys, order

    def finish(self) -> PendingItem:
        if self.rows is None:
            raise ItemError(self.item_id, "no frames were produced")
        self.files.write(self.rows)
        return self.files.close()


def remove_partial_files(stage: Stage, item_id: str, pid: int | None) -> None:
    """Remove what process ``pid`` left of ``item_id`` (temporary files of an item it was
    writing when it died or was killed)."""
    if pid is None:
        return
    folder = stage.item_path(item_id).parent
    for path in glob.glob(glob.escape(str(folder / safe_stem(item_id))) + "*.tmp."
                          + glob.escape(f"{HOST}.{pid}")):
        Path(path).unlink(missing_ok=True)


# -- the worker programs ---------------------------------------------------------------------

class _Background:
    """Runs ``func(value)`` for each ``put`` value on a thread, ``depth`` values ahead; the
    first exception is raised by the next ``put`` or by ``close``."""

    def __init__(self, func: Callable, depth: int = OUTPUT_DEPTH):
        self.func = func
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="featpipe-output", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            value = self.queue.get()
            if value is None:
                return
            if self.error is None:
                try:
                    self.func(value)
                except BaseException as err:  # noqa: BLE001 - raised in the caller
                    self.error = err

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, value) -> None:
        self._raise()
        self.queue.put(value)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self._raise()


class LocalFeatureProgram:
    """A local feature method computed in the decoding worker (``method.runs == "worker"``,
    :mod:`featpipe.extract.features`): each frame's descriptors (with positions and the
    frame's size) go to the item's :class:`FrameSinks` on a second thread.

    A stateless method computes each frame alone (``estimator.compute(frame)``); a stateful
    one (dense trajectories) has no ``compute`` but ``start(height, width)``, which gives one
    tracker per item, made at its first frame and remade by a restart (a second decoding
    pass), and ``tracker.add(frame)`` gives what ends at that frame.  ``boxes`` is a folder of human
    boxes per item (:mod:`featpipe.extract.boxes`; the tracker then gets ``boxes=``, the
    frame's (B, 4) boxes or None), ``frame_step`` the sampling's ``every`` (video frame =
    sampled frame x step)."""

    def __init__(self, method, record: Mapping, outputs: FrameSinks, boxes: str | None = None,
                 frame_step: int = 1):
        self.method = method
        self.record = dict(record)
        self.outputs = outputs
        self.boxes = boxes
        self.frame_step = frame_step
        self._estimator = None

    def __getstate__(self):
        return {**self.__dict__, "_estimator": None}

    def start(self, item_id: str) -> _LocalFeatureJob:
        if self._estimator is None:
            self._estimator = self.method.build(self.record)
        return _LocalFeatureJob(self, item_id)


class _LocalFeatureJob:
    def __init__(self, program: LocalFeatureProgram, item_id: str):
        self.program = program
        self.item_id = item_id
        self.boxes = None
        if program.boxes is not None:
            from featpipe.extract.boxes import FrameBoxes, boxes_path

            self.boxes = FrameBoxes(boxes_path(program.boxes, item_id), program.frame_step)
        self._open()

    def _open(self) -> None:
        self.output = self.program.outputs.open(self.item_id)
        self.worker = _Background(self.output.add)
        self.frames = 0
        self.rows = 0
        self.tracker = None
        self.checked_shape = None  # a frame size that holds a descriptor

    def _compute(self, frame: np.ndarray):
        """The frame's features: alone, or through the item's tracker."""
        estimator = self.program._estimator
        if hasattr(estimator, "compute"):  # stateless (a parameter may be called `start`)
            return estimator.compute(frame)
        if self.tracker is None:
            self.tracker = estimator.start(*frame.shape[:2])
        if self.boxes is None:
            return self.tracker.add(frame)
        return self.tracker.add(frame, boxes=self.boxes.of(self.frames))

    def add(self, frame: np.ndarray, seconds: float):
        estimator, label = self.program._estimator, self.program.method.label
        if frame.shape[:2] != self.checked_shape and estimator.count(*frame.shape[:2]) == 0:
            minimum = getattr(estimator, "minimum_size", None)
            raise RuntimeError(
                f"frame {self.frames} is {frame.shape[1]}x{frame.shape[0]} pixels, smaller than "
                f"one {label} descriptor" + (f" ({minimum()})" if minimum else "")
                + ": no descriptors")
        self.checked_shape = frame.shape[:2]
        try:
            result = self._compute(frame)
        except Exception as err:
            raise RuntimeError(f"{label} failed on frame {self.frames}: {err}") from None
        self.worker.put(Frame(result.descriptors, self.frames, seconds, result.positions,
                              tuple(frame.shape[:2])))
        self.frames += 1
        self.rows += len(result.descriptors)

    @property
    def warning(self) -> str | None:
        """An item with frames but not one row (a still or uniform video; for trajectories
        also motion too slow to survive the static pruning) is stored, and said."""
        if self.frames == 0 or self.rows:
            return None
        return (f"no {self.program.method.label} in its {self.frames} frames: it is stored "
                "empty and encodes to zeros")

    def restart(self) -> None:
        self.abort()
        self._open()

    def finish(self) -> PendingItem:
        if self.boxes is not None:
            self.boxes.check(self.frames)
        self.worker.close()
        return self.output.finish()

    def abort(self) -> None:
        try:
            self.worker.close()
        except BaseException:  # noqa: BLE001 - the item is abandoned anyway
            pass
        self.output.abort()


class CropProgram(SendFrames):
    """A network's preprocessing in the decoding worker: (crop, original (height, width))."""

    def __init__(self, preprocess):
        self.preprocess = preprocess

    def start(self, item_id: str) -> CropProgram:
        import torch

        torch.set_num_threads(1)  # one core per decoding worker; the model wants the rest
        return self

    def add(self, frame: np.ndarray, seconds: float):
        return self.preprocess(frame), frame.shape[:2]


# -- the model in the parent -----------------------------------------------------------------

class ModelThread:
    """The model on a thread of its own: ``submit`` a batch of crops (a host buffer of
    (B, *shape) uint8: (B, H, W, 3) crops or (B, T, H, W, 3) clips, pinned when CUDA is
    present) and collect ``(features, tag)`` with
    ``results``; at most one batch waits while one computes, so the caller packs the next
    batch meanwhile, and ``wake`` (a pipe) becomes readable when a batch is done;
    ``last_seconds`` is the last batch's duration.
    ``model.forward_crops(uint8 tensor) -> numpy`` runs on one CUDA stream (when on CUDA),
    with ``threads`` torch threads on this thread when given (the CPU's:
    :func:`featpipe.extract.cpu_inference.model_threads`); a failure of the model ends the
    run (it is no item's fault)."""

    def __init__(self, model, batch_size: int, shape: tuple[int, ...], device: str = "cpu",
                 buffers: int = 3, threads: int | None = None):
        import torch

        self.model = model
        self.threads = threads
        pin = device == "cuda" and torch.cuda.is_available()
        self.free: queue.Queue = queue.Queue()
        for _ in range(buffers):
            self.free.put(torch.empty((batch_size, *shape), dtype=torch.uint8,
                                      pin_memory=pin))
        self.todo: queue.Queue = queue.Queue(maxsize=1)
        self.done: queue.Queue = queue.Queue()
        self.busy = 0
        #: seconds the last batch took; when the model last became idle
        self.last_seconds = 0.0
        self.idle_since = 0.0
        self.wake, self._signal = os.pipe()
        os.set_blocking(self.wake, False)
        self.stream = torch.cuda.Stream() if pin else None
        self.thread = threading.Thread(target=self._run, name="featpipe-model", daemon=True)
        self.thread.start()

    def buffer(self):
        """A free host buffer to pack a batch into (waits for one)."""
        return self.free.get()

    def submit(self, buffer, n: int, tag) -> None:
        self.busy += 1
        self.todo.put((buffer, n, tag))

    def _run(self) -> None:
        import contextlib

        import torch

        context = torch.cuda.stream(self.stream) if self.stream is not None \
            else contextlib.nullcontext()
        previous = torch.get_num_threads()  # the process's default, restored at the end
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        with context:
            while True:
                job = self.todo.get()
                if job is None:
                    torch.set_num_threads(previous)
                    return
                buffer, n, tag = job
                started = time.monotonic()
                try:
                    out = (self.model.forward_crops(buffer[:n]), tag)
                except BaseException as err:  # noqa: BLE001 - raised in the caller
                    out = (err, tag)
                self.last_seconds = time.monotonic() - started
                self.free.put(buffer)
                self.done.put(out)
                os.write(self._signal, b"x")

    def results(self) -> list:
        """The batches computed so far: (features, tag) each."""
        try:
            os.read(self.wake, 1 << 16)
        except BlockingIOError:
            pass
        found = []
        try:
            while True:
                found.append(self.done.get_nowait())
        except queue.Empty:
            pass
        self.busy -= len(found)
        if found and not self.busy:
            self.idle_since = time.monotonic()
        for out, _ in found:
            if isinstance(out, BaseException):
                raise FeatpipeError(f"the model failed: {type(out).__name__}: {out}")
        return found

    def close(self) -> None:
        self.todo.put(None)
        self.thread.join()
        os.close(self.wake)
        os.close(self._signal)


# -- the coordinator -------------------------------------------------------------------------

@dataclass
class _Item:
    """An item in flight in the parent: its output (a network's), its rows (frames or clips)
    sent to the model and those in the model, and a clip model's last crops (``window``,
    ``seen`` frames so far)."""

    output: FrameSink | None
    started: float
    generation: int = 0
    frames: int = 0
    pending: int = 0
    decoded: bool = False
    warning: str | None = None
    window: list = field(default_factory=list)
    seen: int = 0


@dataclass(frozen=True)
class Network:
    """A network in the parent process: ``model.forward_crops(uint8 crops)`` gives one row
    (a per-frame vector) or a map of local features (at ``preprocess.positions(frame
    shape)``) per crop, of the crops the workers' ``preprocess`` makes (``preprocess.shape``:
    height, width), ``batch_size`` crops per forward pass.  A clip model (``clip`` = T) takes
    (T, H, W, 3) clips instead: T consecutive sampled frames, one clip every ``clip_stride``
    frames from the first, ``batch_size`` clips per pass; an item of fewer than T frames
    gives one clip, its last frame repeated."""

    model: object
    preprocess: object
    batch_size: int
    clip: int | None = None
    clip_stride: int | None = None


class Extraction:
    """Runs items through a :class:`~featpipe.io.video.DecodePool` (and for VGG-16 one
    :class:`Network`); commits each item as it finishes.

    ``run(items)`` yields ``(id, error or None)`` per item as it is done or failed (failures
    recorded in the ledger unless ``record_failures`` is off); ``on_item_frames(id, n)``
    counts frames done of an item (computed in the workers, or out of the model and in their
    item's output; never frames only decoded ahead; by default ``on_frames(n)``, the count
    alone), ``on_warning(id, text)`` reports items accepted with lost frames (set them as
    attributes, with ``manifest``: the rows of the items, so that one whose file is missing
    names its row).  ``allow_partial`` keeps damaged videos' decodable frames.
    Closing the generator early (an interrupt, a failure with ``--on-error fail``) kills the
    workers and removes the unfinished items' files: nothing half-written stays.  A store that
    cannot be written (disk full) raises :class:`~featpipe.errors.WriteError` from ``run``
    the same way: it is no item's fault, so no item is recorded as failed for it.
    """

    def __init__(self, stage: Stage, pool, sampling, outputs: FrameSinks | None = None, *,
                 network: Network | None = None, allow_partial: bool = False,
                 record_failures: bool = True):
        self.stage = stage
        self.pool = pool
        self.sampling = sampling
        self.outputs = outputs
        self.network = network
        self.allow_partial = allow_partial
        self.record_failures = record_failures
        #: the other stages this pass writes (chained steps), where a failure is recorded too
        self.also_failed: list[Stage] = []
        #: the manifest the items come from: an item whose file is missing names its row
        self.manifest = None
        self.on_frames: Callable[[int], None] = lambda n: None
        self.on_item_frames: Callable[[str, int], None] = lambda item_id, n: self.on_frames(n)
        self.on_warning: Callable[[str, str], None] = lambda item_id, text: None
        self.items: dict[str, _Item] = {}
        self.paths: dict[str, str] = {}

    def run(self, items: Sequence[tuple[str, str]]) -> Iterator[tuple[str, str | None]]:
        self.paths = dict(items)
        self.pool.submit(items, self.sampling, self.allow_partial)
        finished = False
        try:
            if self.network is None:
                yield from self._run_workers()
            else:
                yield from self._run_model()
            finished = True
        finally:
            if finished:
                self.pool.close()
            else:
                self._abandon()

    def _commit(self, item_id: str, pending: PendingItem, warning: str | None):
        changed = file_changed_since_key(self.stage.path, item_id, self.paths[item_id])
        if changed:  # decoded from other bytes than the key's: never stored under it
            pending.discard()
            return self._fail(item_id, changed)
        item = self.items.pop(item_id)
        try:
            with critical():  # an interrupt waits until the item is in place
                pending.commit(self.stage, seconds=time.perf_counter() - item.started)
        except WriteError:  # the store cannot be written: no item's fault, the run stops
            pending.discard()
            raise
        except Exception as err:
            pending.discard()
            return self._fail(item_id, describe_error(err))
        if warning:
            self.on_warning(item_id, warning)
        return item_id, None

    def _fail(self, item_id: str, error: str, pid: int | None = None):
        missing = missing_file(self.paths[item_id]) if item_id in self.paths else None
        if missing is not None:  # the manifest row is what to fix, not the decoder
            error = f"{missing}; {row_fix(self.manifest, item_id)}"
        item = self.items.pop(item_id, None)
        if item is not None and item.output is not None:
            item.output.abort()
        remove_partial_files(self.stage, item_id, pid)
        if self.record_failures:
            with critical():
                for stage in [self.stage, *self.also_failed]:
                    stage.record(item_id, "failed", error=error)
        return item_id, error

    def _store_error(self, event: tuple) -> None:
        """A worker could not write to the store (disk full): the run stops, no item is
        recorded as failed for it (:meth:`_abandon` then removes what is unfinished)."""
        _, item_id, error, pid = event
        remove_partial_files(self.stage, item_id, pid)
        raise error

    def _abandon(self) -> None:
        """Kill the workers; remove every unfinished item's temporary files."""
        in_flight = self.pool.in_flight()
        self.pool.kill()
        for item_id, pid in in_flight.items():
            remove_partial_files(self.stage, item_id, pid)
        for item in self.items.values():
            if item.output is not None:
                item.output.abort()
        self.items.clear()

    def _item(self, item_id: str) -> _Item:
        if item_id not in self.items:
            output = self.outputs.open(item_id) if self.network is not None else None
            self.items[item_id] = _Item(output, time.perf_counter())
        return self.items[item_id]

    def _run_workers(self):
        """Dense SIFT: the workers do everything; commit what they finish."""
        while self.pool.busy:
            for event in self.pool.poll(None):
                kind, item_id = event[0], event[1]
                if kind == "frames":
                    self._item(item_id)
                    self.on_item_frames(item_id, len(event[3]))
                elif kind == "end":
                    self._item(item_id)
                    yield self._commit(item_id, event[2], event[3])
                elif kind == "error":
                    yield self._fail(item_id, event[2].cause, event[3])
                elif kind == "store-error":
                    self._store_error(event)

    def _inputs(self, item: _Item, crop: np.ndarray, seconds: float, frame_shape) -> list:
        """What one decoded crop completes: itself (a frame model), or for a clip model the
        clip that ends at this frame, if one does: [(crops, seconds of the first, frame
        shape)]."""
        clip, stride = self.network.clip, self.network.clip_stride or self.network.clip
        if clip is None:
            return [([crop], seconds, frame_shape)]
        item.window = [*item.window[max(0, len(item.window) + 1 - clip):],
                       (crop, seconds, frame_shape)]
        item.seen += 1
        if item.seen < clip or (item.seen - clip) % stride:
            return []
        return [([c for c, _, _ in item.window], item.window[0][1], frame_shape)]

    def _short_clip(self, item: _Item) -> list:
        """At an item's end: one clip of its frames, the last repeated, when it has frames
        but fewer than one clip's (said in the item's warning)."""
        clip = self.network.clip
        if clip is None or item.frames or not item.window:
            return []
        crops = [c for c, _, _ in item.window]
        note = (f"{len(crops)} sampled frames, fewer than one clip of {clip}: its last frame "
                "is repeated")
        item.warning = f"{item.warning}; {note}" if item.warning else note
        return [(crops + [crops[-1]] * (clip - len(crops)), item.window[0][1],
                 item.window[-1][2])]

    def _run_model(self):
        """A network: pack crops (or clips) across items into batches; the model thread
        computes one batch while the next is packed; rows go to their item's output in
        order."""
        from featpipe.extract.cpu_inference import model_threads

        network = self.network
        preprocess, batch_size = network.preprocess, network.batch_size
        shape = (*preprocess.shape, 3) if network.clip is None \
            else (network.clip, *preprocess.shape, 3)
        device = getattr(network.model, "device", "cpu")
        model = ModelThread(network.model, batch_size, shape, device, threads=model_threads(
            len(self.pool.workers)) if device == "cpu" else None)
        buffer, tags, packed_since = None, [], 0.0

        def pack(item_id: str, item: _Item, inputs: list) -> None:
            nonlocal buffer, tags, packed_since
            for crops, seconds, frame_shape in inputs:
                if buffer is None:
                    buffer, packed_since = model.buffer(), time.monotonic()
                slot = buffer[len(tags)].numpy()
                if network.clip is None:
                    slot[...] = crops[0]
                else:
                    for t, crop in enumerate(crops):
                        slot[t] = crop
                tags.append((item_id, item.generation, item.frames, seconds,
                             tuple(frame_shape)))
                item.frames += 1
                item.pending += 1
                if len(tags) == batch_size:
                    model.submit(buffer, len(tags), tags)
                    buffer, tags = None, []

        try:
            while self.pool.busy or tags or model.busy:
                # A partial batch goes to an idle model once it has waited as long as the
                # last batch took (the model would have been idle that long anyway), or at
                # the end; until then, wait for a worker, the model, or that moment.
                due = None
                if tags and model.busy == 0:
                    since = max(packed_since, model.idle_since)
                    due = 0.0 if not self.pool.busy else max(
                        0.0, since + model.last_seconds - time.monotonic())
                events = self.pool.poll(due, wake=[model.wake])
                for event in events:
                    kind, item_id = event[0], event[1]
                    if kind == "error":
                        yield self._fail(item_id, event[2].cause, event[3])
                        continue
                    if kind == "store-error":
                        self._store_error(event)
                    item = self._item(item_id)
                    if kind == "restart":  # the frames so far are void
                        item.output.abort()
                        item.output = self.outputs.open(item_id)
                        item.generation += 1
                        item.frames, item.window, item.seen = 0, [], 0
                    elif kind == "end":
                        item.decoded, item.warning = True, event[3]
                        pack(item_id, item, self._short_clip(item))
                        item.window = []
                    else:
                        for (crop, frame_shape), seconds in zip(event[2], event[3],
                                                                strict=True):
                            pack(item_id, item, self._inputs(item, crop, seconds,
                                                             frame_shape))
                if tags and model.busy == 0 and (not self.pool.busy or time.monotonic() >= max(
                        packed_since, model.idle_since) + model.last_seconds):
                    model.submit(buffer, len(tags), tags)
                    buffer, tags = None, []
                for features, batch_tags in model.results():
                    added: dict[str, int] = {}
                    for row, (item_id, generation, index, seconds, frame_shape) in zip(
                            features, batch_tags, strict=True):
                        item = self.items.get(item_id)
                        if item is None:
                            continue  # failed meanwhile
                        item.pending -= 1
                        if item.generation != generation:
                            continue  # restarted meanwhile: a frame of the void pass
                        if not self.outputs.local:  # one vector per frame or clip
                            frame = Frame(row[None], index, seconds)
                        else:
                            frame = Frame(row, index, seconds,
                                          preprocess.positions(frame_shape), frame_shape)
                        try:
                            item.output.add(frame)
                            added[item_id] = added.get(item_id, 0) + (  # a clip: its stride
                                network.clip_stride or network.clip or 1)
                        except WriteError:
                            raise
                        except Exception as err:
                            yield self._fail(item_id, describe_error(err))
                    for item_id, n in added.items():  # done: out of the model, in their output
                        self.on_item_frames(item_id, n)
                for item_id in [i for i, it in self.items.items()
                                if it.decoded and it.pending == 0]:
                    item = self.items[item_id]
                    try:
                        pending = item.output.finish()
                    except WriteError:
                        raise
                    except Exception as err:
                        yield self._fail(item_id, describe_error(err))
                        continue
                    item.output = None
                    yield self._commit(item_id, pending, item.warning)
        finally:
            model.close()
