"""The ``extract`` stage: decode each manifest item and store its features, their encoding
or a sample of them.

What one item holds (``stage.read_item`` and its sidecars, :mod:`featpipe.items`):

* ``vgg16-fc6``: (T, 4096) for T sampled frames; ``timestamps`` (T,) seconds;
* ``vgg16-conv5_3``: (T·H·W, 512) local features; ``timestamps`` (T,), ``frame_index``
  (rows,) int32, ``positions`` (rows, 3) ``x, y, scale`` in frame pixels, ``image_size``;
* ``torchvision``: (T, D) for T sampled frames, or (clips, D) for a video model (the
  ``timestamps`` of each clip's first frame); with ``spatial``, (T·H·W, C) local features
  with the sidecars of conv5_3 (:mod:`featpipe.extract.torchvision_features`);
* ``dsift``: (N, 128) descriptors over all frames; ``timestamps``, ``frame_index``,
  ``image_size`` and (unless ``positions=False``) ``positions`` ``x, y, bin size``;
* with ``encode=METHOD`` (local features only): what ``featpipe encode --method METHOD``
  gives for that item (the same encoder, fed frame by frame; raw features are never
  written), e.g. a Fisher vector, or per frame with ``frame_index``/``timestamps``;
* with ``sample_descriptors=N``: at most N rows per item drawn uniformly (seeded by
  ``sample_seed`` and the item id), the training set of ``fit pca`` and ``fit gmm``; with
  ``sample_window=W`` too, of W consecutive frames of each item at a start seeded the same
  way (:func:`featpipe.io.video.window_start`), the frames after them not decoded.

With ``pca=NAME`` the features are projected by that fitted ``pca`` stage first.  These and
the other run settings are one record, :class:`~featpipe.extract.settings.ExtractSettings`.

Video dense SIFT samples one frame per second unless told otherwise (its method's
``default_fps``, :mod:`featpipe.extract.dsift`).
Before anything runs the extraction is planned in one place
(:mod:`featpipe.stages.extraction_plan`): its key, what an item holds, the steps of its pass,
the items probed (frame count, rate, size) and the stage's size at rest estimated; a stage
that would not fit on the store's disk is refused (``disk_check=False`` overrides), and a dry
run prints the plan (calibrated: :mod:`featpipe.stages.calibration`) and creates nothing.
Decoding runs in ``jobs`` worker processes (see :mod:`featpipe.extract.streaming`); SIGINT
and SIGTERM stop the stage cleanly (:mod:`featpipe.interrupts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from featpipe.errors import FeatpipeError, ItemError, WriteError
from featpipe.extract.estimate import work_plan
from featpipe.extract.settings import ExtractSettings
from featpipe.extract.streaming import CropProgram, Extraction, LocalFeatureProgram, Network
from featpipe.interrupts import Interrupt, Interrupted, interruptible
from featpipe.io.video import DecodePool, Sampling
from featpipe.manifest import Manifest
from featpipe.parallel import resolve_jobs, resume_advice, store_stopped
from featpipe.progress import WorkPlan
from featpipe.stages.base import (
    Reporter,
    RunOptions,
    StageRun,
    Written,
    announce,
    check_name,
    mark_running,
    name_left,
    one_run_at_a_time,
    run_stage,
    settle_name,
    unmark_running,
)
from featpipe.stages.calibration import calibrate
from featpipe.stages.dryrun import planning_quickly
from featpipe.stages.extraction_plan import (
    Chosen,
    ExtractionPlan,
    plan_chain,
    plan_extraction,
    plan_pass,
)
from featpipe.stages.sample_rule import sample_items
from featpipe.store import Stage, Store
from featpipe.store.content import READ_HASHES, read_hashes_record


def extract(store: Store, manifest: Manifest, features: str, *, params: Mapping | None = None,
            sampling: Sampling | None = None, settings: ExtractSettings | None = None,
            name: str | None = None, options: RunOptions | None = None,
            reporter: Reporter | None = None) -> StageRun:
    """Decode every item of ``manifest`` and store its ``features`` (or their encoding, or
    a sample of them); returns the run.

    ``features`` names a feature method (:func:`featpipe.extract.features.load_features`)
    and ``params`` its parameters (those of its estimator, e.g.
    :class:`~featpipe.extract.dsift.DenseSIFT`'s or :class:`~featpipe.extract.vgg.VGG16`'s;
    the others take their defaults); ``sampling`` picks the frames (a method may have a
    default rate: dense SIFT one per second); ``settings``
    (:class:`~featpipe.extract.settings.ExtractSettings`) says what each item holds (the
    stored dtype, positions, a ``pca`` projection, an ``encode`` method for local features
    and its parameters, or a sample of ``sample_descriptors`` rows) and how the stage runs
    (device, batch size, decoder, ``allow_partial`` for truncated videos, ``disk_check``).

    ``settings.then`` lists ``featpipe encode`` steps (:class:`featpipe.chain.Then`) run on
    each item as soon as its extraction is done, in the same pass (e.g. per-frame Fisher
    vectors -> one group's part -> rank pooling): each step's stage has the key of the same
    step run by ``featpipe encode``, and is written when the step is kept (named, or its
    ``keep``); the extraction's own stage is written when ``settings.keep`` (default: only
    without steps).
    Raises :class:`~featpipe.interrupts.Interrupted` after SIGINT/SIGTERM (finished items
    kept).
    """
    check_name(name)
    options = options or RunOptions()
    reporter = reporter or Reporter()
    settings = settings or ExtractSettings()

    def plan_of(items: Manifest) -> ExtractionPlan:
        return plan_extraction(store, items, features, params, sampling, settings, options,
                               reporter)

    plan_ = plan_of(manifest)  # every parameter checked before a decoder starts
    with interruptible():
        pool = DecodePool(resolve_jobs(options.jobs), plan_.settings.decoder,
                          plan_.settings.decode_timeout)
        try:
            if settings.sample_total is not None:  # as few train items as give the rows
                plan_ = plan_of(sample_items(plan_of, manifest, settings, pool, reporter))
            # frames sampled and the size estimated from what the containers say (all items
            # for a dry run, a sample otherwise), the disk checked, then the items scheduled
            plan_.estimate(pool)
            if options.dry_run:
                calibration = calibrate(plan_, reporter) if plan_.todo and \
                    not planning_quickly() else None
                return plan_.dry_run(name, calibration, reporter)
            plan_.check_disk()
            plan_.hashes.save()  # after every check: a refused run leaves nothing behind
            return _execute(plan_, pool, name, reporter)
        except Interrupt as signal_:  # before any item ran (probing, loading the model)
            done = plan_.summary.done
            raise Interrupted(signal_.signum, done, len(plan_.todo) - done) from None
        finally:
            pool.close()


def _execute(plan_: ExtractionPlan, pool, name: str | None, reporter: Reporter) -> StageRun:
    """Run a checked plan: its stages created, the pass run in this process's pipeline (or
    its items sent to a dask cluster), the names moved when it went through."""
    store, manifest, options = plan_.store, plan_.manifest, plan_.options
    settings, chosen, sampling, then = plan_.settings, plan_.chosen, plan_.sampling, plan_.then
    paths, shard = plan_.paths, plan_.shard
    stage = store.stage("extract", plan_.params, inputs=plan_.inputs, items=manifest,
                        dtype=settings.dtype,
                        records={READ_HASHES: read_hashes_record(plan_.read)})
    chain = plan_chain(store, stage, then, plan_.keep, reporter, create=True)
    outputs = dataclasses.replace(plan_.sinks, stage_path=str(stage.path),
                                  chain=tuple(chain.steps), keep=plan_.keep,
                                  partial=plan_.partial)
    if options.executor == "dask":
        pool.close()
        compute = ExtractCompute(str(stage.path), paths, sampling, chosen, outputs, settings)
        return run_stage(stage, manifest.ids, compute, store=store, name=name,
                         options=options, reporter=reporter, batch_size=4,
                         work=lambda todo: {e.item_id: e.work for e in plan_.estimates})
    written = ([(stage, name)] if plan_.keep else []) + chain.written()
    for output, output_name in written if then else []:
        announce(output, output_name, reporter)
    if not then:
        announce(stage, name, reporter)
    with one_run_at_a_time(stage, manifest.ids, shard, options.force, reporter) as reused:
        todo, summary, partial = plan_pass(stage, chain, manifest.ids, options.force, shard)
        work = work_plan(plan_.estimates, todo)
        for output, output_name in written or [(stage, None)]:
            mark_running(store, output_name, output, work, options.force)
        outputs = dataclasses.replace(outputs, partial=partial)
        try:
            extraction = _extraction(stage, pool, sampling, chosen, outputs, settings)
            extraction.also_failed = [s for s, step in zip(chain.stages, chain.steps,
                                                           strict=True) if step.keep]
            extraction.manifest = manifest  # a missing file names its row
            run = _run(stage, extraction, [(i, paths[i]) for i in todo], summary, work,
                       options, reporter, name if not then else None)
        except Interrupted:
            raise  # its one line says how many items are left
        except BaseException:
            for output, output_name in written:
                name_left(output, output_name, output.items.ids, reporter)
            raise
        finally:
            for output, _ in written or [(stage, None)]:
                unmark_running(output)
    reused(run.summary)
    for output, output_name in written:
        settle_name(store, output_name, output, output.items.ids, options.on_error, reporter)
    if then:
        run.written = [Written(output, output_name) for output, output_name in written]
    return run


def _extraction(stage, pool, sampling, chosen: Chosen, sinks, settings: ExtractSettings,
                model=None, record_failures: bool = True) -> Extraction:
    """The pipeline of the chosen method: in the workers, or a network in this process
    (``model``: one already loaded)."""
    if chosen.method.runs == "worker":
        pool.program = LocalFeatureProgram(chosen.method, chosen.record, sinks,
                                           settings.human_boxes, sampling.every or 1)
        return Extraction(stage, pool, sampling, sinks, allow_partial=settings.allow_partial,
                          record_failures=record_failures)
    estimator = chosen.estimator()
    preprocess = estimator.preprocess()
    pool.program = CropProgram(preprocess)
    model = model or estimator.network(settings.device, settings.batch_size)
    loaded = model.weights_identity
    if loaded != stage.params["weights"]:
        raise FeatpipeError(f"--weights {estimator.weights} changed after the stage key was "
                            f"computed ({loaded[:19]}... loaded, {stage.params['weights'][:19]}"
                            "... keyed): nothing was computed; run the command again")
    network = Network(model, preprocess, settings.batch_size, getattr(estimator, "clip", None),
                      getattr(estimator, "clip_stride", None))
    return Extraction(stage, pool, sampling, sinks, network=network,
                      allow_partial=settings.allow_partial, record_failures=record_failures)


def _run(stage, extraction: Extraction, todo: list[tuple[str, str]], summary, work: WorkPlan,
         options: RunOptions, reporter: Reporter, name: str | None) -> StageRun:
    """Run the items ``todo`` (id, path) in this process's pipeline: progress in frames, timed
    by the work of each item (``work``), one summary line, the first failure ends the run with
    ``on_error='fail'``; a signal or a store that cannot be written (disk full) ends it
    cleanly, with one line."""
    extraction.on_warning = lambda item_id, text: reporter.warn(f"warning: {item_id}: {text}")
    runs = extraction.run(todo)
    try:
        label = f"{stage.kind} {name}" if name else stage.kind
        with reporter.progress(round(work.units_total) if todo else 0, label,
                               unit="frames") as progress:
            progress.plan_work(work)
            extraction.on_item_frames = progress.advance_item
            for item_id, error in runs:
                progress.ended(item_id)
                if error is None:
                    summary.done += 1
                    continue
                summary.failed[item_id] = error
                if options.on_error == "fail":
                    raise FeatpipeError(f"{error} (stage {stage.name}; {summary.line()}; "
                                        f"{resume_advice(error)})", item=item_id)
    except Interrupt as signal_:
        runs.close()
        left = len(todo) - summary.done
        raise Interrupted(signal_.signum, summary.done, left) from None
    except WriteError as err:  # the store's disk: no item failed, the rerun resumes
        runs.close()
        raise store_stopped(err, stage, [i for i, _ in todo], summary.skipped) from None
    finally:
        runs.close()
    reporter.info(f"summary: {summary.line()}")
    for item_id, error in list(summary.failed.items())[:20]:
        reporter.error(f"failed: {item_id}: {error}")
    return StageRun(stage, summary)


class ExtractCompute:
    """Picklable compute for executors that send batches of items elsewhere (dask): each
    call runs the pipeline with one decoding worker over its items, which it writes itself.
    The decoding worker and the VGG model are made by the first call on a machine and kept
    for the next batches there (they are not pickled)."""

    def __init__(self, stage_path, paths, sampling, chosen: Chosen, sinks,
                 settings: ExtractSettings):
        self.stage_path = stage_path
        self.paths = paths
        self.sampling = sampling
        self.chosen = chosen
        self.sinks = sinks
        self.settings = settings
        self._pool = self._model = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None, "_model": None}

    def __call__(self, ids: Sequence[str]) -> list:
        from featpipe.parallel import WRITTEN

        stage = Stage(self.stage_path)
        settings = self.settings
        if self._pool is None:
            self._pool = DecodePool(1, settings.decoder, settings.decode_timeout)
        if self.chosen.method.runs == "model" and self._model is None:
            self._model = self.chosen.estimator().network(settings.device, settings.batch_size)
        extraction = _extraction(stage, self._pool, self.sampling, self.chosen, self.sinks,
                                 settings, model=self._model, record_failures=False)
        outcome = dict(extraction.run([(i, self.paths[i]) for i in ids]))
        return [WRITTEN if outcome.get(i, "not run") is None
                else ItemError(i, outcome.get(i, "not run")) for i in ids]
