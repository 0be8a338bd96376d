"""Every code block of README.md and docs/*.md runs as written (issue 40): one test per page,
its blocks in order in a fresh folder, with the markers and languages of
:mod:`tests._docs_blocks`; and the runner itself refuses what it cannot take."""

from __future__ import annotations

import re

import pytest

from tests import _docs_blocks as docs


@pytest.mark.parametrize("page", docs.PAGES)
def test_every_block_of_the_page_runs_as_written(page):
    run = docs.page_run(page)
    assert run.failure is None, run.failure
    blocks = docs.page_blocks(page)
    assert len(run.runs) == len(blocks)
    for item in run.runs:  # what runs is exactly what is neither skipped, a file nor shown
        expected = item.block.skip is None and item.block.file is None and \
            item.block.language not in docs.DATA | docs.OUTPUT
        assert item.ran == expected, item.block.where


def test_a_page_runs_at_least_one_block_unless_it_has_none():
    """A page of only skipped blocks would test nothing: each page with runnable code runs
    some of it (docs/cli.md and docs/methods.md show output and formulas only)."""
    for page in docs.PAGES:
        blocks = docs.page_blocks(page)
        code = [b for b in blocks if b.language in docs.SHELL | {"python"}]
        if code:
            assert any(b.skip is None and b.file is None for b in code), page


def _parse(text: str) -> list[docs.Block]:
    return docs.parse(text, "page.md")


def test_markers_languages_and_stand_ins_are_read_and_checked():
    page = ("The tests run it with `random:0` weights and `--frames 2`.\n\n"
            "<!-- docs-test: skip needs a cluster -->\n```bash\nsbatch x\n```\n\n"
            "<!-- docs-test: file conf/p.toml -->\n```toml\na = 1\n```\n\n"
            "<!-- docs-test: replace vgg.pth => random:0 -->\n"
            "<!-- docs-test: replace --fps 5 => --frames 2 -->\n"
            "```bash\nfeatpipe extract --weights vgg.pth --fps 5\n```\n\n"
            "- item\n\n  ```python\n  x = 1\n  ```\n\n```text\noutput\n```\n")
    skip, data, stand_in, indented, output = _parse(page)
    assert (skip.skip, skip.line) == ("needs a cluster", 4)
    assert data.file == "conf/p.toml" and data.text == "a = 1\n"
    assert stand_in.runnable_text() == "featpipe extract --weights random:0 --frames 2\n"
    assert indented.language == "python" and indented.text == "x = 1\n"
    assert output.language == "text"


@pytest.mark.parametrize("text, message", [
    ("<!-- docs-test: skip -->\n```bash\nx\n```\n", "needs a reason"),
    ("```\nfeatpipe x\n```\n", "block language '(none)'"),
    ("```c\nint x;\n```\n", "block language 'c'"),
    ("<!-- docs-test: replace a => b -->\n```bash\nc\n```\n", "not in the block"),
    ("<!-- docs-test: replace a => hidden -->\n```bash\na\n```\n", "must name the stand-in"),
    ("<!-- docs-test: file /etc/x -->\n```toml\na\n```\n", "relative file name"),
    ("<!-- docs-test: run -->\n```bash\na\n```\n", "unknown marker"),
    ("```bash\nnever closed\n", "never closed"),
])
def test_the_runner_refuses_what_it_cannot_take(text, message):
    with pytest.raises(docs.DocsError, match=re.escape(message)):
        _parse(text)


def test_a_failing_block_stops_its_page_and_names_its_line(tmp_path, monkeypatch):
    page = tmp_path / "bad.md"
    page.write_text("```bash\necho made > made.txt\n```\n\n```python\n"
                    "assert open('made.txt').read() == 'made\\n'\nvalue = 41\n```\n\n"
                    "```python\nassert value == 42, value\n```\n\n```bash\ntouch never\n```\n",
                    encoding="utf-8")
    monkeypatch.setattr(docs, "REPO", tmp_path)
    run = docs.run_page("bad.md", tmp_path / "run")
    assert [r.ran for r in run.runs] == [True, True]
    assert run.failure.startswith("bad.md:10: the python block raised AssertionError: 41")
    assert not (tmp_path / "run" / "never").exists()


def test_featpipe_in_shell_blocks_is_this_checkout(tmp_path):
    env = docs.environment(docs.featpipe_bin(tmp_path / "bin"))
    block = docs.Block("p.md", 1, "bash", "featpipe --version\n"
                       "python -c 'import featpipe; print(featpipe.__file__)'\n")
    run = docs.run_block(block, tmp_path, env, {})
    assert run.stdout.startswith("featpipe, version ")
    assert run.stdout.splitlines()[1] == str(docs.REPO / "featpipe" / "__init__.py")


def test_a_console_block_runs_its_prompt_lines_only(tmp_path):
    env = docs.environment(docs.featpipe_bin(tmp_path / "bin"))
    block = docs.Block("p.md", 1, "console", "$ echo one > out.txt\nsome output, not run\n"
                       "$ echo two >> out.txt\n")
    assert docs.run_block(block, tmp_path, env, {}).ran
    assert (tmp_path / "out.txt").read_text() == "one\ntwo\n"
