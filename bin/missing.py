"""What ``bin/demo`` and ``bin/test`` must install into the running Python, as pip arguments.

``python bin/missing.py EXTRA...`` prints pip arguments, one per line (the scripts hand each
line to pip as one argument): ``--editable`` and ``.[EXTRA,...]`` when featpipe is not
installed (the checkout, with those extras), else the requirements of those extras (read from
pyproject.toml, nested extras such as ``all`` expanded) whose distribution is missing; nothing
when everything is there.  An installed featpipe is never replaced.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


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


def missing(extras: list[str], is_installed=installed) -> list[str]:
    """pip arguments that complete the running environment for ``extras``."""
    if not is_installed("featpipe"):
        return ["--editable", f".[{','.join(extras)}]"]
    optional = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    return [r for r in extra_requirements(extras, optional) if not is_installed(distribution(r))]


if __name__ == "__main__":
    for argument in missing(sys.argv[1:]):
        print(argument)
