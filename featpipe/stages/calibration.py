"""How much CPU an extraction will take, measured before it runs (a dry run's calibration).

The first :data:`CALIBRATION_FRAMES` sampled frames of the first item are decoded, their
features computed and encoded (and the steps of the pass run) in this process; the CPU time
of all its threads after the first :data:`CALIBRATION_WARMUP` frames (start-up: compiled
kernels, a tracker's first tracks) divided by the frames timed, times the frames of every item,
is the stage's estimate.  A network is timed on one batch of :data:`CALIBRATION_BATCH`
frames, with seeded random weights when its weights file is missing.

The local features the calibration computes also correct the rows each item is planned with:
a method's rows per frame from its container's frame size are an upper bound where it prunes
(dense trajectories: every sampling cell, of which the tracking keeps a fraction, none in a
trajectory's first frames); the rows found over the rows so planned, on the frames decoded,
scale every item's (:meth:`Calibration.rescaled`), and so the sizes of a sample or of stored
trajectories (for dense SIFT the factor is 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.extract.estimate import ItemEstimate, Layout
from featpipe.extract.settings import ExtractSettings
from featpipe.extract.streaming import LocalFeatureProgram
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.plan import cpu_text
from featpipe.reporting import Reporter
from featpipe.stages.extraction_plan import Chosen, ExtractionPlan
from featpipe.store import Store

#: sampled frames a dry run times the extraction on (the first ones of the first item), and
#: the first of them left out of the time; a network gets :data:`CALIBRATION_BATCH` frames
CALIBRATION_FRAMES = 30
CALIBRATION_WARMUP = 5
CALIBRATION_BATCH = 4


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a calibration measured: the CPU seconds of the whole stage (None: too few
    frames) and the rows found over the rows planned for the frames decoded (None: not a
    local feature, or nothing planned)."""

    cpu_seconds: float | None
    rows_found: float | None = None

    def rescaled(self, estimates: list[ItemEstimate], layout: Layout) -> list[ItemEstimate]:
        """``estimates`` with their rows scaled by :attr:`rows_found` and their bytes
        recomputed."""
        if self.rows_found is None:
            return estimates
        scaled = []
        for estimate in estimates:
            if estimate.rows is None:
                scaled.append(estimate)
                continue
            rows = round(estimate.rows * self.rows_found)
            scaled.append(dataclasses.replace(estimate, rows=rows, bytes=layout.item_bytes(
                estimate.frames, rows)))
        return scaled


def calibrate(plan: ExtractionPlan, reporter: Reporter) -> Calibration | None:
    """The CPU time of the whole stage ``plan`` (its first item to compute, its estimates:
    :meth:`~featpipe.stages.extraction_plan.ExtractionPlan.estimate`), from a short
    calibration: the first
    :data:`CALIBRATION_FRAMES` sampled frames of the first item decoded, their features
    computed and encoded (and the steps of the pass run) in this process, the CPU time of
    all its threads after the first :data:`CALIBRATION_WARMUP` frames divided by the frames
    timed, times the frames of every item (a network: one batch of
    :data:`CALIBRATION_BATCH` frames, seeded random weights when the file is missing); and
    the rows found (:class:`Calibration`)."""
    import tempfile
    import time

    from featpipe.io.video import iter_frames

    item_id = plan.todo[0]
    path, estimates, sampling = plan.paths[item_id], plan.estimates, plan.sampling
    chosen, sinks, chain, settings = plan.chosen, plan.sinks, plan.chain, plan.settings
    frames = sum(e.frames or 0 for e in estimates)
    planned = next((e for e in estimates if e.item_id == item_id and e.frames), None)
    found = None
    try:
        with tempfile.TemporaryDirectory(prefix="featpipe-calibration-") as folder:
            stage = Store(folder).stage("calibration", {}, items=Manifest([]),
                                        dtype=settings.dtype)
            if chosen.method.runs == "model":
                timed, seconds = _time_network(path, sampling, chosen, settings)
                how = f"decoding, cropping and a forward pass of {timed} frames of {item_id}"
            else:
                sinks = dataclasses.replace(sinks, stage_path=str(stage.path),
                                            chain=tuple(chain.steps), keep=False, partial={})
                if not chain.steps:
                    sinks = dataclasses.replace(sinks, keep=True)
                job = LocalFeatureProgram(chosen.method, chosen.record, sinks, None,
                                          sampling.every or 1).start(item_id)
                started, timed = None, 0
                decoded = iter_frames(path, sampling, item_id=item_id)
                for count, (seconds, frame) in enumerate(decoded):
                    if count == CALIBRATION_WARMUP:
                        started = time.process_time()
                    job.add(frame, seconds)
                    timed += count >= CALIBRATION_WARMUP
                    if count + 1 >= CALIBRATION_FRAMES:
                        break
                try:
                    job.finish().discard()
                except FeatpipeError:  # too few frames for a result: the time still counts
                    job.abort()
                if planned is not None and planned.rows and job.frames:
                    found = job.rows / (job.frames * planned.rows / planned.frames)
                seconds = time.process_time() - started if started is not None else None
                how = (f"decoding, extracting and encoding {timed} frames of {item_id} after "
                       f"the first {CALIBRATION_WARMUP}")
    except (FeatpipeError, OSError, RuntimeError) as err:
        reporter.warn(f"dry run: no CPU estimate ({err})")
        return None
    if not timed or seconds is None:
        reporter.info(f"dry run: no CPU estimate ({item_id} has fewer than "
                      f"{CALIBRATION_WARMUP + 1} sampled frames)")
        return Calibration(None, found)
    total = seconds / timed * frames
    reporter.info(f"dry run: about {cpu_text(total, 'hours', 'minutes')} of CPU "
                  f"({1000 * seconds / timed:.1f} ms a frame, the CPU time of this process "
                  f"{how}, times {frames:,} frames)")
    return Calibration(total, found)


def _time_network(path: str, sampling: Sampling, chosen: Chosen,
                  settings: ExtractSettings) -> tuple[int, float]:
    """(frames, CPU seconds) of decoding, cropping and one forward pass of
    :data:`CALIBRATION_BATCH` frames (seeded random weights when the file is missing)."""
    import time

    record = dict(chosen.record)
    try:
        chosen.method.build(record).weights_identity()
    except FeatpipeError:  # the file is missing: the same network, seeded random weights
        record["weights"] = "random:0"
    estimator = chosen.method.build(record)
    preprocess = estimator.preprocess()
    model = estimator.network(settings.device, CALIBRATION_BATCH)
    clip = getattr(estimator, "clip", None)
    if clip:  # one clip of T frames, a vector every clip_stride frames
        model.forward_crops(_crops(path, sampling, preprocess, clip)[None])  # start-up
        started = time.process_time()
        model.forward_crops(_crops(path, sampling, preprocess, clip)[None])
        return estimator.clip_stride or clip, time.process_time() - started
    model.forward_crops(_crops(path, sampling, preprocess, 1))  # start-up
    started = time.process_time()
    crops = _crops(path, sampling, preprocess, CALIBRATION_BATCH)
    model.forward_crops(crops)
    return len(crops), time.process_time() - started


def _crops(path, sampling, preprocess, count):
    import torch

    from featpipe.io.video import iter_frames

    crops = []
    for _, frame in iter_frames(path, sampling):
        crops.append(np.asarray(preprocess(frame)))
        if len(crops) == count:
            break
    crops += crops[-1:] * (count - len(crops))  # a short video: its last frame repeated
    return torch.from_numpy(np.stack(crops))
