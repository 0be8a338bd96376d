"""Shared fixtures: a temporary store, and running the CLI in a subprocess or in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


def run_cli(*args, check=True, env=None, cwd=None, timeout=600):
    """Run ``python -m featpipe ARGS`` in a subprocess (real exit codes, real processes)."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get(
        "PYTHONPATH", ""), **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "featpipe", *map(str, args)],
                          capture_output=True, text=True, env=full_env, cwd=cwd,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"featpipe {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def object_npy_bytes() -> bytes:
    """A ``.npy`` file that declares an object array (dtype ``|O``), written without the
    pickle module: a real header, then the bytes of a pickled ``None`` (a reader that
    unpickled would succeed), for the readers that must refuse it."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    return buffer.getvalue() + b"\x80\x04N."


def one_line_error(proc, code=1) -> str:
    """The single ``error:`` line of a failed ``run_cli`` process or ``cli`` result (exit
    ``code``, no traceback)."""
    status = proc.returncode if hasattr(proc, "returncode") else proc.exit_code
    assert status == code, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def invoke_cli(*args, check=False, env=None):
    """Run ``featpipe ARGS`` in this process (click's CliRunner) -> click Result (exit_code,
    stdout, stderr, output: both interleaved); ``check=True`` fails on a non-zero exit, as
    ``run_cli`` does; ``env`` is set for the call only (not for what reads it at start-up).
    Use it unless the process itself is what the test checks."""
    from featpipe.cli import cli as group

    result = CliRunner().invoke(group, [str(a) for a in args], env=env, catch_exceptions=False)
    if check and result.exit_code != 0:
        raise AssertionError(f"featpipe {' '.join(map(str, args))} exited {result.exit_code}\n"
                             f"{result.output}")
    return result


@pytest.fixture
def cli():
    """:func:`invoke_cli`: ``cli('encode', ...)`` -> click Result."""
    return invoke_cli
