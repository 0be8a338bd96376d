"""The code blocks of README.md and docs/*.md, and how the test suite runs them
(``tests/cli/test_docs_run.py``; CONTRIBUTING.md, "Documentation", is the authors' guide).

Each page runs in a fresh folder of its own, its blocks in order, so a block may use what the
blocks above it made (files, a store, Python names).  A block's language says what it is:

- ``bash`` (also ``sh``, ``shell``): run by ``bash -e -o pipefail`` in the page's folder, with a
  ``featpipe`` first on ``PATH`` that is the test's interpreter running this checkout's featpipe
  (and ``python``, that interpreter);
  ``console``: its lines starting with ``$ `` are run so, the others are output (not compared);
- ``python``: run in the test's process, in one namespace per page, from the page's folder;
- ``text``: output, a diagram or a synopsis: never run;
- data (``toml``, ``csv``, ``json``, ``ini``, ``yaml``): written to a file with a ``file``
  marker, else only shown;
- any other language, or none: an error (say what the block is).

Markers are HTML comments on the lines right above a block's opening fence (invisible on the
rendered page):

- ``<!-- docs-test: skip REASON -->``: not run; a marker without a reason is an error;
- ``<!-- docs-test: file NAME -->``: the block is written to NAME (relative to the page's
  folder), not run;
- ``<!-- docs-test: replace OLD => NEW -->``: run with NEW in place of OLD (a stand-in, e.g.
  seeded random weights for a checkpoint); OLD must occur in the block and NEW must be named in
  the page's visible text, so a reader learns what the tests ran.  Several may stack.
- ``<!-- docs-test: requires MODULE -->``: run only where MODULE imports (an optional
  install, e.g. torchvision, which ``bin/test`` installs unless ``FEATPIPE_TORCHVISION=0``);
  elsewhere the block is not run and says why.

``python -m tests._docs_blocks PAGE...`` runs pages as the test does, printing each block's
place and time (for authors).
"""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the pages whose blocks run: the front page and every page of docs/
PAGES = ["README.md", *sorted(p.relative_to(REPO).as_posix()
                              for p in (REPO / "docs").glob("*.md"))]

SHELL = {"bash", "sh", "shell", "console"}
DATA = {"toml", "csv", "json", "ini", "yaml"}
OUTPUT = {"text"}
LANGUAGES = SHELL | DATA | OUTPUT | {"python"}
#: seconds one block may take
BLOCK_TIMEOUT = 600

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>\w+)\s*(?P<rest>.*?)\s*-->\s*$")
#: variables of the tester's shell that would change what the pages' commands do
CLEARED = ("FEATPIPE_STORE", "FEATPIPE_ENCODERS", "FEATPIPE_FEATURES", "FEATPIPE_LOG_FILE",
           "FEATPIPE_PROGRESS_INTERVAL", "VIRTUAL_ENV")


class DocsError(Exception):
    """A page or block that the runner cannot take as written (a bad marker, no language)."""


@dataclass
class Block:
    """One fenced block: its page, the line of its opening fence, language, text, markers."""

    page: str
    line: int
    language: str
    text: str
    skip: str | None = None
    file: str | None = None
    replace: list[tuple[str, str]] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def runnable_text(self) -> str:
        """The text run: each ``replace`` applied."""
        text = self.text
        for old, new in self.replace:
            text = text.replace(old, new)
        return text


def visible_text(markdown: str) -> str:
    """The page without its HTML comments (what a reader sees)."""
    return re.sub(r"<!--.*?-->", "", markdown, flags=re.S)


def _marker(block: Block, kind: str, rest: str) -> None:
    if kind == "skip":
        if not rest:
            raise DocsError(f"{block.where}: `docs-test: skip` needs a reason")
        block.skip = rest
    elif kind == "file":
        if not rest or Path(rest).is_absolute() or ".." in Path(rest).parts:
            raise DocsError(f"{block.where}: `docs-test: file` needs a relative file name, "
                            f"got {rest!r}")
        block.file = rest
    elif kind == "replace":
        old, sep, new = rest.partition(" => ")
        if not sep or not old:
            raise DocsError(f"{block.where}: `docs-test: replace` needs OLD => NEW, got "
                            f"{rest!r}")
        block.replace.append((old, new))
    elif kind == "requires":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", rest):
            raise DocsError(f"{block.where}: `docs-test: requires` needs a module name, got "
                            f"{rest!r}")
        block.requires.append(rest)
    else:
        raise DocsError(f"{block.where}: unknown marker `docs-test: {kind}` (skip, file, "
                        "replace, requires)")


