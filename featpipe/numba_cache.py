"""numba's cache for featpipe's compiled kernels: a usable cache folder, SciPy's BLAS bindings
loaded alone before the first kernel, and the one line a job prints before it compiles a
kernel (:mod:`featpipe.compiled` says where the cache lives and compiles every kernel ahead).

Kept apart from :mod:`featpipe.compiled` (which imports the kernels) so that the kernel
modules and the functions that call them can use it; it imports numba only inside its
functions.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
import tempfile
import threading

logger = logging.getLogger(__name__)

#: the command that compiles every kernel ahead
WARM_COMMAND = "python -m featpipe.compiled"

_checked: set = set()
#: (dispatcher, quick keys of the arguments) already checked (:func:`_quick_key`)
_seen: set = set()
#: the kernel names already said to compile in this process
_told: set = set()
_lock = threading.Lock()


def load_blas_alone() -> None:
    """Before numba loads or compiles its first kernel: SciPy's BLAS bindings
    (``scipy.linalg.cython_blas``, which numba imports to see that it has a BLAS) loaded by
    themselves, without the ``scipy.linalg`` package that their import runs first (0.13 s of
    CPU; the bindings need nothing from it).  Nothing is done when that package is already
    imported or the bindings are not found; a later ``import scipy.linalg`` runs as usual."""
    name = "scipy.linalg.cython_blas"
    if "scipy.linalg" in sys.modules or name in sys.modules:
        return
    try:
        import scipy

        spec = importlib.machinery.PathFinder.find_spec(
            name, [os.path.join(folder, "linalg") for folder in scipy.__path__])
        if spec is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 (numba imports the package itself, as without this)
        sys.modules.pop(name, None)


def _writable(folder: str) -> bool:
    """Whether ``folder`` can be made and written to (numba's own test)."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _user_cache_dir() -> str:
    from numba.misc.appdirs import AppDirs

    return AppDirs(appname="numba", appauthor=False).user_cache_dir


def ensure_cache_dir(module_file: str) -> None:
    """Before a kernel module declares its ``cache=True`` functions: when numba could write
    neither beside ``module_file`` nor in the user's cache folder (where it would raise
    "cannot cache function ... no locator available"), use ``featpipe-numba-UID`` in the
    temporary directory."""
    import numba

    if numba.config.CACHE_DIR or _writable(os.path.join(os.path.dirname(module_file),
                                                        "__pycache__")) \
            or _writable(_user_cache_dir()):
        return
    folder = os.path.join(tempfile.gettempdir(), f"featpipe-numba-{os.getuid()}")
    logger.debug("numba cache: neither the package nor the user cache folder is writable; "
                 "using %s", folder)
    numba.config.CACHE_DIR = folder


def _cached(dispatcher, types: tuple) -> bool:
    """Whether numba's cache holds ``dispatcher`` compiled for argument ``types`` (its index
    is keyed by the types, the CPU and the code).  True when numba's internals cannot tell
    (then nothing is announced)."""
    try:
        cache = dispatcher._cache
        key = cache._index_key(types, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # another numba version: say nothing rather than fail a job
        return True


def _quick_key(value):
    """What numba's type of ``value`` depends on, found without numba: an array's dtype,
    dimensions, layout and flags, a tuple's items, a scalar's class (None: ask numba)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        flags = value.flags
        return (value.dtype.str, value.ndim, flags.c_contiguous, flags.f_contiguous,
                flags.writeable, flags.aligned)
    if isinstance(value, tuple):
        keys = tuple(_quick_key(v) for v in value)
        return None if None in keys else keys
    if isinstance(value, bool | int | float | np.generic):
        return type(value)
    return None


def announce(kernel: str, *calls: tuple) -> None:
    """Log ``compiling the KERNEL (first use only; ...)`` (a warning), once per ``kernel`` name
    and process, when one of the ``calls`` (``(dispatcher, args)``: a numba function and the
    arguments it is about to get) is going to compile: neither compiled in this process nor
    cached.  Each function and
    argument types are checked once per process (a call whose arrays have the dtypes, layouts
    and flags of one already checked costs a set look-up: numba's typing of each argument
    costs microseconds, and the Fisher-vector kernels run per frame)."""
    missing = False
    for dispatcher, args in calls:
        quick = (id(dispatcher), *(_quick_key(a) for a in args))
        if None not in quick and quick in _seen:
            continue
        try:
            types = tuple(dispatcher.typeof_pyval(a) for a in args)
        except Exception:  # noqa: BLE001 (numba's typing refuses: the call will say why)
            continue
        with _lock:
            if None not in quick:
                _seen.add(quick)
            if types in dispatcher.overloads or (id(dispatcher), types) in _checked:
                continue
            _checked.add((id(dispatcher), types))
        missing = missing or not _cached(dispatcher, types)
    with _lock:
        if not missing or kernel in _told:  # one line per kernel name and process
            return
        _told.add(kernel)
    logger.warning("compiling the %s (first use only; `%s` compiles every kernel ahead)",
                   kernel, WARM_COMMAND)
