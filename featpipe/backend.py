"""Array-namespace selection: one code path for numpy, CuPy and torch (the array API).

Numerical code takes its namespace from its inputs (``xp = namespace(x)``) and calls only
array-API functions on it, so the same function runs on numpy, ``array_api_strict`` (tests),
torch (CPU or CUDA) and CuPy (GPU).  ``device_namespace('cuda')`` picks CuPy, else torch,
and says clearly when neither can reach a GPU.

``worker_threads()`` is the number of threads a process uses for its own parallel loops
(``FEATPIPE_THREADS``, else the cores it may run on); ``memory_budget()`` is a process's
working memory for chunked encoders (``FEATPIPE_MEMORY``, else 256 MiB), split among these
threads, so peak memory follows a setting and does not grow with the core count (both parsed
by :mod:`featpipe.settings`).  Code that runs its
own threads calls BLAS inside ``single_threaded_blas()``.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import math
import os

import array_api_compat
import numpy as np

from featpipe.errors import FeatpipeError, InputError, WriteError
from featpipe.settings import memory_setting, threads_setting

DEVICES = ("cpu", "cuda")
#: Working memory of a process for chunked encoders when ``FEATPIPE_MEMORY`` is not set.
DEFAULT_MEMORY_BYTES = 256 * 2**20


def single_threaded_blas():
    """A context in which BLAS runs on one thread: for loops that run one chunk per core, where
    idle BLAS threads spinning after each product would take those cores (measured on 2 cores:
    Fisher vectors of 60,000 descriptors, K = 256, D = 64, 266 ms, against 375 ms with
    OpenBLAS's own threads)."""
    return _threadpools().limit(limits=1, user_api="blas")


@functools.cache
def _threadpools():
    """The process's thread-pool controller, found once (finding the libraries takes ~3 ms)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def memory_budget(chunk_bytes: int | None = None) -> int:
    """Working memory of this process for its chunks of work, in bytes: ``chunk_bytes`` when
    given, else ``FEATPIPE_MEMORY`` (bytes, or a number with K, M, G or T: ``512M``, ``4G``;
    binary units), else :data:`DEFAULT_MEMORY_BYTES`.  Split among :func:`worker_threads`."""
    if chunk_bytes is not None:
        return chunk_bytes
    size = memory_setting()
    return DEFAULT_MEMORY_BYTES if size is None else size


#: where arrays too big for :func:`memory_budget` go (a folder of the store while an item is
#: encoded in an extraction's pass: :mod:`featpipe.chain`); None: the system's temporary folder
SPILL_FOLDER: contextvars.ContextVar[str | None] = contextvars.ContextVar("featpipe_spill",
                                                                          default=None)


def spill_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array of ``shape``: in memory when it fits :func:`memory_budget`, else a
    memory map of a temporary file in :data:`SPILL_FOLDER`, deleted once unmapped (the pages
    it uses are the file system's cache, not the process's memory).

    The file's blocks are reserved before it is mapped (:func:`reserve_file`): a store on a
    full disk is then a :class:`~featpipe.errors.WriteError` naming the disk, never the
    SIGBUS a write through the map of a sparse file gets when the disk cannot hold the page
    (SQLite and LMDB document that signal)."""
    import tempfile

    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    if size <= memory_budget():
        return np.zeros(shape, dtype)
    folder = SPILL_FOLDER.get() or tempfile.gettempdir()
    with tempfile.NamedTemporaryFile(prefix="featpipe-spill-", suffix=".tmp",
                                     dir=folder) as handle:
        reserve_file(handle, size, folder)
        return np.memmap(handle, dtype=dtype, mode="r+", shape=shape)


def reserve_file(handle, size: int, folder: str) -> None:
    """Give the open file ``handle`` ``size`` allocated bytes (``posix_fallocate``; zeros
    written with ``write()`` where the system or the file system has no such call), so that
    a memory map of it never needs a block the disk lacks; a disk without room for them is
    a :class:`~featpipe.errors.WriteError` naming ``folder``, its free bytes and ``size``."""
    import errno
    from pathlib import Path

    from featpipe.fileio import free_bytes, human_bytes, os_reason

    try:
        try:
            os.posix_fallocate(handle.fileno(), 0, size)
            return
        except AttributeError:  # not on this system (macOS)
            pass
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
        block = bytes(min(size, 2**20))
        for start in range(0, size, len(block)):
            handle.write(block[:size - start])
        handle.flush()
    except OSError as err:
        free = free_bytes(Path(folder))
        room = "" if free is None else f"{human_bytes(free)} free, "
        raise WriteError(f"cannot write a spill file in {folder}: {os_reason(err, folder)}; "
                         f"its disk has {room}the file needs {human_bytes(size)} "
                         "(free space there, or raise FEATPIPE_MEMORY to keep it in "
                         "memory)") from None


def all_rows(X, predicate, rows: int = 1024) -> bool:
    """``bool(all(predicate(X)))`` over the rows of a 2-D+ array; numpy arrays a block of
    ``rows`` at a time, so a long (memory-mapped) sequence needs no full-size temporary."""
    if not isinstance(X, np.ndarray) or X.ndim < 2:
        xp = namespace(X)
        return bool(xp.all(predicate(X)))
    return all(bool(np.all(predicate(X[start:start + rows])))
               for start in range(0, X.shape[0], rows))


def worker_threads() -> int:
    """Threads for a process's own parallel loops: ``FEATPIPE_THREADS`` when set (>= 1), else
    the number of cores this process may run on (its CPU affinity, as SLURM sets it)."""
    threads = threads_setting()
    return available_cores() if threads is None else threads


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: a SLURM task or ``taskset`` limit)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def solve_spd(A, b):
    """Solve A x = b for a batch of symmetric positive definite A (..., n, n), b (..., n, 1).

    torch: a Cholesky factorisation and ``cholesky_solve`` (half the work of LU, and torch's
    CPU batched LU solve fails with more than one thread for n > 256 with MKL: "Pivots given
    to lu_solve must all be greater or equal to 1"); other namespaces: ``linalg.solve``.
    Differentiable under torch autograd (for symmetric perturbations).
    """
    if array_api_compat.is_torch_array(A):
        import torch

        return torch.cholesky_solve(b, torch.linalg.cholesky(A))
    return namespace(A, b).linalg.solve(A, b)


