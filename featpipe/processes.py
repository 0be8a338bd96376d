"""The Python processes featpipe starts import the featpipe this process imported.

A new interpreter puts the folder it starts in first on its import path (``python -c``,
``python -m``), so a folder named ``featpipe`` there would be imported instead of featpipe:
an empty one (an implicit namespace package, which shadows an editable install's finder:
``cannot import name 'FORMAT_VERSION' from 'featpipe' (unknown location)``), the clone
itself seen from its parent, or another package.  Every process featpipe starts (the
decoding workers, SLURM array tasks and their report job, ``submit``'s check and its dask
command) therefore runs as :func:`python_command` gives it: ``-P`` (Python 3.11,
``sys.flags.safe_path``) leaves that folder out, and :func:`child_environment` hands down
:func:`import_path`: this process's ``sys.path`` in its order (plugins import as they do
here), with the folder holding featpipe's package first when it is not on it (an editable
install's finder, a zip).  Where it is on it, its place is kept: moving it first would put
site-packages before the user's own PYTHONPATH.  loky's workers need nothing: loky hands
them this process's ``sys.path`` itself (``joblib/externals/loky/backend/spawn.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path


def featpipe_folder() -> str:
    """The folder that holds the ``featpipe`` package this process imported."""
    import featpipe

    return str(Path(featpipe.__file__).resolve().parent.parent)


def import_path() -> str:
    """PYTHONPATH for a child process: this process's import path (module docstring)."""
    entries = [os.path.abspath(p) for p in sys.path if p]
    own = featpipe_folder()
    if own not in {os.path.realpath(p) for p in entries}:
        entries.insert(0, own)
    return os.pathsep.join(dict.fromkeys(entries))


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with PYTHONPATH = :func:`import_path`."""
    return {**(os.environ if base is None else base), "PYTHONPATH": import_path()}


def python_command(*args: str) -> list[str]:
    """``[this Python, -P, *args]``: a child that does not import from its working folder."""
    return [sys.executable, "-P", *args]


def featpipe_command() -> list[str]:
    """``python -P -m featpipe``: featpipe's command line in a child process."""
    return python_command("-m", "featpipe")
