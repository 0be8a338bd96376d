"""The README's demo tables against a demo report: ``python -m tests._readme_tables
[--quick] REPORT.md`` (what .ci/run calls after ``bin/demo``) prints each table that differs
and exits 1; ``tests/cli/test_demo.py`` asserts the same for the quick run through
:func:`differences`.

The README shows each table as the demo prints it (:func:`featpipe.demo.report.printed`): the
task's title, a blank line, the table; the full run's under "## The demo", the quick run's
under "### Quick run", which may refer to a full-run table the quick run prints alike
(BasicMotions: the same data in both runs).
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
#: the tables of `bin/demo` (a full run) that the README states
FULL_TABLES = ("GunPoint (aeon, real sequences)", "BasicMotions (aeon, real sequences)",
               "Rendered motion, dense SIFT 4x4 grid",
               "Rendered motion, VGG-16 fc6 (seeded random weights)")
#: the tables of `bin/demo --quick` that the README states
QUICK_TABLES = ("BasicMotions (aeon, real sequences)", "Rendered motion, dense SIFT 4x4 grid")


def readme_section(readme: str, quick: bool) -> str:
    """The README's text for the full run (the demo's section up to the quick run), or for
    the quick run (the whole demo section: its own tables and the full run's)."""
    demo = readme.split("\n## The demo", 1)[1].split("\n## ", 1)[0]
    return demo if quick else demo.partition("\n### Quick run")[0]


def differences(report: str, readme: str | None = None, quick: bool = True) -> list[str]:
    """One message per table of ``report`` (the demo's report.md) that the README's section
    for that run does not show as the demo prints it."""
    readme = README.read_text(encoding="utf-8") if readme is None else readme
    section = readme_section(readme, quick)
    found = []
    for title in QUICK_TABLES if quick else FULL_TABLES:
        if f"## {title}" not in report:
            found.append(f"{title}: not in the report")
            continue
        printed = report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
        table = "\n".join(line for line in printed.splitlines() if line.startswith("|"))
        if f"{title}\n\n{table}\n" not in section:
            found.append(f"{title}: the demo printed\n{table}\nwhich README.md's "
                         f"{'quick' if quick else 'full'} run does not show")
    return found


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    path = next(a for a in sys.argv[1:] if a != "--quick")
    problems = differences(Path(path).read_text(encoding="utf-8"), quick=quick)
    tables = QUICK_TABLES if quick else FULL_TABLES
    print("\n".join(problems) or f"the README's {'quick' if quick else 'full'}-run tables "
                                 f"({len(tables)}) match")
    sys.exit(1 if problems else 0)
