"""Startup time of the command line: ``featpipe --help`` and the ``--help`` of every command
against ``python -c pass`` (the interpreter alone) and ``python -c "import numpy"``, measured
in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \
        python benchmarks/bench_startup.py [--repeat 7] [--import sklearn.base] \
        [--command "encode --store S --input X --method hrp --name Y --force"]

Run it from the checkout to time: ``python -m featpipe`` imports featpipe from the current
folder first (the first line says which featpipe was timed).  Each line is the median over
``--repeat`` fresh processes of the wall time and of the CPU time (user + system) of the
process; on a loaded machine the CPU time is the steadier one.  The load average is printed
before and after.  The goal (issue 26): ``--help`` under 0.3 s on a quiet machine.
``--import MODULE`` adds ``python -c "import MODULE"`` as a reference, ``--command`` a full
command line (e.g. an encode with ``--force``, so that every run computes).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

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


def _one_run(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one process running ``args``."""
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--import", dest="modules", action="append", default=[],
                        help="A module whose import to time as a reference (repeatable).")
    parser.add_argument("--command", action="append", default=[],
                        help="A full featpipe command line to time as well (repeatable).")
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
             for path in found["paths"]]
    rows += [(f"featpipe {line}", ["-m", "featpipe", *shlex.split(line)])
             for line in args.command]
    for label, argv in rows:
        wall, cpu = (bare_wall, bare_cpu) if argv == ["-c", "pass"] else \
            _medians(python + argv, args.repeat)
        print(f"{label[:40]:40s} {wall:6.3f}s {cpu:6.3f}s  +{cpu - bare_cpu:.3f} s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