def refuse_grad(*arrays, what: str) -> None:
    """Raise a clear error when a torch tensor among ``arrays`` requires grad: ``what`` is
    computed with steps that autograd cannot follow (host-side scalars, iterative solvers), so
    its gradient would be silently wrong."""
    for array in arrays:
        if getattr(array, "requires_grad", False):
            raise InputError(f"{what} is not differentiable (it takes host-side steps that "
                             "autograd cannot follow); pass tensors that do not require grad "
                             "(.detach()), or use a differentiable alternative")


def namespace(*arrays):
    """The array-API namespace shared by ``arrays`` (numpy, cupy, torch or array_api_strict).

    NumPy arrays get NumPy itself (their ``__array_namespace__``: NumPy >= 2.1 implements the
    standard, ``cumulative_sum`` and ``astype`` included), not array_api_compat's wrapper,
    whose import loads every NumPy submodule, f2py included (0.1-0.2 s of CPU at the start of
    every run that encodes)."""
    import numpy as np

    if arrays and _numpy_is_standard() and all(isinstance(a, np.ndarray) for a in arrays):
        return arrays[0].__array_namespace__()
    return array_api_compat.array_namespace(*arrays)


@functools.cache
def _numpy_is_standard() -> bool:
    import numpy as np

    return np.lib.NumpyVersion(np.__version__) >= "2.1.0"


def to_numpy(array):
    """Copy an array of any supported namespace to a numpy array on the host."""
    import numpy as np

    if array_api_compat.is_numpy_array(array):
        return array
    if array_api_compat.is_torch_array(array):
        return array.detach().cpu().numpy()
    if array_api_compat.is_cupy_array(array):
        return array.get()
    return np.asarray(array)


def device_namespace(device: str = "cpu"):
    """``(xp, device_object)`` for ``device``: numpy on ``cpu``; CuPy or torch on ``cuda``."""
    if device not in DEVICES:
        raise FeatpipeError(f"--device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        import numpy as np

        return array_api_compat.array_namespace(np.empty(0)), "cpu"
    if importlib.util.find_spec("cupy") is not None:
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return array_api_compat.array_namespace(cupy.empty(0)), cupy.cuda.Device()
        except cupy.cuda.runtime.CUDARuntimeError:
            pass
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return array_api_compat.array_namespace(torch.empty(0)), torch.device("cuda")
    raise FeatpipeError("--device cuda: no GPU found (neither CuPy nor torch sees a CUDA "
                        "device); use --device cpu or install featpipe[gpu] on a GPU machine")
