"""featpipe's compiled kernels: their cache, compiling them ahead, and the line a first use prints.

The hot loops of rank pooling and ``hrp`` (:mod:`featpipe.encode._window_loop`), the Fisher vector
(:mod:`featpipe.encode._fisher_loop`) and the chi-square kernels
(:mod:`featpipe.classify._chi2_loop`) are numba functions with ``cache=True``: the first call
for a combination of argument types compiles machine code (5-15 s each on a 2-core machine)
and writes it to numba's cache, and every later process loads it (well under a second).

Where the cache lives (numba's own rule, :func:`cache_dirs`): ``NUMBA_CACHE_DIR`` when set;
else ``__pycache__`` beside the kernel's module when that folder is writable (a checkout, an
editable install, a virtual environment the user owns); else the user's cache folder
(``~/.cache/numba``), as for a wheel installed into a read-only ``site-packages``.  When none of
these can be written, :func:`featpipe.numba_cache.ensure_cache_dir` points numba at a folder
of the temporary directory, so that the kernels still load (and compile once per boot).  An entry
is kept per CPU model (a cluster node of another CPU compiles its own once).

Compile every kernel ahead, once per environment (``bin/test`` and ``bin/demo`` do)::

    python -m featpipe.compiled            # or: from featpipe.compiled import warm; warm()

A job that still compiles a kernel says so first, on stderr, once per kernel and process
(a featpipe warning: ``-q`` hides it): ``compiling the rank-pooling kernels (first use only;
...)``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable

from featpipe.numba_cache import WARM_COMMAND, announce


def cache_dirs() -> dict[str, str]:
    """Where each kernel module's cached machine code lives (imports numba and the kernels)."""
    from featpipe.classify import _chi2_loop
    from featpipe.encode import _fisher_loop, _window_loop

    return {module.__name__: dispatcher._cache.cache_path
            for module, dispatcher in ((_window_loop, _window_loop.pool_windows),
                                       (_fisher_loop, _fisher_loop.accumulate),
                                       (_chi2_loop, _chi2_loop.chi2_accumulate))}


def _inputs(rng, shape, nonnegative=False):
    """The argument variants jobs give the kernels: float32 (stored items), float64 (Python
    callers), read-only float32 (memory-mapped items)."""
    import numpy as np

    X = rng.standard_normal(shape)
    X = np.abs(X) if nonnegative else X
    readonly = X.astype(np.float32)
    readonly.setflags(write=False)
    return [X.astype(np.float32), X, readonly]


def _warm_rank_pooling():
    """hrp's windows and final layer, and rankpool's whole sequences."""
    import numpy as np

    from featpipe.encode.functional.temporal import (
        hierarchical_rank_pool_sequences,
        rank_pool_sequences,
    )

    for X in _inputs(np.random.default_rng(0), (12, 5), nonnegative=True):
        hierarchical_rank_pool_sequences(
            [X], window=4, stride=1, depth=2, psi="ser", C=1.0, epsilon=0.1,
            directions="fwd", solver="newton", device="cpu", emit_layer=None,
            chunk_bytes=None)
    for X in _inputs(np.random.default_rng(0), (12, 5)):
        rank_pool_sequences([X], directions="both", psi="ssr", C=1.0, epsilon=0.1,
                            solver="newton", device="cpu", batch_size=8)


def _warm_fisher():
    import numpy as np

    from featpipe.encode.fisher import fisher_vector

    rng = np.random.default_rng(0)
    means = rng.standard_normal((3, 4))
    for x in _inputs(rng, (40, 4)):
        fisher_vector(x, np.full(3, 1 / 3), means, np.ones((3, 4)))


def _warm_chi2():
    import numpy as np

    from featpipe.classify.kernels import chi2_kernel

    X = np.abs(np.random.default_rng(0).standard_normal((6, 5)))
    chi2_kernel(X)
    chi2_kernel(X, X[:2])


def _warm_trajectories():
    import numpy as np

    from featpipe.extract.trajectories import DenseTrajectories, ImprovedDenseTrajectories

    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (72, 90), dtype=np.uint8)
    # idt's camera kernels too (SIFT finds keypoints in frames this small, ORB none)
    for method in (DenseTrajectories(n_scales=1),
                   ImprovedDenseTrajectories(n_scales=1, keypoints="sift")):
        tracker = method.start(64, 64)
        for t in range(17):  # a texture moving right: trajectories end from frame 15 on
            tracker.add(np.ascontiguousarray(texture[4:68, 2 + t // 2:66 + t // 2]))


#: kernel -> what compiles it, through the functions jobs call
KERNELS: dict[str, Callable[[], None]] = {
    "rank-pooling kernels": _warm_rank_pooling,
    "Fisher-vector kernels": _warm_fisher,
    "chi-square kernel": _warm_chi2,
    "dense-trajectory kernels": _warm_trajectories,
}


def warm(report: Callable[[str], None] | None = None,
         kernels: Iterable[str] | None = None) -> dict[str, float]:
    """Compile every kernel (or those named in ``kernels``, keys of :data:`KERNELS`) for the
    argument types featpipe's jobs give them, or load them from numba's cache when already
    there; returns the seconds each took.  ``report`` receives one line per kernel; the
    first-use lines of :func:`featpipe.numba_cache.announce` are not printed meanwhile."""
    taken = {}
    quiet = logging.getLogger(announce.__module__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for kernel in KERNELS if kernels is None else kernels:
            started = time.perf_counter()
            KERNELS[kernel]()
            taken[kernel] = time.perf_counter() - started
            if report is not None:
                report(f"{kernel}: {taken[kernel]:.1f} s")
    finally:
        quiet.setLevel(level)
    return taken


def main() -> None:
    print(f"featpipe: compiling the numba kernels into their cache ({WARM_COMMAND})",
          file=sys.stderr)
    warm(lambda line: print(f"  {line}", file=sys.stderr))
    for module, folder in cache_dirs().items():
        print(f"  {module}: {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
