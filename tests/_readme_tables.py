"""The README's quick-demo tables against a report: ``python -m tests._readme_tables
REPORT.md`` (what .ci/run calls after ``bin/demo --quick``) prints each table that differs and
exits 1; ``tests/cli/test_demo.py`` asserts the same through :func:`differences`."""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
#: the tables of `bin/demo --quick` that the README states
QUICK_TABLES = ("BasicMotions (aeon, real sequences)", "Rendered motion, dense SIFT 4x4 grid")


def differences(report: str, readme: str | None = None) -> list[str]:
    """One message per quick table of ``report`` (the demo's report.md) that the README's
    "Quick run" section does not show line for line."""
    readme = README.read_text(encoding="utf-8") if readme is None else readme
    quick = readme.split("bin/demo --quick", 1)[1].split("\n## ", 1)[0]
    found = []
    for title in QUICK_TABLES:
        printed = report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
        table = "\n".join(line for line in printed.splitlines() if line.startswith("|"))
        if f"{title}\n\n{table}\n" not in quick:
            found.append(f"{title}: the demo printed\n{table}\nwhich README.md's quick run "
                         "does not show")
    return found


if __name__ == "__main__":
    problems = differences(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print("\n".join(problems) or f"the README's quick tables ({len(QUICK_TABLES)}) match")
    sys.exit(1 if problems else 0)
