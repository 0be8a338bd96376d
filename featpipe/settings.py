"""Settings read from the environment: one parser per variable, all checked when a command
starts.

``FEATPIPE_THREADS`` (an integer >= 1), ``FEATPIPE_MEMORY`` (a size in bytes, or a number with
K, M, G or T; binary units) and ``FEATPIPE_PROGRESS_INTERVAL`` (seconds >= 0) are read where
they are used (:func:`featpipe.backend.worker_threads`, :func:`featpipe.backend.memory_budget`,
the progress display), which may be late or never; :func:`check_environment` reads them all
once, so the command line turns a bad value into a usage error (exit 2) before any stage
exists, whatever the command.  Each parser returns ``None`` when its variable is unset or
empty.  Plugin modules (``FEATPIPE_ENCODERS``, ``FEATPIPE_FEATURES``) are imported when their
methods are needed (:func:`plugin_attribute`), with the same kind of error.
"""

from __future__ import annotations

import importlib
import math
import os

from featpipe.errors import FeatpipeError

#: Environment variable that sets :func:`featpipe.backend.worker_threads`.
THREADS_ENV = "FEATPIPE_THREADS"
#: Environment variable that sets :func:`featpipe.backend.memory_budget`.
MEMORY_ENV = "FEATPIPE_MEMORY"
#: Environment variable that sets the seconds between plain progress lines.
PROGRESS_ENV = "FEATPIPE_PROGRESS_INTERVAL"
#: Set to 1 by ``featpipe submit`` for its check of the stage command on the submitting
#: machine: what depends on the node (a GPU for ``--device cuda``, the cores for ``--jobs``)
#: is checked where the task runs, not there (:func:`node_checks_deferred`).
NODE_CHECKS_ENV = "FEATPIPE_DEFER_NODE_CHECKS"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class SettingError(FeatpipeError):
    """An environment variable holds a value featpipe cannot use; the message names the
    variable, says what it accepts and shows the value (a usage error on the command line)."""


def _value(variable: str) -> str | None:
    value = os.environ.get(variable, "").strip()
    return value or None


def threads_setting() -> int | None:
    """``FEATPIPE_THREADS`` as an integer >= 1."""
    value = _value(THREADS_ENV)
    if value is None:
        return None
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise SettingError(f"{THREADS_ENV} must be an integer >= 1, got {value!r}")
    return threads


def memory_setting() -> int | None:
    """``FEATPIPE_MEMORY`` in bytes: a finite size >= 1 byte (``268435456``, ``512M``,
    ``4GiB``)."""
    value = _value(MEMORY_ENV)
    if value is None:
        return None
    text = value.upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    try:
        size = float(text[:len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        size = 0.0
    if not (math.isfinite(size) and size >= 1):
        raise SettingError(f"{MEMORY_ENV} must be a size such as 268435456, 512M or 4G, "
                           f"got {value!r}")
    return int(size)


def progress_interval_setting() -> float | None:
    """``FEATPIPE_PROGRESS_INTERVAL`` in seconds: a finite number >= 0."""
    value = _value(PROGRESS_ENV)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise SettingError(f"{PROGRESS_ENV} must be a number of seconds >= 0, got {value!r}")
    return seconds


def node_checks_deferred() -> bool:
    """Whether this process checks a command for another machine (``NODE_CHECKS_ENV``)."""
    return _value(NODE_CHECKS_ENV) == "1"


def plugin_attribute(module_name: str, variable: str, attribute: str):
    """``attribute`` of plugin module ``module_name`` (named by ``variable`` or an entry
    point): a module that cannot be imported or lacks ``attribute`` is a
    :class:`SettingError` naming it, not a traceback."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SettingError(f"{variable} (or an entry point) must name importable modules, got "
                           f"{module_name!r} ({err})") from None
    if not hasattr(module, attribute):
        raise SettingError(f"{variable} (or an entry point) must name modules that define "
                           f"{attribute}, got {module_name!r}")
    return getattr(module, attribute)


def plugin_modules(group: str, variable: str) -> list[str]:
    """The plugin modules of a registry: entry points of ``group``, then the comma-separated
    module names of environment variable ``variable``."""
    from importlib import metadata

    names = [ep.value for ep in metadata.entry_points(group=group)]
    names += [n.strip() for n in os.environ.get(variable, "").split(",") if n.strip()]
    return names


def registry(found, kind: str) -> dict:
    """Methods by name from ``(module name, methods)`` pairs, in order; a name registered
    twice is an error naming the module that registered it again (``kind``: what they are)."""
    methods: dict = {}
    for module_name, module_methods in found:
        for method in module_methods:
            if method.name in methods:
                raise RuntimeError(f"{kind} {method.name!r} is registered twice (again by "
                                   f"{module_name})")
            methods[method.name] = method
    return methods


def check_environment() -> None:
    """Read every setting once: raise :class:`SettingError` for the first bad one."""
    threads_setting()
    memory_setting()
    progress_interval_setting()
