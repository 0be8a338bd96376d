"""The documentation: README.md is a front page, docs/cli.md is what the commands say, and every
link between the documents reaches a file (and a heading) of the repository."""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

DOCUMENTS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md")),
             REPO / "benchmarks" / "RESULTS.md",
             *sorted((REPO / "benchmarks" / "results").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_cli_md_is_generated_from_the_commands():
    env = {k: v for k, v in os.environ.items() if k != "FEATPIPE_ENCODERS"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    fresh = subprocess.run([sys.executable, "-m", "featpipe.cli.docgen"], capture_output=True,
                           text=True, env=env, check=True).stdout
    committed = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == fresh, ("docs/cli.md is stale: regenerate it with "
                                "python -m featpipe.cli.docgen > docs/cli.md")
    for command in ("encode", "extract", "classify", "fit gmm", "cache ls", "example pipeline"):
        assert f"## `featpipe {command}`" in fresh


def test_every_link_reaches_a_file_and_heading_of_the_repository():
    checked = 0
    for document in DOCUMENTS:
        for target in LINK.findall(document.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            path = (document.parent / file).resolve() if file else document
            assert path.exists() and REPO in path.parents, f"{document.name}: {target}"
            if anchor:
                assert anchor in anchors(path), f"{document.name}: no heading for {target}"
            checked += 1
    assert checked > 20
    # design notes that live outside the repository: neither the documents nor the docstrings
    for document in [*DOCUMENTS, *sorted((REPO / "featpipe").rglob("*.py"))]:
        assert not re.search(r"\b(DESIGN|FISHER|STYLE)\.md", document.read_text("utf-8")), \
            document.name


def test_every_cited_repository_path_and_test_exists():
    """A path of the repository in backticks (`bin/demo`, `tests/test_x.py::test_y`) names a
    file that exists, and a test that file defines; patterns (`*`, `<topic>`) are not paths."""
    cited = re.compile(r"`((?:bin|tests|benchmarks|docs|featpipe|manifests|examples)/[^`\s]+)`")
    checked = 0
    for document in DOCUMENTS:
        for path in cited.findall(document.read_text(encoding="utf-8")):
            if re.search(r"[*<{]", path):
                continue
            file, _, test = path.partition("::")
            assert (REPO / file).exists(), f"{document.name}: {path}"
            if test:
                assert f"def {test}(" in (REPO / file).read_text("utf-8"), \
                    f"{document.name}: {path}"
            checked += 1
    assert checked > 50



def test_every_documented_import_and_dotted_name_resolves():
    """Every ``from featpipe... import ...`` line of README, CONTRIBUTING and docs/ runs, and
    every `featpipe.a.b` in backticks is a module or an attribute of one (or a plugin entry
    point group); tests/test_nn.py checks featpipe.nn's lines in detail."""
    import importlib

    from featpipe.encode.registry import ENTRY_POINT_GROUP as ENCODERS
    from featpipe.extract.features import ENTRY_POINT_GROUP as FEATURES

    lines, names = set(), set()
    for document in [REPO / "README.md", REPO / "CONTRIBUTING.md",
                     *sorted((REPO / "docs").glob("*.md"))]:
        text = document.read_text(encoding="utf-8")
        lines |= {m.strip().rstrip("\\") for m in re.findall(
            r"^\s*(from featpipe\S* import [^\n`#]+|import featpipe\S*)", text, re.M)}
        names |= set(re.findall(r"`(featpipe(?:\.\w+)+)", text)) - {ENCODERS, FEATURES}
    assert len(lines) >= 5 and len(names) >= 15
    for line in sorted(lines):
        exec(line, {})  # noqa: S102 - the documented import itself
    for name in sorted(names):
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:n]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[n:]:
                assert hasattr(found, attribute), name
                found = getattr(found, attribute)
            break


def test_readme_is_a_front_page():
    """What a reader sees (the runner's markers, HTML comments, left out) is a front page."""
    readme = re.sub(r"^<!--.*?-->\n", "", (REPO / "README.md").read_text(encoding="utf-8"),
                    flags=re.M)
    assert readme.startswith("# featpipe\n\n```bash\nbin/demo    # runs the main job end to end "
                             "on built-in real data\nbin/test    # runs the test suite\n```\n")
    assert len(readme.splitlines()) <= 220
    for doc in ("cli", "encoders", "extraction", "store", "cluster", "python-api"):
        assert f"](docs/{doc}.md)" in readme
    assert "](benchmarks/RESULTS.md)" in readme
    # issue 23's new commands and options are on the front page
    for shown in ("`cache refs --store S NAME`", "`cache rm --store S NAME [--dry-run]`",
                  "`cache ls [--wide]", "[--log-file PATH]", "[--transpose]", ".mat"):
        assert shown in readme, shown
