"""The ``extract`` stage: decode each manifest item and store its per-frame or local features.

What one item holds (``stage.read_item`` and its sidecars):

* ``vgg16-fc6``: (T, 4096) for T sampled frames; ``timestamps`` (T,) seconds;
* ``vgg16-conv5_3``: (T·H·W, 512) local features; ``timestamps`` (T,), ``frame_index``
  (rows,) int32, ``positions`` (rows, 3) ``x, y, scale`` in frame pixels;
* ``dsift``: (N, 128) descriptors over all frames; ``timestamps``, ``frame_index`` and (unless
  ``positions=False``) ``positions`` ``x, y, bin size``.

With ``pca=NAME`` the main array is projected by that fitted ``pca`` stage first.  Decoding
runs in a separate process with a time limit and is overlapped with the feature computation
(a producer thread keeps a few chunks of frames ready), and VGG-16 batches frames across items.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence

import numpy as np

from featpipe.errors import FeatpipeError, ItemError, ParameterError
from featpipe.extract.dsift import DenseSIFT, to_grey
from featpipe.io.video import DecodeWorker, FrameChunk, Sampling, prefetch
from featpipe.manifest import Manifest
from featpipe.parallel import ItemOutput, parse_shard, plan
from featpipe.stages.base import Reporter, RunOptions, StageRun, check_name, run_stage
from featpipe.store import Stage, Store

FEATURES = ("vgg16-fc6", "vgg16-conv5_3", "dsift")
#: items per compute call: VGG-16 batches frames across them
ITEMS_PER_CALL = {"vgg16-fc6": 8, "vgg16-conv5_3": 4, "dsift": 4}


def manifest_digest(manifest: Manifest) -> str:
    """sha256 of the manifest rows (id, absolute path, labels, splits), in order."""
    rows = [[it.id, str(manifest.resolve_path(it)), list(it.labels), list(it.splits)]
            for it in manifest]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=True).encode()).hexdigest()[:16]


class ShapeAndCrop:
    """Frame transform for VGG-16 in the decode worker: (crop, original (height, width))."""

    def __init__(self, preprocess):
        self.preprocess = preprocess

    def __call__(self, frame):
        return self.preprocess(frame), frame.shape[:2]


def _closing(chunks):
    with chunks:
        yield from chunks


class _Pipeline:
    """One prefetching decoder over all planned items, consumed a batch of items at a time."""

    def __init__(self, chunks, order: Sequence[str]):
        self.chunks = chunks
        self.expected = list(order)
        self.position = 0

    def upcoming(self, n: int) -> list[str]:
        return self.expected[self.position:self.position + n]

    def take(self, ids: Sequence[str]):
        """Chunks (or ItemErrors) of exactly ``ids``, which must be the upcoming items."""
        for item_id in ids:
            while True:
                chunk = next(self.chunks)
                got = chunk.item if isinstance(chunk, ItemError) else chunk.item_id
                if got != item_id:
                    raise RuntimeError(f"decoding pipeline out of step: expected {item_id!r}, "
                                       f"got {got!r}")
                yield chunk
                if isinstance(chunk, ItemError) or chunk.last:
                    break
            self.position += 1

    def close(self) -> None:
        self.chunks.close()


class ExtractCompute:
    """Picklable compute for the executor: decodes items and computes their features."""

    def __init__(self, features: str, paths: dict[str, str], sampling: Sampling,
                 feature_params: dict, pca_path: str | None, decoder: str,
                 decode_timeout: float, batch_size: int, device: str):
        self.features = features
        self.paths = paths
        self.sampling = sampling
        self.feature_params = feature_params
        self.pca_path = pca_path
        self.decoder = decoder
        self.decode_timeout = decode_timeout
        self.batch_size = batch_size
        self.device = device
        #: the planned order of the items; consecutive calls in this order share one decoding
        #: pipeline, so the next batch of items decodes while the current one computes
        self.order: list[str] | None = None
        #: seconds the feature computation spent waiting for decoded frames (diagnostics)
        self.wait_seconds = 0.0
        self._state = None

    def __getstate__(self):
        return {**self.__dict__, "_state": None}

    def _setup(self):
        if self._state is None:
            state = {"worker": DecodeWorker(self.decoder, self.decode_timeout), "pca": None}
            if self.pca_path is not None:
                from featpipe.extract.pca import load_pca

                state["pca"] = load_pca(Stage(self.pca_path))
            if self.features == "dsift":
                state["sift"] = DenseSIFT(**self.feature_params["dsift"])
            else:
                from featpipe.extract.vgg import VGG16Features, VGGPreprocess

                layer = self.features.split("-", 1)[1]
                state["vgg"] = VGG16Features(layer, self.feature_params["weights"],
                                             self.device, self.batch_size).fit()
                state["preprocess"] = VGGPreprocess(self.feature_params["resize"],
                                                    self.feature_params["crop"])
            self._state = state
        return self._state

    def close(self) -> None:
        if self._state is not None:
            pipeline = self._state.pop("pipeline", None)
            if pipeline is not None:
                pipeline.close()
            self._state["worker"].close()

    def _timed(self, chunks):
        """The chunks, adding the time spent waiting for each to :attr:`wait_seconds`."""
        chunks = iter(chunks)
        while True:
            started = time.perf_counter()
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            finally:
                self.wait_seconds += time.perf_counter() - started
            yield chunk

    def _transform(self, state):
        return to_grey if self.features == "dsift" else ShapeAndCrop(state["preprocess"])

    def _chunks(self, state, items):
        """``(chunks, ready)``: the frame chunks of ``items`` (from the shared pipeline when
        they are the next ones in the planned order, else from a pipeline of their own) and a
        function saying whether the next chunk is already decoded."""
        ids = [item_id for item_id, _ in items]
        pipeline = state.get("pipeline")
        if pipeline is None and self.order is not None and self.order[:len(ids)] == ids:
            pipeline = state["pipeline"] = _Pipeline(
                prefetch(state["worker"], [(i, self.paths[i]) for i in self.order],
                         self.sampling, self._transform(state)), self.order)
        if pipeline is not None and pipeline.upcoming(len(ids)) == ids:
            return pipeline.take(ids), pipeline.chunks.ready
        if pipeline is not None:  # called out of order: drop the shared pipeline
            state.pop("pipeline").close()
        own = prefetch(state["worker"], items, self.sampling, self._transform(state))
        return _closing(own), own.ready

    def __call__(self, ids: Sequence[str]) -> list:
        state = self._setup()
        items = [(item_id, self.paths[item_id]) for item_id in ids]
        if self.features == "dsift":
            results = self._dsift(state, items)
        else:
            results = self._vgg(state, items)
        return [results.get(item_id, ItemError(item_id, "no frames were produced"))
                for item_id in ids]

    def _finish(self, state, array, extras) -> ItemOutput:
        if state["pca"] is not None:
            array = state["pca"].transform(array)
        return ItemOutput(np.ascontiguousarray(array, dtype=np.float32), extras)

    def _dsift(self, state, items):
        results: dict = {}
        parts: dict[str, list] = {}
        sift = state["sift"]
        keep_positions = self.feature_params["positions"]
        chunks, _ = self._chunks(state, items)
        for chunk in self._timed(chunks):
            if isinstance(chunk, ItemError):
                results[chunk.item] = chunk
                parts.pop(chunk.item, None)
                continue
            if chunk.item_id in results:  # failed on an earlier chunk
                continue
            if chunk.restart:
                parts.pop(chunk.item_id, None)
                continue
            acc = parts.setdefault(chunk.item_id, [])
            try:
                for frame, seconds in zip(chunk.frames, chunk.timestamps, strict=True):
                    acc.append((sift.compute(frame), seconds))
            except Exception as err:  # one bad frame fails its item, not the batch
                results[chunk.item_id] = ItemError(chunk.item_id, f"dense SIFT failed: {err}")
                parts.pop(chunk.item_id, None)
                continue
            if chunk.last:
                done = parts.pop(chunk.item_id)
                descriptors = np.concatenate([r.descriptors for r, _ in done])
                extras = {
                    "timestamps": np.asarray([s for _, s in done], dtype=np.float64),
                    "frame_index": np.concatenate([np.full(len(r.descriptors), k, np.int32)
                                                   for k, (r, _) in enumerate(done)]),
                }
                if keep_positions:
                    extras["positions"] = np.concatenate([r.positions for r, _ in done])
                results[chunk.item_id] = self._guard(chunk.item_id, state, descriptors, extras)
        return results

    def _guard(self, item_id, state, array, extras):
        try:
            return self._finish(state, array, extras)
        except Exception as err:
            return ItemError(item_id, f"{type(err).__name__}: {err}")

    def _vgg(self, state, items):
        from featpipe.extract.vgg import conv5_3_positions, normalise_batch

        vgg, preprocess = state["vgg"], state["preprocess"]
        results: dict = {}
        outputs: dict[str, list] = {}  # item -> feature rows per frame, in order
        meta: dict[str, list] = {}  # item -> (timestamp, frame shape) per frame
        complete: set[str] = set()
        pending: list[tuple[str, np.ndarray]] = []  # frames waiting for a model batch

        def run_batch(frames):
            features = vgg.forward(normalise_batch([f for _, f in frames], self.device))
            for (item_id, _), row in zip(frames, features, strict=True):
                if item_id in outputs:
                    outputs[item_id].append(row)

        def flush_complete():
            for item_id in sorted(complete):
                if any(p[0] == item_id for p in pending):
                    continue
                complete.discard(item_id)
                rows, frame_meta = outputs.pop(item_id), meta.pop(item_id)
                stamps = np.asarray([t for t, _ in frame_meta], dtype=np.float64)
                if vgg.layer == "fc6":
                    results[item_id] = self._guard(item_id, state, np.stack(rows),
                                                   {"timestamps": stamps})
                    continue
                cells = rows[0].shape[0]
                positions = np.concatenate([conv5_3_positions(preprocess.crop, preprocess, shape)
                                            for _, shape in frame_meta])
                extras = {"timestamps": stamps, "positions": positions,
                          "frame_index": np.repeat(np.arange(len(rows), dtype=np.int32), cells)}
                results[item_id] = self._guard(item_id, state, np.concatenate(rows), extras)

        chunks, ready = self._chunks(state, items)
        for chunk in self._timed(chunks):
            if isinstance(chunk, ItemError):
                results[chunk.item] = chunk
                outputs.pop(chunk.item, None)
                meta.pop(chunk.item, None)
                pending = [p for p in pending if p[0] != chunk.item]
                continue
            assert isinstance(chunk, FrameChunk)
            if chunk.restart:
                outputs[chunk.item_id], meta[chunk.item_id] = [], []
                pending = [p for p in pending if p[0] != chunk.item_id]
                continue
            outputs.setdefault(chunk.item_id, [])
            frame_meta = meta.setdefault(chunk.item_id, [])
            for (crop, shape), seconds in zip(chunk.frames, chunk.timestamps, strict=True):
                pending.append((chunk.item_id, crop))
                frame_meta.append((seconds, tuple(shape)))
            if chunk.last:
                complete.add(chunk.item_id)
            while len(pending) >= self.batch_size:
                run_batch(pending[:self.batch_size])
                pending = pending[self.batch_size:]
            if pending and not ready():  # the model never waits: compute what is there
                run_batch(pending)
                pending = []
            flush_complete()
        while pending:
            run_batch(pending[:self.batch_size])
            pending = pending[self.batch_size:]
        flush_complete()
        return results


def extract(store: Store, manifest: Manifest, features: str, *, name: str | None = None,
            sampling: Sampling | None = None, weights: str | None = None, device: str = "cpu",
            batch_size: int = 16, dtype: str = "float32", resize: int = 256, crop: int = 224,
            dsift: Mapping | None = None, positions: bool = True, pca: str | None = None,
            decoder: str = "opencv", decode_timeout: float = 600.0,
            options: RunOptions | None = None, reporter: Reporter | None = None) -> StageRun:
    """Decode every item of ``manifest`` and store its ``features``; returns the run.

    ``sampling`` picks the frames; ``weights``, ``device``, ``batch_size``, ``resize`` and
    ``crop`` configure VGG-16; ``dsift`` holds :class:`~featpipe.extract.dsift.DenseSIFT`'s
    parameters and ``positions`` whether its descriptor positions are kept; ``pca`` names a
    fitted ``pca`` stage that projects the features before they are stored.
    """
    if features not in FEATURES:
        raise ParameterError("features", f"must be one of {FEATURES}, got {features!r}")
    check_name(name)
    options = options or RunOptions()
    sampling = (sampling or Sampling()).validate()
    if batch_size < 1:
        raise ParameterError("batch_size", f"must be >= 1, got {batch_size}")
    if decode_timeout <= 0:
        raise ParameterError("decode_timeout", f"must be > 0, got {decode_timeout}")
    if not manifest.ids:
        raise FeatpipeError("the manifest has no items")
    params: dict = {"features": features, "manifest": manifest_digest(manifest),
                    "sampling": sampling.params(), "decoder": decoder}
    feature_params: dict = {}
    if features == "dsift":
        if weights is not None:
            raise ParameterError("weights", "applies to vgg16-* features only")
        dsift_params = dict(dsift or {})
        DenseSIFT(**dsift_params)._check()  # a bad parameter fails before any decoding
        feature_params = {"dsift": dsift_params, "positions": positions}
        params.update(feature_params)
    else:
        from featpipe.extract.vgg import weights_identity

        if crop < 32 or resize < crop:
            raise ParameterError("crop", f"needs 32 <= crop <= resize, got crop {crop}, "
                                 f"resize {resize}")
        feature_params = {"weights": weights, "resize": resize, "crop": crop}
        params.update({"weights": weights_identity(weights), "resize": resize, "crop": crop,
                       "precision": "fp16-autocast" if device == "cuda" else "fp32"})
    inputs = []
    pca_path = None
    if pca is not None:
        pca_stage = store.resolve(pca)
        if pca_stage.kind != "pca":
            raise FeatpipeError(f"--pca {pca} is a {pca_stage.kind} stage, not a pca stage")
        inputs.append(pca_stage)
        pca_path = str(pca_stage.path)
    stage = store.stage("extract", params, inputs=inputs, items=manifest, dtype=dtype,
                        create=not options.dry_run)
    paths = {it.id: str(manifest.resolve_path(it)) for it in manifest}
    compute = ExtractCompute(features, paths, sampling, feature_params, pca_path, decoder,
                             decode_timeout, batch_size, device)
    in_process = options.jobs == 1 and options.executor in ("local", "slurm")
    if in_process:  # one process computes the items in their planned order
        compute.order = plan(stage, manifest.ids, force=options.force,
                             shard=parse_shard(options.shard))[0]
    try:
        if in_process and compute.order and not options.dry_run:
            compute._setup()  # a bad checkpoint is one error, not one per item
        return run_stage(stage, manifest.ids, compute, store=store, name=name, options=options,
                         reporter=reporter, batch_size=ITEMS_PER_CALL[features])
    finally:
        compute.close()
