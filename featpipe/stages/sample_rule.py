"""Which items a sample of local features comes from (``extract --sample-descriptors N
--sample-total M``, the Table 6 recipe's ``idt-sample``): as few train items as give the rows a
GMM fits on, not every item, so the dense trajectories of the training set are computed once
(by the fused pass), not twice.

The train items of ``--sample-split`` are taken in a seeded order stratified by class
(:func:`stratified_order`: one of each class in turn); each is expected to give the mean of
``min(N, round(its planned rows x r))`` over the ratios r of rows found to rows planned that
the calibrations of the first :data:`CALIBRATION_ITEMS` items of the order measured
(:func:`row_ratios`, :func:`expected_rows`; the planned rows come from its container,
:mod:`featpipe.extract.estimate`), and the order is taken until the expected rows reach M
(:func:`sample_items`).  A dry run and a run choose the same items
(nothing but the manifest, the seed, the containers and the first items' features decide
them), so the stage key, which holds the items chosen, is one.
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
#: the first items of the order whose calibrations are pooled into the rows expected of
#: every item (one item alone misled the rule: its trajectories can be tens of times fewer
#: or more than another class's)
CALIBRATION_ITEMS = 8


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


def row_ratios(plan, item_ids: list[str], pool) -> list[float]:
    """The rows the calibration of each of ``item_ids`` (its first sampled frames:
    :func:`featpipe.stages.calibration.calibrate`) found over the rows planned for those
    frames; an item whose calibration found no planned rows (or failed) left out.  ``plan``
    is an extraction plan of these items (each calibrated in turn as its first)."""
    infos = probe_infos(pool, plan.paths, item_ids)
    ratios = []
    for item_id in item_ids:
        plan.todo = [item_id]
        plan.estimates = [estimate_item(item_id, infos[item_id], plan.sampling, plan.layout)]
        calibration = calibrate(plan, Reporter())
        if calibration is not None and calibration.rows_found is not None:
            ratios.append(calibration.rows_found)
    return ratios


def expected_rows(planned: int, ratios: list[float], cap: int) -> float:
    """The rows an item of ``planned`` rows is expected to give a sample of at most ``cap``
    an item: the mean over the calibrated items' ``ratios`` of min(cap, round(planned x
    ratio)), the estimate of E[min(cap, planned x R)] that a pooled ratio would overstate
    where the cap binds on some items and not others (min is concave); min(cap, planned)
    without ratios."""
    if not ratios:
        return float(min(cap, planned))
    return sum(min(cap, round(planned * ratio)) for ratio in ratios) / len(ratios)


def sample_items(plan_of, manifest: Manifest, settings: ExtractSettings, pool,
                 reporter: Reporter) -> Manifest:
    """The items of a ``sample_total`` extraction: the fewest train items of
    ``settings.sample_split``, taken in :func:`stratified_order`, whose expected rows reach
    ``sample_total``; an item is expected to give :func:`expected_rows` of its planned rows,
    at the ratios the first :data:`CALIBRATION_ITEMS` items' calibrations found
    (:func:`row_ratios`).  ``plan_of(manifest)`` plans an extraction of ``manifest`` with
    the same settings.  Said on ``reporter``; a GMM then fits
    on them (``fit gmm --sample``) as on a sample of every train item."""
    order = stratified_order(manifest, settings.sample_split, settings.sample_seed)
    if not order:
        raise FeatpipeError(f"--sample-total: split {settings.sample_split} has no train "
                            "items")
    calibrated = order[:CALIBRATION_ITEMS]
    plan = plan_of(manifest.subset(calibrated))
    ratios = row_ratios(plan, calibrated, pool)
    cap, wanted = int(settings.sample_descriptors), int(settings.sample_total)
    chosen, rows = [], 0
    for start in range(0, len(order), PROBE_BATCH):
        batch = order[start:start + PROBE_BATCH]
        infos = probe_infos(pool, {i: str(manifest.resolve_path(manifest[i])) for i in batch},
                            batch)
        for item_id in batch:
            estimate = estimate_item(item_id, infos[item_id], plan.sampling, plan.layout)
            chosen.append(item_id)
            rows += expected_rows(estimate.rows or 0, ratios, cap)
            if rows >= wanted:
                break
        if rows >= wanted:
            break
    found = (f"{min(ratios):.2g} to {max(ratios):.2g} of the rows planned for them"
             if ratios else "no rows planned for them")
    reporter.info(f"sample: {len(chosen)} of the {len(order)} train items of split "
                  f"{settings.sample_split} (a seeded order stratified by class), about "
                  f"{round(rows):,} rows for --sample-total {wanted:,} (at most {cap:,} an "
                  f"item; the first {len(calibrated)} calibrated gave {found})")
    return manifest.subset(chosen)
