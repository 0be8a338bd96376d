"""The compiled inner loop of the chi-square kernels (numba, threads over row tiles).

Kept apart from :mod:`featpipe.classify.kernels` so that numba is imported (and its cached
machine code loaded) only when a chi-square kernel is computed.  See that module's docstring
for the formulation: a float32 reciprocal refined by one float64 Newton step.
"""

from __future__ import annotations

import numba
import numpy as np

from featpipe.numba_cache import ensure_cache_dir

ensure_cache_dir(__file__)

_TINY = 2.0 ** -126  # smallest normal float32
_FASTMATH = {"nnan", "ninf", "nsz", "contract", "reassoc"}  # no 'arcp': divisions stay exact
_ROW_TILE = 8
_COL_BLOCK = 64


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True)
def chi2_accumulate(A, B, out, mode, symmetric):  # pragma: no cover (compiled)
    """out[i, j] += Σ_k num(a, b)/s(a, b) over the columns of float64 blocks A, B.

    mode 0: num = a b, s = |a| + |b|; mode 1: num = (a − b)², s = a + b; mode 2:
    num = max(a b, 0), s = |a| + |b|.  With ``symmetric`` (A is B) only j <= i is computed.
    """
    n = A.shape[0]
    m = B.shape[0]
    dims = A.shape[1]
    n_tiles = (n + _ROW_TILE - 1) // _ROW_TILE
    n_tasks = (n_tiles + 1) // 2 if symmetric else n_tiles
    for task in numba.prange(n_tasks):
        for which in range(2):
            if which == 0:
                tile = task
            else:
                tile = n_tiles - 1 - task  # pair short and long tiles of the triangle
                if not symmetric or tile == task:
                    break
            i0 = tile * _ROW_TILE
            i1 = min(i0 + _ROW_TILE, n)
            j_stop = i1 if symmetric else m
            for j0 in range(0, j_stop, _COL_BLOCK):
                j1 = min(j0 + _COL_BLOCK, j_stop)
                for i in range(i0, i1):
                    j_end = min(j1, i + 1) if symmetric else j1
                    for j in range(j0, j_end):
                        acc = 0.0
                        for k in range(dims):
                            a = A[i, k]
                            b = B[j, k]
                            if mode == 1:
                                num = (a - b) * (a - b)
                                s = a + b
                            elif mode == 2:
                                num = max(a * b, 0.0)
                                s = abs(a) + abs(b)
                            else:
                                num = a * b
                                s = abs(a) + abs(b)
                            s = max(s, _TINY)
                            r = np.float64(np.float32(1.0) / np.float32(s))
                            r = r + r * (1.0 - s * r)
                            acc += num * r
                        out[i, j] += acc


def set_threads(n_jobs: int | None) -> int:
    """Use ``n_jobs`` threads (None, 0 or -1: all of numba's); returns the previous count."""
    previous = numba.get_num_threads()
    available = numba.config.NUMBA_NUM_THREADS
    wanted = available if n_jobs is None or n_jobs in (0, -1) else int(n_jobs)
    numba.set_num_threads(max(1, min(wanted, available)))
    return previous
