"""The compiled kernels' cache (featpipe.compiled, featpipe.numba_cache): compiled once ahead
by ``warm``, loaded by every later process, and a job that compiles one says so in one line.

Each test uses its own empty cache folder in a fresh process, so it compiles for real (a few
seconds per kernel and argument type); no test measures time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests._stores import write_npy_dataset
from tests.conftest import REPO, run_cli

#: hrp through the functional core on the argument types jobs give the kernel; prints the
#: window kernel's cache hits and misses
HRP_PROBE = """
import json
import numpy as np
from featpipe.encode import _window_loop
from featpipe.encode.functional.temporal import hierarchical_rank_pool_sequences
X = np.abs(np.random.default_rng(1).standard_normal((30, 7)))
readonly = X.astype(np.float32)
readonly.setflags(write=False)
for Y in (X.astype(np.float32), X, readonly):
    hierarchical_rank_pool_sequences([Y], window=5, stride=2, depth=2, psi="ser", C=1.0,
        epsilon=0.1, directions="fwd", solver="newton", device="cpu", emit_layer=None,
        chunk_bytes=None)
stats = _window_loop.pool_windows.stats
print(json.dumps([sum(stats.cache_hits.values()), sum(stats.cache_misses.values())]))
"""

WARM = """
from featpipe.compiled import cache_dirs, warm
warm(kernels=["rank-pooling kernels"])
print(cache_dirs()["featpipe.encode._window_loop"])
"""


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_warm_compiles_into_the_user_cache_and_a_fresh_process_loads_it(tmp_path):
    """As for a wheel in a read-only site-packages (numba's in-tree locator left out): warm()
    writes the window kernel into the user's cache folder, and a fresh process loads every
    argument type from there, compiling nothing and printing nothing."""
    env = {"NUMBA_CACHE_LOCATOR_CLASSES": "UserWideCacheLocator",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": ""}
    folder = _python(WARM, env).stdout.strip()
    assert folder.startswith(str(tmp_path / "cache" / "numba"))
    files = os.listdir(folder)
    assert any(f.startswith("_window_loop.pool_windows") and f.endswith(".nbi") for f in files)
    assert sum(f.startswith("_window_loop.pool_windows") and f.endswith(".nbc")
               for f in files) == 3  # float32, float64, read-only float32
    done = _python(HRP_PROBE, env)
    hits, misses = json.loads(done.stdout)
    assert (hits, misses) == (3, 0)
    assert "compiling" not in done.stderr


def test_a_job_that_compiles_says_so_once_and_the_next_does_not(tmp_path):
    """An empty cache: the first ``featpipe encode --method hrp`` prints one line saying that
    it compiles the kernel (first use only) and how to do it ahead; the second run loads it
    and prints no such line; both compute the same vectors."""
    manifest = write_npy_dataset(tmp_path, n=3)
    store = tmp_path / "store"
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    run_cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
            "--name", "feats")
    first = run_cli("encode", "-s", store, "-i", "feats", "-m", "hrp", "--window", "3",
                    "--name", "one", env=env)
    lines = [line for line in first.stderr.splitlines() if "compiling" in line]
    assert len(lines) == 1
    assert "compiling the rank-pooling kernels (first use only; `python -m featpipe.compiled` " \
           "compiles every kernel ahead)" in lines[0]
    second = run_cli("encode", "-s", store, "-i", "feats", "-m", "hrp", "--window", "3",
                     "--name", "two", "--force", env=env)
    assert "compiling" not in second.stderr
    from featpipe.store import Store

    one, two = Store(store).resolve("one"), Store(store).resolve("two")
    for item in one.items.ids:
        np.testing.assert_array_equal(one.read_item(item), two.read_item(item))


def test_without_a_writable_cache_folder_numba_gets_a_temporary_one(monkeypatch):
    """Neither the package's __pycache__ nor the user's cache folder writable (numba would
    refuse to declare the kernels): the cache goes to the temporary directory."""
    import numba

    from featpipe import numba_cache

    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(numba_cache, "_writable", lambda folder: False)
    numba_cache.ensure_cache_dir(numba_cache.__file__)
    assert numba.config.CACHE_DIR.endswith(f"featpipe-numba-{os.getuid()}")
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(numba_cache, "_writable", lambda folder: True)
    numba_cache.ensure_cache_dir(numba_cache.__file__)
    assert numba.config.CACHE_DIR == ""  # numba's own rule applies
