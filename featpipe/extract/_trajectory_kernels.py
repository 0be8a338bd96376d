"""The compiled kernels of dense trajectories as the tracker calls them: an extension module
built ahead of time where one can be built, else numba's functions.

The kernels are numba functions (:mod:`featpipe.extract._trajectory_numba`, and the flow's
median filter in :mod:`featpipe.extract._flow_median`).  A process that imports numba pays
about 150 MiB of memory (LLVM's 160 MB library, most of it touched by its static
initialisers, and numba's own state) and 0.4 s of CPU before its first frame: more memory than
the release's whole program.  So the kernels of :data:`KERNELS` are also compiled ahead of
time by numba's ``pycc`` into one CPython extension module for this CPU, these sources and
these versions (:func:`module_path`), the first time a process needs them (in a subprocess,
with a line on stderr: ``compiling the dense-trajectory kernels ahead of time (first use only;
...)``), and later processes import it without numba.

Each kernel here checks its array arguments against its signature (dtype, dimensions, C
order and alignment, writable where it writes) and calls the module's function; other
arguments go to numba's function, which compiles for them, as every call does where the
module cannot be built (no C compiler or Python headers, a numba without ``pycc``: the reason
is logged and kept beside the module's path, so that later processes do not try again).
Both are compiled by numba from the same sources for this CPU and release the GIL, as the
numba functions do: equal to the bit (tests/unit/test_trajectory_aot.py).  Any other name
(the private passes, constants) is the numba module's.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

logger = logging.getLogger("featpipe.numba_cache")

_NUMBA = "featpipe.extract._trajectory_numba"
_MEDIAN = "featpipe.extract._flow_median"


def _array(dtype: str, ndim: int, written: bool = False) -> tuple:
    return (dtype, ndim, written)


def _out(dtype: str, ndim: int) -> tuple:
    return _array(dtype, ndim, True)


_F2, _F3 = _array("float32", 2), _array("float32", 3)
#: each kernel: (its module, its return type, its arguments: a numba scalar type, or an
#: array's (dtype, dimensions, whether the kernel writes it); arrays are C-contiguous)
KERNELS: dict[str, tuple[str, str, tuple]] = {
    "polynomial_coefficients": (_NUMBA, "void", (_F2,) * 6 + ("f4",) * 4 + (_out("float32", 3),)),
    "polynomial_expansion": (_NUMBA, "void", (_F2, _out("float32", 3))),
    "farneback_matrices": (_NUMBA, "void", (_F3, _F3, _F3, _out("float32", 3))),
    "farneback_solve": (_NUMBA, "void", (_F3, _out("float32", 3))),
    "farneback_update": (_NUMBA, "void", (_F3, _F3, _out("float32", 3))),
    "flow_median": (_MEDIAN, "float32[:, :, ::1]", (_F3,)),
    "integral_ring": (_NUMBA, "float32[:, :, ::1]", ("intp", "intp")),
    "advance_tracks": (_NUMBA, "intp", (
        _out("float32", 3), _out("intp", 1), _F3, _array("uint8", 2), _F3, _out("float32", 3),
        _array("intp", 1), _array("intp", 1), _array("intp", 1), "intp", "intp", "intp",
        "intp", "f4", "f4", _out("float32", 3), _out("bool", 1), _out("float32", 3))),
    "grid_points": (_NUMBA, "intp", (_F2, "f8", "intp", _F3, _array("intp", 1),
                                     _array("bool", 1), _out("float32", 2))),
    "start_tracks": (_NUMBA, "b1", (_F2, _out("float32", 3), _out("intp", 1),
                                    _out("float32", 3), _out("float32", 3), _out("bool", 1))),
    "match_window": (_NUMBA, "void", (_F2, _F2, "f4", _out("uint8", 2))),
    "homography_maps": (_NUMBA, "void", (_array("float64", 2), "f4", _out("float32", 2),
                                         _out("float32", 2), _out("bool", 2))),
}
#: numba's names of the arrays' dtypes
_NUMBA_TYPES = {"float32": "float32", "float64": "float64", "intp": "intp", "uint8": "uint8",
                "bool": "boolean"}


def numba_signature(name: str) -> str:
    """The numba signature of kernel ``name`` (``KERNELS``), e.g. ``void(float32[:, ::1],
    float32[:, :, ::1])``."""
    _, returns, arguments = KERNELS[name]
    spelled = [argument if isinstance(argument, str)
               else f"{_NUMBA_TYPES[argument[0]]}[{', '.join([':'] * (argument[1] - 1) + ['::1'])}]"
               for argument in arguments]
    return f"{returns}({', '.join(spelled)})"


def _place() -> bytes:
    """What the module's code depends on besides the sources: the compiler (numba's and
    llvmlite's installed files), numpy's version, Python's ABI, the CPU (model and features),
    and where these sources are (each checkout keeps its own)."""
    parts = [np.__version__.encode(), sys.implementation.cache_tag.encode(),
             platform.machine().encode(), _cpu(), os.path.abspath(__file__).encode()]
    for package in ("numba", "llvmlite"):
        spec = importlib.util.find_spec(package)
        origin = spec.origin if spec is not None else None
        stat = os.stat(origin) if origin else None
        parts.append(f"{package} {origin} {stat and (stat.st_size, stat.st_mtime_ns)}".encode())
    return b"\0".join(parts)


def _code() -> bytes:
    """The kernels' sources and signatures."""
    parts = [repr(sorted(KERNELS.items())).encode()]
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("_trajectory_numba.py", "_flow_median.py", "farneback_filters.py"):
        with open(os.path.join(here, name), "rb") as f:
            parts.append(f.read())
    return b"\0".join(parts)