def parse(markdown: str, page: str) -> list[Block]:
    """The fenced blocks of ``markdown`` with their markers, checked (:class:`DocsError`)."""
    lines = markdown.splitlines()
    blocks: list[Block] = []
    visible = visible_text(markdown)
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower()
        body, j = [], i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing["fence"].startswith(fence[0]) and \
                    len(closing["fence"]) >= len(fence) and not closing["info"].strip():
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        else:
            raise DocsError(f"{page}:{i + 1}: a block that is never closed")
        block = Block(page, i + 1, language, "\n".join(body) + "\n")
        k = i - 1
        while k >= 0 and MARKER.match(lines[k]):
            found = MARKER.match(lines[k])
            _marker(block, found["kind"], found["rest"])
            k -= 1
        block.replace.reverse()  # in page order
        if language not in LANGUAGES:
            raise DocsError(f"{block.where}: block language {language or '(none)'!r}: give it "
                            "one the runner knows (bash or python to run it, text for output, "
                            f"a data language with a file marker): {sorted(LANGUAGES)}")
        for old, new in block.replace:
            if old not in block.text:
                raise DocsError(f"{block.where}: replace {old!r}: not in the block")
            if new.strip() and new.strip() not in visible:
                raise DocsError(f"{block.where}: replace {old!r} => {new!r}: the page's text "
                                "must name the stand-in")
        if block.file is None and block.skip is None and block.replace and \
                block.language not in SHELL | {"python"}:
            raise DocsError(f"{block.where}: replace on a block that is not run")
        blocks.append(block)
        i = j + 1
    return blocks


def page_blocks(page: str) -> list[Block]:
    return parse((REPO / page).read_text(encoding="utf-8"), page)


def featpipe_bin(folder: Path) -> Path:
    """A folder holding ``featpipe`` (this interpreter running this checkout's featpipe) and
    ``python``/``python3`` (this interpreter)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, command in (("featpipe", f'"{sys.executable}" -m featpipe'),
                          ("python", f'"{sys.executable}"'), ("python3", f'"{sys.executable}"')):
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
    return folder


def environment(bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@dataclass
class BlockRun:
    """What running one block gave."""

    block: Block
    ran: bool
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system, of this process and the processes it waited for


@dataclass
class PageRun:
    """A page run in ``folder``: every block's run, in order; ``failure`` describes the first
    block that failed (the blocks after it do not run)."""

    page: str
    folder: Path
    runs: list[BlockRun]
    failure: str | None = None

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    @property
    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds for r in self.runs)


def _cpu() -> float:
    """CPU seconds so far of this process and of its children that have been waited for."""
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                       resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _shell_text(block: Block) -> str:
    text = block.runnable_text()
    if block.language == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    return text


def run_block(block: Block, folder: Path, env: dict, namespace: dict) -> BlockRun:
    """Run (or write) one block in ``folder``; raises AssertionError with the block's output
    when it fails."""
    if block.skip is not None:
        return BlockRun(block, False)
    missing = [m for m in block.requires if not importable(m)]
    if missing:
        block.skip = f"needs {', '.join(missing)}, which does not import here"
        return BlockRun(block, False)
    if block.file is not None:
        target = folder / block.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.runnable_text(), encoding="utf-8")
        return BlockRun(block, False)
    started, cpu = time.perf_counter(), _cpu()
    if block.language in SHELL:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", _shell_text(block)],
                              cwd=folder, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT)
        run = BlockRun(block, True, proc.stdout, proc.stderr, time.perf_counter() - started,
                       _cpu() - cpu)
        if proc.returncode != 0:
            raise AssertionError(f"{block.where}: the {block.language} block exited "
                                 f"{proc.returncode}\n--- block ---\n{block.runnable_text()}"
                                 f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
        return run
    if block.language == "python":
        saved = Path.cwd()
        os.chdir(folder)
        try:
            exec(compile(block.runnable_text(), block.where, "exec"), namespace)  # noqa: S102
        except Exception as err:
            raise AssertionError(f"{block.where}: the python block raised "
                                 f"{type(err).__name__}: {err}\n--- block ---\n"
                                 f"{block.runnable_text()}") from err
        finally:
            os.chdir(saved)
        return BlockRun(block, True, seconds=time.perf_counter() - started,
                        cpu_seconds=_cpu() - cpu)
    return BlockRun(block, False)  # output and data blocks are shown only


@functools.cache
def importable(module: str) -> bool:
    """Whether ``module`` imports in this interpreter (a separate process: a broken install,
    such as torchvision beside another torch, raises at import)."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          timeout=300)
    return proc.returncode == 0


def run_page(page: str, folder: Path) -> PageRun:
    """Run every block of ``page`` in ``folder`` (made empty first), in order."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    env = environment(featpipe_bin(folder.parent / f"{folder.name}.bin"))
    namespace: dict = {"__name__": "__docs__"}
    result = PageRun(page, folder, [])
    for block in page_blocks(page):
        try:
            result.runs.append(run_block(block, folder, env, namespace))
        except AssertionError as err:
            result.failure = str(err)
            break
    return result


_FOLDERS = tempfile.TemporaryDirectory(prefix="featpipe-docs-")


@functools.cache
def page_run(page: str) -> PageRun:
    """:func:`run_page` once per test session (tests that check a page's numbers share it)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", page)
    return run_page(page, Path(_FOLDERS.name) / slug)


if __name__ == "__main__":
    for name in sys.argv[1:] or PAGES:
        run = page_run(name)
        for item in run.runs:
            state = (f"{item.seconds:6.1f} s, CPU {item.cpu_seconds:6.1f} s" if item.ran
                     else "  (not run)")
            print(f"{state}  {item.block.where} {item.block.language}"
                  + (f" (skip: {item.block.skip})" if item.block.skip else ""))
        print(f"{name}: {run.seconds:.1f} s, CPU {run.cpu_seconds:.1f} s; load "
              f"{os.getloadavg()[0]:.1f}" + (f"\nFAILED: {run.failure}" if run.failure
                                                 else ""))
