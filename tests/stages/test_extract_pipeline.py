"""The decode pipeline that feeds a model: N decoding workers, one model on its own thread,
batches packed across items, every frame back to its item in order; progress in frames."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from featpipe.extract.streaming import CropProgram, Extraction, FrameSinks, Network
from featpipe.io.video import DecodePool, Sampling, iter_frames
from featpipe.manifest import Manifest
from featpipe.stages.base import Progress, Reporter, RunOptions
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.unit.test_video import write_video

torch = pytest.importorskip("torch")


class SlowModel:
    """A stand-in for a busy GPU model: its first batch lasts until ``gate`` is set (the
    next batch is packed meanwhile, from whatever items decode); the features of a
    crop are its mean per channel and its top-left pixel (every frame is recognisable)."""

    device = "cpu"

    def __init__(self):
        self.gate = threading.Event()
        self.batches: list[int] = []
        self.threads: set[int] = set()

    def forward_crops(self, crops):
        self.threads.add(threading.get_ident())
        self.batches.append(len(crops))
        self.gate.wait(60)
        x = crops.float()
        return torch.cat([x.mean(dim=(1, 2)), x[:, 0, 0, :]], dim=1).numpy()

    @staticmethod
    def features(crop: np.ndarray) -> np.ndarray:
        x = crop.astype(np.float32)
        return np.concatenate([x.mean(axis=(0, 1)), x[0, 0]])


def test_batches_span_items_and_one_model_serves_all_workers(tmp_path):
    from featpipe.extract.vgg import VGGPreprocess

    paths = {}
    for k in range(6):  # frame brightness differs per item and per frame
        paths[f"v{k}"] = str(write_video(tmp_path / f"v{k}.mp4", n_frames=9 + k,
                                         size=(64 + 8 * k, 48)))
    manifest = Manifest.read(write_manifest(tmp_path, [(i, p, "a", "train")
                                                       for i, p in paths.items()]))
    stage = Store(tmp_path / "s").stage("extract", {"test": "pipeline"}, items=manifest)
    prep = VGGPreprocess(40, 32)
    model = SlowModel()
    per_item = {i: len(list(iter_frames(p, Sampling(every=4)))) for i, p in paths.items()}
    frames, pids, decoded = [], set(), []
    with DecodePool(2, program=CropProgram(prep)) as pool:
        poll = pool.poll

        def decoding(*args, **kwargs):  # the frames the workers send, as the parent reads them
            events = poll(*args, **kwargs)
            decoded.extend(len(e[3]) for e in events if e[0] == "frames")
            pids.update(w.pid for w in pool.workers if w.pid)
            if model.batches and sum(decoded) - model.batches[0] >= 8:
                model.gate.set()  # a whole batch was packed while the model computed
            return events

        pool.poll = decoding
        extraction = Extraction(stage, pool, Sampling(every=4),
                                FrameSinks(str(stage.path), local=False),
                                network=Network(model, prep, 8))
        extraction.on_frames = frames.append  # frames done: out of the model
        outcome = dict(extraction.run(list(paths.items())))
    assert outcome == {i: None for i in paths}
    assert len(pids) == 2  # two decoding processes ...
    assert len(model.threads) == 1  # ... and one model, on one thread
    assert max(per_item.values()) == 4 and max(model.batches) == 8  # a batch spans items
    assert sum(frames) == sum(decoded) == sum(model.batches) == sum(per_item.values())
    for item_id, path in paths.items():
        decoded = list(iter_frames(path, Sampling(every=4)))
        expected = np.stack([SlowModel.features(prep(f)) for _, f in decoded])
        np.testing.assert_allclose(stage.read_item(item_id), expected, rtol=1e-6, atol=1e-4)
        np.testing.assert_allclose(stage.extras_of(item_id)["timestamps"],
                                   [t for t, _ in decoded], atol=1e-9)


class Recorder(Reporter):
    def __init__(self):
        self.bars: list[tuple] = []
        self.advanced = 0

    def progress(self, total, label, unit="items"):
        self.bars.append((total, label, unit))
        recorder = self

        class Count(Progress):
            def advance(self, n=1):
                recorder.advanced += n

        return Count()


def test_progress_counts_frames_and_jobs_share_the_work(tmp_path):
    from featpipe.stages.extraction import extract

    for k in range(4):
        write_video(tmp_path / f"v{k}.mp4", n_frames=30, size=(96, 80))
    manifest = Manifest.read(write_manifest(tmp_path, [(f"v{k}", f"v{k}.mp4", "a", "train")
                                                       for k in range(4)]))
    results = {}
    for jobs in (1, 2):
        reporter = Recorder()
        run = extract(Store(tmp_path / f"s{jobs}"), manifest, "dsift",
                      sampling=Sampling(every=3), params={"sizes": [8], "step": 8},
                      options=RunOptions(jobs=jobs), reporter=reporter)
        assert run.ok and run.summary.done == 4
        assert reporter.bars == [(40, "extract", "frames")]  # 4 items x 10 sampled frames
        assert reporter.advanced == 40
        results[jobs] = {i: run.stage.read_item(i) for i in manifest.ids}
    for item_id in manifest.ids:  # two workers compute exactly what one does
        np.testing.assert_array_equal(results[1][item_id], results[2][item_id])


class ThreadsSeen:
    """A stand-in model that records the torch threads it runs with (features: zeros)."""

    device = "cpu"

    def __init__(self):
        self.threads: set[int] = set()

    def forward_crops(self, crops):
        self.threads.add(torch.get_num_threads())
        return np.zeros((len(crops), 2), np.float32)


@pytest.mark.parametrize(("setting", "cores", "expected"), [("3", 2, 3), ("", 16, 14)])
def test_the_model_runs_with_the_threads_of_the_rule(tmp_path, monkeypatch, setting, cores,
                                                     expected):
    """``model_threads(jobs)``: FEATPIPE_THREADS when set, else the cores less one per
    decoding worker from 8 cores per worker (16 cores, 2 workers: 14)."""
    from featpipe.extract import cpu_inference
    from featpipe.extract.vgg import VGGPreprocess

    monkeypatch.setenv("FEATPIPE_THREADS", setting)
    monkeypatch.setattr(cpu_inference, "available_cores", lambda: cores)
    path = str(write_video(tmp_path / "v.mp4", n_frames=6, size=(48, 40)))
    manifest = Manifest.read(write_manifest(tmp_path, [("v", path, "a", "train")]))
    stage = Store(tmp_path / "s").stage("extract", {"test": "threads"}, items=manifest)
    model = ThreadsSeen()
    with DecodePool(2, program=CropProgram(VGGPreprocess(40, 32))) as pool:
        extraction = Extraction(stage, pool, Sampling(every=2),
                                FrameSinks(str(stage.path), local=False),
                                network=Network(model, VGGPreprocess(40, 32), 2))
        assert dict(extraction.run([("v", path)])) == {"v": None}
    assert model.threads == {expected}
    assert stage.read_item("v").shape == (3, 2)