def _cpu() -> bytes:
    """The CPU's model name and feature flags (the first processor in /proc/cpuinfo), or what
    the platform says."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            block = f.read().split(b"\n\n", 1)[0]
        lines = [line for line in block.splitlines()
                 if line.split(b":")[0].strip() in (b"model name", b"flags", b"Features",
                                                    b"CPU part")]
        if lines:
            return b"\n".join(lines)
    except OSError:
        pass
    return f"{platform.processor()} {platform.machine()}".encode()


def cache_folder() -> str:
    """Where the module is kept: ``NUMBA_CACHE_DIR``/featpipe when that is set (as numba's own
    cache), else this package's ``__pycache__`` when writable, else the user's cache folder
    (``$XDG_CACHE_HOME`` or ~/.cache)/featpipe, else a folder of the temporary directory that
    only this user can write."""
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(os.path.join(os.environ["NUMBA_CACHE_DIR"], "featpipe"))
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"))
    candidates.append(os.path.join(os.environ.get("XDG_CACHE_HOME")
                                   or os.path.join(os.path.expanduser("~"), ".cache"),
                                   "featpipe"))
    for folder in candidates:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK | os.X_OK):
            return folder
    folder = os.path.join(tempfile.gettempdir(), f"featpipe-aot-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    status = os.stat(folder)
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise OSError(f"{folder} is not this user's alone; not loading compiled code from it")
    return folder


def module_path() -> str:
    """The extension module's path for these sources, versions and CPU (it may not exist):
    ``_trajectory_aot_<place>_<code>`` (:func:`_place`, :func:`_code`)."""
    place, code = (hashlib.sha256(part()).hexdigest()[:12] for part in (_place, _code))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return os.path.join(cache_folder(), f"_trajectory_aot_{place}_{code}{suffix}")


def _remove_older(path: str) -> None:
    """Remove the modules of the same place built from other sources (and their lock and
    failure files): a changed source builds a new one.  A process that has one loaded keeps
    its mapping."""
    folder, name = os.path.split(path)
    place = name[:len("_trajectory_aot_") + 12]
    for other in os.listdir(folder):
        if other.startswith(place) and not other.startswith(name):
            try:
                os.remove(os.path.join(folder, other))
            except OSError:
                pass


def _module_name(path: str) -> str:
    return os.path.basename(path).split(".")[0]


def _load(path: str):
    spec = importlib.util.spec_from_file_location(_module_name(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _failure_path(path: str) -> str:
    return path + ".failed"


def _compiled_module():
    """The extension module, built first when missing (None where it cannot be: numba's
    functions are used, and the reason is kept beside its path)."""
    try:
        path = module_path()
    except OSError as err:
        logger.debug("dense-trajectory kernels: no cache folder (%s); numba's functions", err)
        return None
    if not os.path.exists(path) and not os.path.exists(_failure_path(path)):
        _build_once(path)
    if os.path.exists(path):
        try:
            return _load(path)
        except ImportError as err:
            _record_failure(path, f"the built module does not load: {err}")
            return None
    logger.debug("dense-trajectory kernels: numba's functions (%s)", _failure_path(path))
    return None


def _build_once(path: str) -> None:
    """Build the module at ``path`` in a subprocess, one process at a time (a lock beside it:
    the others wait and then load it)."""
    from featpipe.numba_cache import WARM_COMMAND

    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        fcntl = None
    with open(path + ".lock", "a+") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path) or os.path.exists(_failure_path(path)):
            return
        logger.warning("compiling the dense-trajectory kernels ahead of time (first use only; "
                       "`%s` compiles every kernel ahead)", WARM_COMMAND)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        try:
            done = subprocess.run(
                [sys.executable, "-c", "import sys; from featpipe.extract._trajectory_kernels "
                 "import build; build(sys.argv[1])", path],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
        except OSError as err:
            _record_failure(path, f"could not start Python: {err}")
            return
        if done.returncode != 0 or not os.path.exists(path):
            lines = (done.stderr or done.stdout).strip().splitlines()
            _record_failure(path, lines[-1] if lines else f"exit status {done.returncode}")
        else:
            _remove_older(path)


def _record_failure(path: str, reason: str) -> None:
    logger.warning("dense-trajectory kernels: not compiled ahead of time (%s); numba's "
                   "functions are used (more memory and start-up per process)", reason)
    try:
        with open(_failure_path(path), "w") as f:
            f.write(reason + "\n")
    except OSError:
        pass


def build(path: str) -> None:
    """Compile every kernel of :data:`KERNELS` into the extension module ``path`` (numba's
    ``pycc`` for this CPU; in a temporary folder beside it, then moved into place)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from numba.pycc import CC, compiler

    import numba

    class ReleasingTheGil(compiler.Flags):
        """The flags of the exported functions: their wrappers release the GIL, as the numba
        functions' (``nogil=True``) do."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True

    compiler.Flags = ReleasingTheGil
    folder = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(path))
    try:
        cc = CC(_module_name(path))
        cc.output_dir = folder
        cc.target_cpu = "host"
        cc.verbose = False
        for name, (module, _, arguments) in KERNELS.items():
            kernel = getattr(importlib.import_module(module), name)
            cc.export(name, numba_signature(name))(numba.njit(_calling(kernel, len(arguments))))
        cc.compile()
        built = os.path.join(folder, os.path.basename(path))
        os.replace(built, path)
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)


def _calling(kernel, count: int):
    """A function of ``count`` arguments that calls ``kernel`` with them (what ``pycc`` exports:
    the kernel keeps its own options, as numba compiles a callee)."""
    names = ", ".join(f"a{i}" for i in range(count))
    namespace = {"kernel": kernel}
    exec(f"def call({names}):\n    return kernel({names})\n", namespace)  # noqa: S102
    return namespace["call"]


def _numba_kernel(name: str):
    return getattr(importlib.import_module(KERNELS[name][0]), name)


def _checked(name: str, compiled):
    """Kernel ``name``: the module's function where its arrays match the signature, else
    numba's."""
    arrays = [(i, np.dtype(spec[0] if spec[0] != "bool" else np.bool_), spec[1], spec[2])
              for i, spec in enumerate(KERNELS[name][2]) if not isinstance(spec, str)]

    def kernel(*args):
        for i, dtype, ndim, written in arrays:
            a = args[i]
            if type(a) is not np.ndarray or a.ndim != ndim or a.dtype != dtype:
                break
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned) or (written and not flags.writeable):
                break
        else:
            return compiled(*args)
        return _numba_kernel(name)(*args)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = f"{KERNELS[name][0]}.{name}, compiled ahead of time ({numba_signature(name)})."
    return kernel


_module = None
_loaded = False


def kernel(name: str):
    """Kernel ``name`` of :data:`KERNELS`: the ahead-of-time module's (argument-checked), else
    numba's function."""
    global _module, _loaded
    if not _loaded:
        _module, _loaded = _compiled_module(), True
    if _module is None:
        return _numba_kernel(name)
    return _checked(name, getattr(_module, name))


def __getattr__(name: str):
    if name in KERNELS:
        value = kernel(name)
        globals()[name] = value
        return value
    if name.startswith("__"):  # the import system's questions (``__path__``...) are ours
        raise AttributeError(name)
    return getattr(importlib.import_module(_NUMBA), name)
