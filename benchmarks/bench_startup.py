"""Startup time of the command line: ``featpipe --help`` and each command's ``--help`` against
``python -c pass`` (the interpreter alone) and ``python -c "import numpy"``, measured in the
same run; the median of ``--repeat`` fresh processes each.

    python benchmarks/bench_startup.py [--repeat 7]

Prints one line per command: the median wall time, and the time above the bare interpreter.
The goal (issue 26): ``--help`` under 0.3 s on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [[], ["encode"], ["extract"], ["fit", "gmm"], ["classify"], ["run"], ["cache"]]


def _median_seconds(args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    python = [sys.executable]
    bare = _median_seconds(python + ["-c", "pass"], repeat)
    numpy = _median_seconds(python + ["-c", "import numpy"], repeat)
    print(f"python -c pass            {bare:6.3f} s")
    print(f"python -c 'import numpy'  {numpy:6.3f} s  (+{numpy - bare:.3f} s)")
    for command in COMMANDS:
        seconds = _median_seconds(python + ["-m", "featpipe", *command, "--help"], repeat)
        label = " ".join(["featpipe", *command, "--help"])
        print(f"{label:25s} {seconds:6.3f} s  (+{seconds - bare:.3f} s over python, "
              f"{seconds / bare:.1f}x)")


if __name__ == "__main__":
    main()
