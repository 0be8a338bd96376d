"""What ``bin/demo`` and ``bin/test`` must install into the running Python, as pip arguments.

``python bin/missing.py EXTRA...`` prints pip arguments, one per line (the scripts hand each
line to pip as one argument): ``--editable`` and ``.[EXTRA,...]`` when featpipe is not
installed (the checkout, with those extras), else the requirements of those extras (read from
pyproject.toml, nested extras such as ``all`` expanded) whose distribution is missing; nothing
when everything is there.  An installed featpipe is never replaced.

``python bin/missing.py --torch EXTRA...`` prints the torch install that comes first: when
the extras ask for torchvision (``vision``, in ``all``) and it does not import, the torch and
torchvision pair that import together on this machine (:data:`TORCH_PAIRS`: torchvision's
wheels do not import beside the CPU torch 2.13.0); else, when torch does not import, CPU
torch (``torch==2.13.0``).  ``FEATPIPE_TORCHVISION=0`` leaves torchvision out (and the
``vision`` extra with it): the torchvision feature's tests then skip.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: CPU torch (a file on these machines' disks), for installs without torchvision
CPU_TORCH = "torch==2.13.0"
#: torch and torchvision releases that import together, by `uname -m` (x86_64: CUDA builds
#: that run on the CPU, about 5.5 GB; aarch64: CPU builds, about 0.7 GB)
TORCH_PAIRS = {"x86_64": ["torch==2.14.1", "torchvision==0.29.1"],
               "aarch64": ["torch==2.9.1", "torchvision==0.24.1"]}


def extra_requirements(extras: list[str], optional: dict[str, list[str]]) -> list[str]:
    """The requirement strings of ``extras``; ``featpipe[a,b]`` entries are expanded."""
    found: list[str] = []
    for extra in extras:
        for requirement in optional[extra]:
            nested = re.fullmatch(r"featpipe\[([^\]]+)\]", requirement.strip())
            if nested:
                found += extra_requirements(nested.group(1).split(","), optional)
            elif requirement not in found:
                found.append(requirement)
    return list(dict.fromkeys(found))


def distribution(requirement: str) -> str:
    """``scikit-video>=1.1.11`` -> ``scikit-video``."""
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0)


def installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def optional_dependencies() -> dict[str, list[str]]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]


def without_torchvision(extras: list[str], optional: dict[str, list[str]]) -> list[str]:
    """``extras`` with nested extras expanded and those that bring torchvision left out."""
    found: list[str] = []
    for extra in extras:
        nested = [re.fullmatch(r"featpipe\[([^\]]+)\]", r.strip()) for r in optional[extra]]
        if any(nested):
            found += without_torchvision([n for m in nested if m for n in m.group(1).split(",")],
                                         optional)
        elif "torchvision" not in map(distribution, optional[extra]):
            found.append(extra)
    return list(dict.fromkeys(found))


def wants_torchvision(extras: list[str], optional: dict[str, list[str]]) -> bool:
    """Whether ``extras`` bring torchvision (and ``FEATPIPE_TORCHVISION`` is not 0)."""
    return os.environ.get("FEATPIPE_TORCHVISION", "1") != "0" and "torchvision" in map(
        distribution, extra_requirements(extras, optional))


def imports(module: str) -> bool:
    """Whether ``module`` imports in this Python (in a child: a failed torchvision import
    can leave torch half-loaded)."""
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          check=False).returncode == 0


def torch_install(extras: list[str], machine: str | None = None, imports=imports) -> list[str]:
    """pip arguments installing torch (and torchvision) for ``extras``; none when they
    import already."""
    if wants_torchvision(extras, optional_dependencies()):
        if imports("torchvision"):
            return []
        machine = machine or platform.machine()
        return TORCH_PAIRS.get(machine, ["torch", "torchvision"])
    return [] if imports("torch") else [CPU_TORCH]


def missing(extras: list[str], is_installed=installed) -> list[str]:
    """pip arguments that complete the running environment for ``extras``."""
    optional = optional_dependencies()
    if not wants_torchvision(extras, optional):
        extras = without_torchvision(extras, optional)
    if not is_installed("featpipe"):
        return ["--editable", f".[{','.join(extras)}]"]
    return [r for r in extra_requirements(extras, optional) if not is_installed(distribution(r))]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torch"]:
        print("\n".join(torch_install(sys.argv[2:])))
    else:
        print("\n".join(missing(sys.argv[1:])))
