"""Startup time of the command line: ``featpipe --help`` and the ``--help`` of every command
against ``python -c pass`` (the interpreter alone) and ``python -c "import numpy"``, measured
in the same run; with ``--first-result``, the time to the first result (issue 30 §2).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \
        python benchmarks/bench_startup.py [--repeat 7] [--import sklearn.base] \
        [--command "encode --store S --input X --method hrp --name Y --force"] \
        [--first-result [--cold-repeat 3]]

Run it from the checkout to time: ``python -m featpipe`` imports featpipe from the current
folder first (the first line says which featpipe was timed).  Each line is the median over
``--repeat`` fresh processes of the wall time and of the CPU time (user + system) of the
process; on a loaded machine the CPU time is the steadier one.  The load average is printed
before and after.  The goal (issue 26): ``--help`` under 0.3 s on a quiet machine.
``--import MODULE`` adds ``python -c "import MODULE"`` as a reference, ``--command`` a full
command line (e.g. an encode with ``--force``, so that every run computes).

``--first-result`` makes two stores of 300 × 512 float32 sequences (ten and two items) and
prints, with the command line of each, min and median wall and CPU seconds of:
``featpipe encode --method hrp`` of the ten with an empty numba cache (cold: a new
``NUMBA_CACHE_DIR`` per run, ``--cold-repeat`` runs) and with the cache that run filled
(warm); the fixed cost of a run, a 2-item encode with ``avg`` and with ``hrp`` (warm); and
``python -m featpipe.compiled`` (compiling every kernel ahead, once, as set-up does) with an
empty and with a warm cache.  The goals
(issue 30): a 2-item encode ≤ 0.7 s (avg) and ≤ 1.0 s (hrp) on a quiet machine; the first
use of a kernel ≤ 2 s above a warm run, or paid once by ``python -m featpipe.compiled``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: every command and subcommand of ``featpipe``, as argument lists
LIST_COMMANDS = """
import json, click
import featpipe
from featpipe.cli import cli
ctx = click.Context(cli)
paths = [[]]
for name in cli.list_commands(ctx):
    paths.append([name])
    command = cli.get_command(ctx, name)
    if isinstance(command, click.Group):
        paths += [[name, sub] for sub in command.list_commands(ctx)]
print(json.dumps({"featpipe": featpipe.__file__, "paths": paths}))
"""


def _one_run(args: list[str], env: dict | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one process running ``args``."""
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=None if env is None else {**os.environ, **env})
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(args)} exited {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def _medians(args: list[str], repeat: int) -> tuple[float, float]:
    runs = [_one_run(args) for _ in range(repeat)]
    return (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))


def _blas() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}"
                     for i in threadpool_info() if i["user_api"] == "blas") or "none loaded"


def _store(folder: Path, n: int) -> Path:
    """A store of ``n`` non-negative 300 × 512 float32 sequences (like ReLU features), as
    stage ``fc6``."""
    import numpy as np

    rng = np.random.default_rng(0)
    (folder / "npy").mkdir(parents=True)
    rows = ["id,path,label,split1"]
    for i in range(n):
        X = np.maximum(np.cumsum(rng.standard_normal((300, 512)), axis=0), 0) / np.sqrt(300)
        np.save(folder / "npy" / f"v{i}.npy", X.astype(np.float32))
        rows.append(f"v{i},npy/v{i}.npy,{'ab'[i % 2]},train")
    (folder / "m.csv").write_text("\n".join(rows) + "\n")
    subprocess.run([sys.executable, "-m", "featpipe", "import", "--manifest", folder / "m.csv",
                    "--from", folder / "npy", "-s", folder / "S", "--name", "fc6", "-q"],
                   check=True, stdout=subprocess.DEVNULL)
    return folder / "S"


def _row(label: str, runs: list[tuple[float, float]], command: str) -> None:
    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
    print(f"{label:34s} {min(walls):6.2f} {statistics.median(walls):6.2f}   "
          f"{min(cpus):6.2f} {statistics.median(cpus):6.2f}   {len(runs)}x  {command}")


