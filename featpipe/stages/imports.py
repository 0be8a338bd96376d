"""The ``import`` stage: per-item features made elsewhere (.npy folder, .npz, HDF5, aeon .ts)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from featpipe.errors import FeatpipeError, ParameterError
from featpipe.fileio import check_output_path
from featpipe.io.importers import (
    ImportCompute,
    NpyDirSource,
    describe,
    detect_format,
    file_stamp,
    items_digest,
    open_each,
    orientation_warning,
    scan_sources,
    source_fingerprint,
    ts_manifest,
    wide_items_warning,
)
from featpipe.item_kinds import ITEM_KINDS, remember, shape_kind
from featpipe.manifest import Manifest
from featpipe.stages.base import (
    Reporter,
    RunOptions,
    StageRun,
    check_name,
    content_hashes,
    run_stage,
)
from featpipe.store import Store
from featpipe.store.content import READ_HASHES, read_hashes_record

log = logging.getLogger(__name__)


def import_features(store: Store, sources: Sequence[str], manifest_path: str | None = None, *,
                    name: str | None = None, dtype: str = "float32",
                    write_manifest: str | None = None, transpose: bool = False,
                    mat_variable: str | None = None, item_kind: str | None = None,
                    options: RunOptions | None = None,
                    reporter: Reporter | None = None) -> StageRun:
    """Import every manifest item from ``sources`` into an ``import`` stage named ``name``.

    Without a manifest every source must be a ``.ts`` file; the manifest is then built from
    the files (ids ``STEM/<i>``, class labels, split1 train/test from the file names) and saved
    as the stage's ``items.csv`` (and at ``write_manifest`` when given).  ``transpose`` swaps
    the axes of every 2-D array (one frame per column, e.g. VLFeat's D x N descriptors);
    ``mat_variable`` names the variable of per-item ``.mat`` files that hold several.
    ``item_kind`` says what an item is (:mod:`featpipe.item_kinds`: ``sequence``,
    ``descriptors``, ``vector``; it is part of the key); without it the kind is guessed from
    the items' shape and not checked by the steps that read them.
    The stage key holds the sources by content
    (:func:`featpipe.io.importers.source_fingerprint`): a rewritten file gives a new stage.
    """
    reporter = reporter or Reporter()
    check_name(name)
    if item_kind is not None and item_kind not in ITEM_KINDS:
        raise ParameterError("item_kind", f"must be one of {', '.join(ITEM_KINDS)}, got "
                             f"{item_kind!r}")
    if write_manifest:
        check_output_path(write_manifest, "write_manifest", store.root)
    specs = tuple((detect_format(path), str(Path(path).resolve())) for path in sources)
    if len(set(specs)) < len(specs):
        twice = next(path for path, spec in zip(sources, specs, strict=True)
                     if specs.count(spec) > 1)
        raise ParameterError("from", f"{twice} is given more than once")
    if manifest_path:
        manifest_file = os.path.abspath(manifest_path)  # (a link: its target's folder)
        manifest = Manifest.read(manifest_file)
        stamp = file_stamp(specs, manifest_file)
        opened = open_each(specs, manifest, mat_variable)
    else:
        not_ts = [path for (fmt, _), path in zip(specs, sources, strict=True) if fmt != "ts"]
        if not_ts:
            raise ParameterError("manifest", "is required unless every --from is a .ts file "
                                 f"({not_ts[0]} is not)")
        manifest_file = None
        stamp = file_stamp(specs, None)
        opened = open_each(specs, None)
        manifest = ts_manifest(opened)
    if not manifest.ids:
        raise FeatpipeError(f"the manifest {manifest_path} has no items" if manifest_path
                            else "the .ts files hold no cases")
    if write_manifest:
        manifest.write(write_manifest)
        reporter.info(f"wrote manifest {write_manifest} ({len(manifest)} items)")
    scan = scan_sources(opened, manifest, transpose)
    dry_run = bool(options and options.dry_run)
    hashes = content_hashes(store)
    read: dict[str, str | None] = {}
    params = {"sources": [source_fingerprint(source, manifest, hashes, read)
                          for source in opened],
              "items": items_digest(manifest)}
    keyed = {str(s.path): hashes.seen[os.path.abspath(s.path)] for s in opened
             if not isinstance(s, NpyDirSource)}
    if not dry_run:
        hashes.save()
    del hashes  # the cache of every file's hash: not kept while the stage is written
    params.update({"transpose": True} if transpose else {})
    params.update({"mat_variable": mat_variable} if mat_variable else {})
    params.update({"item_kind": item_kind} if item_kind else {})
    stage = store.stage("import", params, items=manifest, dtype=dtype, create=not dry_run,
                        records={READ_HASHES: read_hashes_record(read)} if read else None)
    del read  # about 100 bytes an item: not kept while the items are computed
    expected = scan.expected
    if not item_kind and expected is not None and not stage.exists:  # planned: not yet read
        remember(stage, shape_kind(expected[0]))
    if scan.mat.items:
        reporter.info(f"orientation: {scan.mat.items} item(s) from .mat files, read "
                      + ("transposed: one frame per column (D x T)" if transpose else
                         "as MATLAB shows them: one frame per row (T x D); --transpose for "
                         "one frame per column"))
    warning = (orientation_warning(scan.mat, transpose) if scan.mat.items else None) or \
        wide_items_warning(scan.shapes, transpose)
    if warning:
        reporter.warn(warning)
    for source in opened:
        log.info("source %s (%s)", source.path, source.fmt)
    log.info("%d items; reference feature shape: %s", len(manifest),
             describe(expected) if expected else "none found")
    compute = ImportCompute(specs, manifest_file, str(stage.path), expected, stamp, transpose,
                            mat_variable, keyed, opened=(manifest, opened))
    return run_stage(stage, manifest.ids, compute, store=store, name=name, options=options,
                     reporter=reporter, batch_size=16)
