"""``featpipe manifest build|check``: write a manifest CSV, or report every problem in one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from featpipe.cli import LazyGroup
from featpipe.cli.common import warn
from featpipe.cli.options import table_entry
from featpipe.cli.suggest import Choice

if TYPE_CHECKING:
    from featpipe.manifest import Manifest


def table_source() -> dict[str, list[str]]:
    """The split-file formats of ``manifest build --splits`` (``options.json``)."""
    from featpipe.datasets import SPLIT_FORMATS

    return {"split_formats": list(SPLIT_FORMATS)}


def split_warnings(manifest: Manifest) -> list[str]:
    """One warning per split column without train rows or without test rows (classify and
    the fit commands need both)."""
    if not len(manifest):
        return []
    found = []
    for k in range(1, (manifest.n_splits or 1) + 1):
        missing = [part for part in ("train", "test") if not manifest.split_ids(k, part)]
        if missing:
            found.append(f"warning: split{k} has no {' and no '.join(missing)} rows: classify "
                         "and fit need both (manifest build --test-fraction F, --folds K, or "
                         "train/ and test/ folders)")
    return found


@click.group(cls=LazyGroup)
def manifest():
    """Build a manifest (id,path,label,split1..) or check one."""


@manifest.command("build")
@click.argument("data_dir", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Manifest CSV to write (e.g. manifests/ucf101.csv).")
@click.option("--labels-from", type=Choice(["parent-dir", "none"]), default="parent-dir",
              show_default=True, help="Label of each file (folder scan only).")
@click.option("--ext", "extensions", multiple=True, metavar=".EXT",
              help="File extensions to keep (repeatable; default: common video and image "
                   "extensions).")
@click.option("--splits", "splits", default=None, metavar="FORMAT:PATH",
              help="Items, labels and splits from official split files; FORMAT is one of "
                   f"{', '.join(table_entry('manifest')['split_formats'])}; PATH is the "
                   "folder holding those files.")
@click.option("--split-folders/--no-split-folders", default=True, show_default=True,
              help="Read top-level train/ and test/ (or val/) folders as the split.")
@click.option("--test-fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, metavar="F",
              help="One split: fraction F of each class is test (stratified, seeded).")
@click.option("--folds", type=click.IntRange(min=2), default=None, metavar="K",
              help="K split columns: stratified K-fold, split k tests fold k.")
@click.option("--seed", type=int, default=None,
              help="Seed of --test-fraction / --folds  [default: 0]")
def build(data_dir, output, labels_from, extensions, splits, split_folders, test_fraction,
          folds, seed):
    """Write a manifest for the files under DIR (paths relative to the manifest's folder).

    \b
    Splits: train/<class>/ and test/<class>/ (or val/) folders give them (the folder stays
    part of the ids); else --test-fraction F or --folds K make them, stratified per class
    and seeded; else --splits FORMAT:PATH reads the dataset's official split files.
    """
    from featpipe.datasets import (
        IMAGE_EXTENSIONS,
        VIDEO_EXTENSIONS,
        describe_split_folders,
        from_folder,
        from_split_files,
        with_folds,
        with_test_fraction,
    )

    generated = test_fraction is not None or folds is not None
    if test_fraction is not None and folds is not None:
        raise click.UsageError("--test-fraction and --folds exclude each other")
    if seed is not None and not generated:
        raise click.UsageError("--seed applies to --test-fraction or --folds")
    if splits:
        fmt, sep, path = splits.partition(":")
        if not sep or not path:
            raise click.BadParameter("expected FORMAT:PATH, e.g. ucf101:ucfTrainTestlist",
                                     param_hint="--splits")
        if extensions:
            raise click.UsageError("--ext applies to the folder scan, not to --splits")
        if generated:
            raise click.UsageError("--test-fraction/--folds apply to the folder scan; --splits "
                                   "reads the official splits")
        result = from_split_files(fmt.lower(), data_dir, path)
    else:
        result = from_folder(data_dir, extensions or VIDEO_EXTENSIONS + IMAGE_EXTENSIONS,
                             labels_from_parent=labels_from == "parent-dir",
                             split_folders=split_folders)
        layout = describe_split_folders(result) if split_folders else None
        if layout and generated:
            raise click.UsageError(f"{data_dir} has {layout.split(':')[0]}, which give the "
                                   "split; drop --test-fraction/--folds or pass "
                                   "--no-split-folders")
        if test_fraction is not None:
            result = with_test_fraction(result, test_fraction, seed or 0)
        elif folds is not None:
            result = with_folds(result, folds, seed or 0)
        elif layout:
            click.echo(layout)
    result.write(output)
    missing = sum(not result.resolve_path(it).exists() for it in result)
    classes = Counter(label for it in result for label in it.labels)
    click.echo(f"wrote {output}: {len(result)} items, {len(classes)} classes, "
               f"{result.n_splits} split column(s)")
    for k in range(1, (result.n_splits or 1) + 1):
        train, test = len(result.split_ids(k, "train")), len(result.split_ids(k, "test"))
        if train or test:
            click.echo(f"  split{k}: {train} train, {test} test")
    if missing:
        warn(f"warning: {missing} listed files do not exist under {data_dir} "
             f"(see `featpipe manifest check {output}`)")
    for line in split_warnings(result):
        warn(line)


@manifest.command("check")
@click.argument("manifest_path", metavar="MANIFEST", type=click.Path(dir_okay=False))
@click.option("--no-outside", is_flag=True,
              help="Paths outside the manifest's folder are problems.")
@click.option("--no-files", is_flag=True,
              help="Do not check that files exist and open (videos' and images' headers).")
def check(manifest_path, no_outside, no_files):
    """Report every problem with its line number; exit 1 if there is any.

    \b
    Each file must exist and not be empty; each video and image (by extension) must open as
    one (its header read by a decoding worker: no video stream, a damaged header, an
    unreadable file are problems of their row).
    """
    from featpipe.io.video import header_problems
    from featpipe.manifest import NO_ITEMS, Manifest

    path = Path(manifest_path)
    parsed, problems = Manifest.load(path)
    beyond = parsed.check(check_files=not no_files, allow_outside_root=not no_outside)
    if not no_files:
        beyond += header_problems(parsed)
    problems += [p for p in beyond  # a bad header or an empty file leaves no rows: said once
                 if not (problems and problems[0].line == 1 and p.message == NO_ITEMS)]
    for problem in sorted(problems, key=lambda p: p.line):
        click.echo(f"{path}:{problem.line}: {problem.message}")
    for line in split_warnings(parsed):
        warn(line)
    if problems:
        click.echo(f"{len(problems)} problem(s) in {path}", err=True)
        raise click.exceptions.Exit(1)
    click.echo(f"{path}: ok ({len(parsed)} items, {len(parsed.classes)} classes, "
               f"{parsed.n_splits} split column(s))")