def first_result(repeat: int, cold_repeat: int) -> None:
    """Issue 30 §2: cold and warm hrp on ten sequences, the fixed cost of a 2-item encode."""
    root = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    ten, two = _store(root / "ten", 10), _store(root / "two", 2)
    featpipe = [sys.executable, "-m", "featpipe"]

    def encode(store, method):
        return [*featpipe, "encode", "-s", str(store), "-i", "fc6", "-m", method, "--name",
                method, "--force", "-q"]

    shown = {"hrp10": f"featpipe encode -s {ten} -i fc6 -m hrp --name hrp --force -q",
             "avg2": f"featpipe encode -s {two} -i fc6 -m avg --name avg --force -q",
             "hrp2": f"featpipe encode -s {two} -i fc6 -m hrp --name hrp --force -q"}
    print(f"\ntime to the first result (issue 30 §2); load average {os.getloadavg()[0]:.2f}")
    print(f"{'':34s} {'wall min':>8s} {'med':>6s} {'cpu min':>8s} {'med':>6s}")
    cold = []
    for i in range(cold_repeat):
        cache = root / f"numba-cold-{i}"  # empty: every kernel this run needs compiles
        cold.append(_one_run(encode(ten, "hrp"), {"NUMBA_CACHE_DIR": str(cache)}))
    _row("hrp, 10 items, empty numba cache", cold,
         "NUMBA_CACHE_DIR=<empty folder> " + shown["hrp10"])
    warm_env = {"NUMBA_CACHE_DIR": str(root / "numba")}  # filled once, ahead, as set-up does
    _row("compile every kernel, empty cache",
         [_one_run([sys.executable, "-m", "featpipe.compiled"], warm_env)],
         "NUMBA_CACHE_DIR=<empty folder> python -m featpipe.compiled")
    _row("hrp, 10 items, warm numba cache", [_one_run(encode(ten, "hrp"), warm_env)
                                             for _ in range(repeat)], shown["hrp10"])
    _row("avg, 2 items (fixed cost)", [_one_run(encode(two, "avg"), warm_env)
                                       for _ in range(repeat)], shown["avg2"])
    _row("hrp, 2 items (fixed cost, warm)", [_one_run(encode(two, "hrp"), warm_env)
                                             for _ in range(repeat)], shown["hrp2"])
    _row("compile every kernel, warm cache",
         [_one_run([sys.executable, "-m", "featpipe.compiled"], warm_env)
          for _ in range(repeat)], "python -m featpipe.compiled")
    _row("python -c 'import numpy'", [_one_run([sys.executable, "-c", "import numpy"])
                                      for _ in range(repeat)], "python -c 'import numpy'")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--import", dest="modules", action="append", default=[],
                        help="A module whose import to time as a reference (repeatable).")
    parser.add_argument("--command", action="append", default=[],
                        help="A full featpipe command line to time as well (repeatable).")
    parser.add_argument("--first-result", action="store_true",
                        help="Also time cold and warm encodes (issue 30 §2).")
    parser.add_argument("--cold-repeat", type=int, default=3,
                        help="Runs with an empty numba cache (each compiles, ~10 s).")
    parser.add_argument("--no-help", action="store_true",
                        help="Skip the --help rows (with --first-result).")
    args = parser.parse_args()
    python = [sys.executable]
    found = json.loads(subprocess.run(python + ["-c", LIST_COMMANDS], check=True,
                                      capture_output=True, text=True).stdout)
    import numpy  # noqa: F401  (for the BLAS line only; the timed processes are fresh)

    print(f"featpipe: {found['featpipe']}")
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; BLAS: {_blas()}")
    print(f"{'':40s} {'wall':>7s} {'cpu':>7s}  cpu above python")
    bare_wall, bare_cpu = _medians(python + ["-c", "pass"], args.repeat)
    rows = [("python -c pass", ["-c", "pass"])]
    rows += [(f"python -c 'import {module}'", ["-c", f"import {module}"])
             for module in ["numpy", *args.modules]]
    rows += [(" ".join(["featpipe", *path, "--help"]), ["-m", "featpipe", *path, "--help"])
             for path in ([] if args.no_help else found["paths"])]
    rows += [(f"featpipe {line}", ["-m", "featpipe", *shlex.split(line)])
             for line in args.command]
    for label, argv in rows:
        wall, cpu = (bare_wall, bare_cpu) if argv == ["-c", "pass"] else \
            _medians(python + argv, args.repeat)
        print(f"{label[:40]:40s} {wall:6.3f}s {cpu:6.3f}s  +{cpu - bare_cpu:.3f} s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.first_result:
        first_result(args.repeat, args.cold_repeat)


if __name__ == "__main__":
    main()
