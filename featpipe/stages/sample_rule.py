"""Which items a sample of local features comes from (``extract --sample-descriptors N
--sample-total M``, the Table 6 recipe's ``idt-sample``): as few train items as give the rows a
GMM fits on, not every item, so the dense trajectories of the training set are computed once
(by the fused pass), not twice.

The train items of ``--sample-split`` are taken in a seeded order stratified by class
(:func:`stratified_order`: one of each class in turn); each is expected to give ``min(N, its
planned rows x the rows the calibration found on the first over the rows planned for it)``
(:class:`featpipe.stages.calibration.Calibration`; the planned rows come from its container,
:mod:`featpipe.extract.estimate`), and the order is taken until the expected rows reach M
(:func:`sample_items`).  A dry run and a run choose the same items (nothing but the manifest,
the seed, the containers and the first item's features decide them), so the stage key, which
holds the items chosen, is one.
"""

from __future__ import annotations

import hashlib

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.extract.estimate import estimate_item, probe_infos
from featpipe.extract.settings import ExtractSettings
from featpipe.manifest import Manifest
from featpipe.reporting import Reporter
from featpipe.stages.calibration import calibrate

#: items probed at a time while the order is taken
PROBE_BATCH = 64


def stratified_order(manifest: Manifest, split: int, seed: int) -> list[str]:
    """The train ids of ``split`` in the order a sample takes them: one of each class in turn
    (classes sorted, a multi-label item under its first label), each class's ids in a random
    order seeded by ``seed`` and the class name."""
    train = set(manifest.split_ids(split, "train"))
    by_class: dict[str, list[str]] = {}
    for item in manifest:
        if item.id in train:
            by_class.setdefault(item.labels[0] if item.labels else "", []).append(item.id)
    queues = []
    for label in sorted(by_class):
        ids = by_class[label]
        crc = int(hashlib.sha256(label.encode()).hexdigest()[:15], 16)
        order = np.random.default_rng([int(seed), crc]).permutation(len(ids))
        queues.append([ids[i] for i in order])
    return [queue[turn] for turn in range(max(map(len, queues), default=0))
            for queue in queues if turn < len(queue)]


def sample_items(plan_of, manifest: Manifest, settings: ExtractSettings, pool,
                 reporter: Reporter) -> Manifest:
    """The items of a ``sample_total`` extraction: the fewest train items of
    ``settings.sample_split``, taken in :func:`stratified_order`, whose expected rows reach
    ``sample_total``; an item is expected to give ``min(sample_descriptors, its planned rows x
    the rows the calibration found on the first item over those planned for it)``
    (:class:`featpipe.stages.calibration.Calibration`).  ``plan_of(manifest)`` plans an
    extraction of ``manifest`` with the same settings.  Said on ``reporter``; a GMM then fits
    on them (``fit gmm --sample``) as on a sample of every train item."""
    order = stratified_order(manifest, settings.sample_split, settings.sample_seed)
    if not order:
        raise FeatpipeError(f"--sample-total: split {settings.sample_split} has no train "
                            "items")
    first = plan_of(manifest.subset(order[:1]))
    paths = first.paths
    first.todo = order[:1]
    infos = probe_infos(pool, paths, first.todo)
    first.estimates = [estimate_item(order[0], infos[order[0]], first.sampling, first.layout)]
    calibration = calibrate(first, Reporter())
    factor = 1.0 if calibration is None or calibration.rows_found is None else \
        calibration.rows_found
    cap, wanted = int(settings.sample_descriptors), int(settings.sample_total)
    chosen, rows = [], 0
    for start in range(0, len(order), PROBE_BATCH):
        batch = order[start:start + PROBE_BATCH]
        infos = probe_infos(pool, {i: str(manifest.resolve_path(manifest[i])) for i in batch},
                            batch)
        for item_id in batch:
            estimate = estimate_item(item_id, infos[item_id], first.sampling, first.layout)
            chosen.append(item_id)
            rows += min(cap, round((estimate.rows or 0) * factor))
            if rows >= wanted:
                break
        if rows >= wanted:
            break
    reporter.info(f"sample: {len(chosen)} of the {len(order)} train items of split "
                  f"{settings.sample_split} (a seeded order stratified by class), about "
                  f"{rows:,} rows for --sample-total {wanted:,} (at most {cap:,} an item; the "
                  f"first gave {factor:.2f} of the rows planned for it)")
    return manifest.subset(chosen)
