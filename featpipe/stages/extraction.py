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
  ``sample_seed`` and the item id), the training set of ``fit pca`` and ``fit gmm``.

With ``pca=NAME`` the features are projected by that fitted ``pca`` stage first.  These and
the other run settings are one record, :class:`~featpipe.extract.settings.ExtractSettings`.

Video dense SIFT samples one frame per second unless told otherwise (its method's
``default_fps``, :mod:`featpipe.extract.dsift`).
Before anything runs the items are probed (frame count, rate, size) and the stage's size at
rest is estimated; a stage that would not fit on the store's disk is refused
(``disk_check=False`` overrides), and a dry run prints the estimate and creates nothing.
Decoding runs in ``jobs`` worker processes (see :mod:`featpipe.extract.streaming`); SIGINT
and SIGTERM stop the stage cleanly (:mod:`featpipe.interrupts`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from featpipe.chain import ChainRunner, ChainStep, Then, order_steps
from featpipe.content import CACHE_NAME, READ_HASHES, ContentHashes, read_hashes_record
from featpipe.errors import FeatpipeError, ItemError, ParameterError, WriteError
from featpipe.extract.estimate import (
    ItemEstimate,
    Layout,
    Totals,
    describe,
    encoded_size,
    estimate_item,
    free_bytes,
    human_bytes,
    probe_infos,
    sample_ids,
)
from featpipe.extract.features import FeatureMethod, load_features
from featpipe.extract.settings import ExtractSettings
from featpipe.extract.streaming import (
    CropProgram,
    Extraction,
    FrameSinks,
    LocalFeatureProgram,
    Network,
)
from featpipe.interrupts import Interrupt, Interrupted, interruptible
from featpipe.io.images import is_image
from featpipe.io.video import DecodePool, Sampling
from featpipe.manifest import Manifest
from featpipe.parallel import (
    RunSummary,
    make_executor,
    parse_shard,
    plan,
    resolve_jobs,
    resume_advice,
    store_stopped,
)
from featpipe.parameters import parameter_record, typed_value
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
)
from featpipe.stages.dryrun import PlannedItems, item_bytes
from featpipe.store import Stage, Store

#: items probed to estimate a real run's size (a dry run probes every item)
ESTIMATE_SAMPLE = 64
#: the weights' place in the key of a dry run's stage whose weights file is missing (its
#: key, and those of the stages after it, are provisional; the problem is listed)
MISSING_WEIGHTS = "missing"
#: sampled frames a dry run times the extraction on (the first ones of the first item), and
#: the first of them left out of the time (start-up: compiled kernels, a tracker's first
#: tracks); a network gets :data:`CALIBRATION_BATCH` frames
CALIBRATION_FRAMES = 30
CALIBRATION_WARMUP = 5
CALIBRATION_BATCH = 4


def manifest_digest(manifest: Manifest, hashes: ContentHashes,
                    read: dict[str, str | None] | None = None) -> str:
    """sha256 of the manifest rows, in order: id, the content of its file (size and SHA-256,
    :mod:`featpipe.content`; a missing file as missing), labels, splits.  A rewritten video
    gives a new stage; a moved or touched one keeps it.  ``read`` (when given) receives each
    item's SHA-256 (None: no file), for :func:`featpipe.content.read_hashes_record`."""
    rows = []
    for it in manifest:
        path = manifest.resolve_path(it)
        content = list(hashes.file_hash(path)) if path.is_file() else None
        rows.append([it.id, content, list(it.labels), list(it.splits)])
        if read is not None:
            read[it.id] = None if content is None else content[1]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=True).encode()).hexdigest()[:16]


@dataclasses.dataclass
class _Plan:
    """Everything decided before a stage exists: parameters, inputs, outputs, programs."""

    params: dict
    inputs: list
    outputs: FrameSinks
    layout: Layout
    read: dict  # item id -> SHA-256 of its file as keyed (featpipe.content.read_hashes_record)


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The feature method and the canonical record of its parameters (picklable)."""

    method: FeatureMethod
    record: dict

    def estimator(self):
        return self.method.build(self.record)


def choose_features(features: str, params: Mapping | None) -> Chosen:
    """The method ``features`` (:mod:`featpipe.extract.features`) and its parameters' record:
    declared names only, defaults filled, typed, validated (a ParameterError names the
    parameter), with what the estimator resolves (dense SIFT's contrast threshold)."""
    methods = load_features()
    if features not in methods:
        raise ParameterError("features", f"must be one of {', '.join(methods)}, got "
                             f"{features!r}")
    method = methods[features]
    record = parameter_record(method.parameters, dict(params or {}), f"--features {features}")
    method.estimator.check_param_values({**record, **dict(method.fixed)})
    estimator = method.build(record)
    resolved = getattr(estimator, "effective_params", None)
    if resolved is not None:
        record = {k: v for k, v in resolved().items() if k in record}
    local = getattr(estimator, "local", method.local)  # decided by its parameters (--spatial)
    if local != method.local:
        method = dataclasses.replace(method, local=local)
    return Chosen(method, record)


def _plan(store: Store, manifest: Manifest, chosen: Chosen, sampling: Sampling,
          settings: ExtractSettings, hashes: ContentHashes, problems: list | None = None
          ) -> _Plan:
    """Work out the stage's key and what its items hold (a bad parameter is a
    ParameterError: no stage, no decoding): the features' part of the key, the projection,
    then the items' layout.  With ``problems`` (a dry run), a missing weights file is
    listed there instead of raised."""
    if not manifest.ids:
        raise FeatpipeError("the manifest has no items")
    read: dict[str, str | None] = {}
    params = _feature_key(manifest, chosen, sampling, settings, hashes, read, problems)
    estimator = chosen.estimator()
    dim, pca_stage = _projection(store, settings.pca, chosen.method.name,
                                 int(estimator.n_features))
    inputs = [pca_stage] if pca_stage is not None else []
    sinks = FrameSinks("", local=chosen.method.local, positions=settings.positions,
                       pca_path=None if pca_stage is None else str(pca_stage.path))
    layout, sinks, made, models = _items(store, chosen, settings, estimator, dim, sinks)
    params.update(made)
    return _Plan(params, inputs + list(models.values()), sinks, layout, read)


def _feature_key(manifest, chosen: Chosen, sampling: Sampling, settings: ExtractSettings,
                 hashes: ContentHashes, read: dict | None = None,
                 problems: list | None = None) -> dict:
    """The stage key's record of the inputs and the features: the manifest (its files by
    content), the sampling and the decoder (none when every item is an image, read whole
    whatever they say), and the method's parameters (a network's weights by their
    identity; human boxes by the content of each item's file)."""
    videos = any(not is_image(manifest.resolve_path(it)) for it in manifest)
    params: dict = {"features": chosen.method.name,
                    "manifest": manifest_digest(manifest, hashes, read),
                    "sampling": sampling.params() if videos else None,
                    "decoder": settings.decoder if videos else None}
    if chosen.method.runs == "worker":
        params[chosen.method.name] = chosen.record
        if settings.human_boxes is not None:
            from featpipe.extract.boxes import boxes_digest

            params["human_boxes"] = boxes_digest(settings.human_boxes, manifest.ids,
                                                 hashes.file_hash)
    else:  # a network: its weights by identity, what else it declares, the precision
        estimator = chosen.estimator()
        try:
            identity = estimator.weights_identity()
        except FeatpipeError as err:
            if problems is None:
                raise
            problems.append(str(err))  # a dry run lists it and plans on
            identity = MISSING_WEIGHTS
        params.update({"weights": identity, **estimator.stage_params(),
                       "precision": "fp16-autocast" if settings.device == "cuda" else "fp32"})
    return params


def _projection(store: Store, pca: str | None, features: str, dim: int):
    """(dimension after the ``pca`` stage, that stage) or (``dim``, None) without one."""
    if pca is None:
        return dim, None
    from featpipe.extract.pca import load_pca

    pca_stage = store.resolve(pca)
    if pca_stage.kind != "pca":
        raise FeatpipeError(f"--pca {pca} is a {pca_stage.kind} stage, not a pca stage")
    projection = load_pca(pca_stage)
    if projection.mean_.shape[0] != dim:
        raise FeatpipeError(f"--pca {pca} projects {projection.mean_.shape[0]}-dim rows; "
                            f"{features} gives {dim}")
    return int(projection.components_.shape[0]), pca_stage


def _items(store, chosen: Chosen, settings: ExtractSettings, estimator, dim: int,
           sinks: FrameSinks):
    """What an item holds: (its size layout, the sinks, the key's record of it, the model
    stages an encoder reads)."""
    rows_per_frame, local = estimator.count, chosen.method.local
    itemsize = np.dtype(settings.dtype).itemsize
    if settings.encode is not None:
        sinks, layout, models, encoded = _encoder_plan(
            store, settings, sinks, (rows_per_frame, dim, itemsize),
            chain=(chosen.method.name, int(estimator.n_features), settings.pca,
                   tuple(g for g, _ in estimator.groups()) if hasattr(estimator, "groups")
                   else None))
        return layout, sinks, {"encode": encoded}, models
    if settings.sample_descriptors is not None:
        rows = int(typed_value(settings.sample_descriptors, (int,)))
        seed = int(typed_value(settings.sample_seed, (int,)))
        sinks = dataclasses.replace(sinks, kind="sample", sample=rows, seed=seed)
        layout = Layout(rows_per_frame, dim, 4, kind="sample", sample=rows)
        return layout, sinks, {"sample": {"rows": rows, "seed": seed}}, {}
    layout = Layout(rows_per_frame, dim, itemsize, local=local, positions=settings.positions)
    return layout, sinks, ({"positions": settings.positions} if local else {}), {}


def _encoder_plan(store, settings: ExtractSettings, outputs, shape, chain):
    """The encoder of ``extract --encode``: ``featpipe encode``'s method, parameters (an
    encoder with a device runs on ``settings.device`` unless told otherwise) and model
    stages (so its stage key says the same), checked on a synthetic frame; ``shape`` is
    (rows per frame, dimension, item size) of the features."""
    from featpipe.encode.registry import load_methods
    from featpipe.stages.encoding import method_models

    rows_per_frame, dim, itemsize = shape
    method = settings.encode
    chosen = load_methods()[method]
    given = dict(settings.encode_params or {})
    if "device" in chosen.defaults:
        given.setdefault("device", settings.device)
    params, models = method_models(store, chosen, given)
    encoder = chosen.build(dict(params), models)
    _check_projections(method, given, models, encoder, dim, chain)
    try:
        code_dim, per_frame = encoded_size(encoder, dim)
    except FeatpipeError as err:  # e.g. a GMM fitted on other descriptors
        raise FeatpipeError(f"--encode {method} cannot encode these features: {err}") from None
    outputs = dataclasses.replace(
        outputs, kind="encode", method=method, params=params,
        model_paths={k: str(s.path) for k, s in models.items()})
    layout = Layout(rows_per_frame, dim, itemsize, kind="encode", code_dim=code_dim,
                    per_frame=per_frame)
    return outputs, layout, models, {"method": method, **params}


def _check_projections(method, given, models, encoder, dim, chain) -> None:
    """The chain features -> ``--pca`` -> the encoder, checked before any work: a model stage
    that carries its own PCA (``fit gmm --pca/--pca-dim``) projects the raw features itself,
    so ``--pca`` as well would project them twice; a model fitted on projected descriptors
    needs ``--pca``; a model of descriptor groups (``fit gmm --groups``,
    ``encoder.input_groups``) needs the raw rows of the same ``groups``.
    ``encoder.input_dim`` (when it has one) is what the encoder takes; ``chain`` is (the
    features' name, their dimension, the ``--pca`` stage, their groups or None)."""
    from featpipe.extract.pca import MODEL_NAME, PCAProjection

    features, feature_dim, pca, groups = chain
    wanted = getattr(encoder, "input_groups", None)
    if wanted is not None and (pca is not None or groups != wanted):
        names = ", ".join(f"{key} {given.get(key)}" for key in models)
        got = "projected rows (--pca)" if pca is not None else (
            f"the groups {','.join(groups)}" if groups else f"{features} rows without groups")
        raise FeatpipeError(f"--encode {method} ({names}) was fitted on the groups "
                            f"{','.join(wanted)} of raw rows; this extraction gives {got}: "
                            f"use --descriptors {','.join(wanted)}"
                            + (" without --pca" if pca is not None else ""))

    expected = getattr(encoder, "input_dim", None)
    if expected is None or expected == dim:
        return
    for key, stage in models.items():
        if pca is not None and stage.has_model(MODEL_NAME):
            own = stage.load_model(MODEL_NAME, PCAProjection)
            if own.mean_.shape[0] == feature_dim:
                raise ParameterError(
                    "pca", f"{pca} projects the {features} descriptors {feature_dim} -> {dim}, "
                    f"and the {key} stage {given.get(key)} of --encode {method} projects them "
                    f"again with its own PCA ({feature_dim} -> {own.components_.shape[0]}, "
                    "stored by `fit gmm --pca/--pca-dim`): the projection is doubled; drop "
                    "--pca (the model projects)")
    got = f"--pca {pca} gives" if pca is not None else f"{features} gives"
    hint = ("; was it fitted on descriptors projected by a pca stage? add --pca NAME"
            if pca is None and expected < dim else "")
    names = ", ".join(f"{key} {given.get(key)}" for key in models)
    raise FeatpipeError(f"--encode {method} ({names}) takes {expected}-dim descriptors but "
                        f"{got} {dim}{hint}")


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
    sampling = (sampling or Sampling()).validate()
    settings = settings or ExtractSettings()
    chosen = choose_features(features, params)
    settings.check(chosen.method)
    then = order_steps(settings.then)
    keep = not then if settings.keep is None else bool(settings.keep)
    _check_then(then, keep, settings, options)
    if chosen.method.default_fps is not None and sampling == Sampling():
        sampling = Sampling(fps=chosen.method.default_fps)
    if settings.human_boxes is not None:
        if sampling.fps is not None or sampling.frames is not None:
            raise ParameterError("human_boxes", "are given per video frame: sample every frame "
                                 "or every N-th (--every N), not --fps or --frames")
        settings = dataclasses.replace(settings,
                                       human_boxes=str(Path(settings.human_boxes).resolve()))
    hashes = ContentHashes(store.root / CACHE_NAME)
    problems: list[str] = []
    plan_ = _plan(store, manifest, chosen, sampling, settings, hashes,
                  problems if options.dry_run else None)
    if not options.dry_run:
        hashes.save()
    shard = parse_shard(options.shard)
    if options.executor != "dask":
        make_executor(options.executor).check_shard(shard)
    paths = {it.id: str(manifest.resolve_path(it)) for it in manifest}
    # the stage as planned (nothing on disk yet): a dry run and the disk check come first
    stage = store.stage("extract", plan_.params, inputs=plan_.inputs, items=manifest,
                        dtype=settings.dtype, create=False)
    chain = _plan_chain(store, stage, then, keep, reporter, create=False)
    chain.sizes = _chain_sizes(chain, plan_.layout)
    todo, summary, partial = _plan_pass(stage, chain, manifest.ids, options.force, shard)
    with interruptible():
        pool = DecodePool(resolve_jobs(options.jobs), settings.decoder,
                          settings.decode_timeout)
        try:
            # frames sampled and the size estimated from what the containers say (all items
            # for a dry run, a sample otherwise), the disk checked, then the items scheduled
            probed = todo if options.dry_run else sample_ids(todo, ESTIMATE_SAMPLE)
            estimates = _estimates(pool, paths, probed, sampling, plan_.layout)
            if options.dry_run:
                for problem in problems:
                    reporter.warn(f"problem: {problem} (the keys of this stage and those "
                                  "computed from it are provisional)")
                run = _dry_run(store, stage, name, chain, plan_.layout, estimates, summary,
                               reporter)
                run.problems = problems
                if todo:
                    run.cpu_seconds = _calibrate((todo[0], paths[todo[0]]), estimates,
                                                 sampling, chosen, plan_.outputs, chain,
                                                 settings, reporter)
                return run
            total = _check_disk(store, _pass_estimates(estimates, chain), len(todo),
                                settings.disk_check)
            stage = store.stage("extract", plan_.params, inputs=plan_.inputs, items=manifest,
                                dtype=settings.dtype,
                                records={READ_HASHES: read_hashes_record(plan_.read)})
            chain = _plan_chain(store, stage, then, keep, reporter, create=True)
            outputs = dataclasses.replace(plan_.outputs, stage_path=str(stage.path),
                                          chain=tuple(chain.steps), keep=keep,
                                          partial=partial)
            if options.executor == "dask":
                pool.close()
                compute = ExtractCompute(str(stage.path), paths, sampling, chosen, outputs,
                                         settings)
                return run_stage(stage, manifest.ids, compute, store=store, name=name,
                                 options=options, reporter=reporter, batch_size=4)
            written = ([(stage, name)] if keep else []) + chain.written()
            for output, output_name in written if then else []:
                announce(output, output_name, reporter)
            if not then:
                announce(stage, name, reporter)
            with one_run_at_a_time(stage, manifest.ids, shard, options.force,
                                   reporter) as reused:
                for output, output_name in written or [(stage, None)]:
                    mark_running(store, output_name, output)
                todo, summary, partial = _plan_pass(stage, chain, manifest.ids,
                                                    options.force, shard)
                outputs = dataclasses.replace(outputs, partial=partial)
                try:
                    extraction = _extraction(stage, pool, sampling, chosen, outputs,
                                             settings)
                    extraction.also_failed = [s for s, step in zip(chain.stages, chain.steps,
                                                                   strict=True) if step.keep]
                    extraction.manifest = manifest  # a missing file names its row
                    run = _run(stage, extraction, [(i, paths[i]) for i in todo], summary,
                               total, options, reporter, name if not then else None)
                except Interrupted:
                    raise  # its one line says how many items are left
                except BaseException:
                    for output, output_name in written:
                        name_left(output, output_name, output.items.ids, reporter)
                    raise
                finally:
                    for output, _ in written or [(stage, None)]:
                        output.unmark_running()
            reused(run.summary)
            for output, output_name in written:
                settle_name(store, output_name, output, output.items.ids, options.on_error,
                            reporter)
            if then:
                run.written = [Written(output, output_name) for output, output_name in written]
            return run
        except Interrupt as signal_:  # before any item ran (probing, loading the model)
            raise Interrupted(signal_.signum, summary.done, len(todo) - summary.done) from None
        finally:
            pool.close()


def _check_then(then: Sequence[Then], keep: bool, settings: ExtractSettings,
                options: RunOptions) -> None:
    """What a pass with ``then`` steps cannot do, refused before anything exists."""
    for step in then:
        check_name(step.name)
    if not then:
        return
    if settings.sample_descriptors is not None:
        raise ParameterError("then", "steps run on each item's features or encoding, not on "
                             "a sample of its descriptors (--sample-descriptors)")
    if options.executor == "dask":
        raise ParameterError("executor", "steps fused into an extraction (--temporal, or a "
                             "pipeline's fused steps) run with the local and slurm executors; "
                             "run them as separate commands with --executor dask")
    if not keep and not any(step.kept for step in then):
        raise ParameterError("then", "nothing would be written: keep the extraction or "
                             "name a step")


@dataclasses.dataclass
class _Chain:
    """The steps of a pass (:mod:`featpipe.chain`), planned: each step, its stage and the
    store name it gets (kept steps only); whether the extraction's own stage is written
    (``keep``) and each step's item size, ``(fixed, per frame)`` bytes (:func:`_chain_sizes`)."""

    steps: list[ChainStep]
    stages: list[Stage]
    names: list[str | None]
    keep: bool = True
    sizes: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    #: kept steps whose stage is a view of the extraction's (fisher-group of kept per-frame
    #: vectors: a column range, nothing copied, :meth:`featpipe.store.Stage.make_view`)
    views: list[bool] = dataclasses.field(default_factory=list)

    def written(self) -> list[tuple[Stage, str | None]]:
        """The stages of kept steps (views included), with their names."""
        return [(stage, name) for step, stage, name, view in
                zip(self.steps, self.stages, self.names, self.views, strict=True)
                if step.keep or view]


def _plan_chain(store: Store, source: Stage, then: Sequence[Then], keep: bool,
                reporter: Reporter, create: bool) -> _Chain:
    """Each step's stage as ``featpipe encode`` plans it on the stage of the step it reads
    (``source`` for the first ones), created (record only) unless planning a dry run."""
    from featpipe.encode.registry import load_method
    from featpipe.stages.encoding import plan_encode, view_of

    chain = _Chain([], [], [], keep)
    index: dict[str, int] = {}
    for step in then:
        parent = source if step.input is None else chain.stages[index[step.input]]
        try:
            view = step.kept and keep and step.input is None and \
                load_method(step.method).view is not None
        except KeyError:
            view = False  # an unknown method: plan_encode says so
        try:
            stage, _, compute, _ = plan_encode(store, parent, step.method, step.params,
                                               reporter=reporter, create=create, retried=True,
                                               view=view)
        except ParameterError as err:
            raise ParameterError(err.param, f"{err.cause} (step {step.key}, "
                                 f"{step.method})") from None
        index[step.key] = len(chain.steps)
        if view and create:
            view_of(stage, compute)
        chain.steps.append(ChainStep(
            step.key, step.method, dict(compute.params),
            {k: str(p) for k, p in compute.model_paths.items()},
            -1 if step.input is None else index[step.input], str(stage.path), stage.dtype.name,
            step.kept and not view))
        chain.stages.append(stage)
        chain.names.append(step.name)
        chain.views.append(view)
    return chain


def _chain_sizes(chain: _Chain, layout: Layout) -> list[tuple[int, int]]:
    """Bytes at rest of each step's item as ``(fixed, per frame)``, measured on synthetic
    items of 2 and 3 frames shaped as the extraction's (:func:`synthetic_item`); a step that
    cannot take them is an error before anything runs."""
    if not chain.steps:
        return []
    runner = ChainRunner(chain.steps)
    every = set(range(len(chain.steps)))
    measured = []
    for frames in (2, 3):
        array, extras = synthetic_item(layout, frames)
        try:
            out = runner.run("size-check", array, extras, every)
        except ItemError as err:
            raise FeatpipeError(f"the steps after the extraction cannot take its items: "
                                f"{err.cause}") from None
        measured.append([item_bytes(pending.array, pending.sidecars) for _, pending in out])
    return [(2 * two - three, three - two) for two, three in zip(*measured, strict=True)]


#: local features per frame of a synthetic item (:func:`synthetic_item`)
SYNTHETIC_ROWS = 4


def synthetic_item(layout: Layout, frames: int) -> tuple[np.ndarray, dict]:
    """An item of ``frames`` sampled frames shaped as an extraction with ``layout`` stores
    it (random values, seeded; floats of the layout's item size), with its sidecars: what a
    step after the extraction is checked and sized on before any video is decoded."""
    rng = np.random.default_rng(frames)
    dtype = np.dtype(f"f{layout.itemsize}")
    stamps = np.arange(frames, dtype=np.float64) / 25.0
    if layout.kind == "sample":
        rows = min(frames * SYNTHETIC_ROWS, layout.sample)
        return rng.standard_normal((rows, layout.dim)).astype(np.float32), {}
    if layout.kind == "encode":
        if not layout.per_frame:
            return rng.standard_normal(layout.code_dim).astype(dtype), {}
        return rng.standard_normal((frames, layout.code_dim)).astype(dtype), {
            "frame_index": np.arange(frames, dtype=np.int64), "timestamps": stamps}
    if not layout.local:  # one vector per frame (fc6)
        return rng.standard_normal((frames, layout.dim)).astype(dtype), {"timestamps": stamps}
    rows = frames * SYNTHETIC_ROWS
    extras = {"frame_index": np.repeat(np.arange(frames, dtype=np.int32), SYNTHETIC_ROWS),
              "timestamps": stamps, "image_size": np.array([64, 64], np.int64)}
    if layout.positions:
        extras["positions"] = np.c_[rng.uniform(0, 64, (rows, 2)),
                                    np.full(rows, 4.0)].astype(np.float32)
    return np.abs(rng.standard_normal((rows, layout.dim))).astype(dtype), extras


def _plan_pass(stage: Stage, chain: _Chain, ids, force: bool, shard):
    """The items this pass computes (those missing from any stage it writes), the summary
    of the others, and what to write of an item that some of those stages have already
    (``FrameSinks.partial``)."""
    written = ([(-1, stage)] if chain.keep else []) + \
        [(i, s) for i, (step, s) in enumerate(zip(chain.steps, chain.stages, strict=True))
         if step.keep]
    missing: dict[str, set[int]] = {}
    not_in_shard = 0
    for index, output in written:
        todo, counts = plan(output, ids, force=force, shard=shard)
        not_in_shard = counts.not_in_shard
        for item_id in todo:
            missing.setdefault(item_id, set()).add(index)
    every = {index for index, _ in written}
    todo = [i for i in ids if i in missing]
    summary = RunSummary(skipped=len(ids) - not_in_shard - len(todo), not_in_shard=not_in_shard)
    partial = {i: frozenset(w) for i, w in missing.items() if w != every}
    return todo, summary, partial


def _calibrate(item: tuple[str, str], estimates, sampling: Sampling, chosen: Chosen,
               sinks: FrameSinks, chain: _Chain, settings: ExtractSettings,
               reporter: Reporter) -> float | None:
    """The CPU time of the whole stage, from a short calibration: the first
    :data:`CALIBRATION_FRAMES` sampled frames of the first item decoded, their features
    computed and encoded (and the steps of the pass run) in this process, the CPU time of
    all its threads after the first :data:`CALIBRATION_WARMUP` frames divided by the frames
    timed, times the frames of every item (a network: one batch of
    :data:`CALIBRATION_BATCH` frames, seeded random weights when the file is missing)."""
    import tempfile
    import time

    from featpipe.io.video import iter_frames

    item_id, path = item
    frames = sum(e.frames or 0 for e in estimates)
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
                for count, (seconds, frame) in enumerate(iter_frames(path, sampling)):
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
                seconds = time.process_time() - started if started is not None else None
                how = (f"decoding, extracting and encoding {timed} frames of {item_id} after "
                       f"the first {CALIBRATION_WARMUP}")
    except (FeatpipeError, OSError, RuntimeError) as err:
        reporter.warn(f"dry run: no CPU estimate ({err})")
        return None
    if not timed or seconds is None:
        reporter.info(f"dry run: no CPU estimate ({item_id} has fewer than "
                      f"{CALIBRATION_WARMUP + 1} sampled frames)")
        return None
    total = seconds / timed * frames
    reporter.info(f"dry run: about {cpu_duration(total)} of CPU ({1000 * seconds / timed:.1f} ms a "
                  f"frame, the CPU time of this process {how}, times {frames:,} frames)")
    return total


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


def cpu_duration(seconds: float, hours: str = "hours", minutes: str = "minutes") -> str:
    """'3.2 hours' / '14.7 minutes' / '41 s' for a dry run's CPU estimate (the plan table
    passes "h" and "min")."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} {hours}"
    if seconds >= 60:
        return f"{seconds / 60:.1f} {minutes}"
    return f"{seconds:.0f} s"


def _estimates(pool, paths, ids, sampling, layout) -> list:
    """Each item's estimate (frames, rows, bytes) from its container's frame count, rate and
    size (probed by the decoding workers)."""
    infos = probe_infos(pool, paths, ids)
    return [estimate_item(i, infos[i], sampling, layout) for i in ids]


def _pass_estimates(estimates, chain: _Chain) -> list[ItemEstimate]:
    """Each item's estimate with the bytes of what the pass writes: the extraction's item
    when it is kept, and each kept step's (``sizes``: :func:`_chain_sizes`)."""
    out = []
    for estimate in estimates:
        if estimate.bytes is None or not chain.steps:
            out.append(estimate)
            continue
        steps = sum(fixed + per_frame * estimate.frames for (fixed, per_frame), step
                    in zip(chain.sizes, chain.steps, strict=True) if step.keep)
        out.append(dataclasses.replace(estimate, bytes=steps + (estimate.bytes if chain.keep
                                                                  else 0)))
    return out


def _plan_items(stage: Stage, chain: _Chain, layout: Layout, estimates) -> None:
    """What the later steps of a dry run plan on (:class:`~featpipe.stages.dryrun.
    PlannedItems`): the extraction's items and each step's, sized by each item's frames."""
    frames = {e.item_id: e.frames for e in estimates if e.frames is not None}
    rows = {e.item_id: e.rows if layout.kind != "sample" else min(e.rows, layout.sample)
            for e in estimates if e.rows is not None}

    def example(count: int):
        return synthetic_item(layout, count)

    stage.planned_items = PlannedItems(example, frames, rows)
    runner = ChainRunner(chain.steps)
    for index, step_stage in enumerate(chain.stages):
        def step_example(count: int, index=index):
            array, extras = example(count)
            (_, pending), = runner.run("dry-run", array, extras, {index})
            return pending.array, pending.sidecars

        step_stage.planned_items = PlannedItems(step_example, frames)


def _dry_run(store, stage, name, chain: _Chain, layout: Layout, estimates, summary,
             reporter) -> StageRun:
    """List the work with its estimate; create nothing."""
    keep = chain.keep
    written = []
    if keep:
        written.append((stage, name, [e.bytes for e in estimates]))
    for step, step_stage, step_name, (fixed, per_frame), view in zip(
            chain.steps, chain.stages, chain.names, chain.sizes, chain.views, strict=True):
        if step.keep:
            written.append((step_stage, step_name, [None if e.bytes is None else
                                                    fixed + per_frame * e.frames
                                                    for e in estimates]))
        elif view:  # a view of the extraction's stage: a record, no items
            written.append((step_stage, step_name, [0 for _ in estimates]))
    for output, output_name, _ in written:
        label = f" as {output_name!r}" if output_name else ""
        created = (output.path / "stage.json").exists()
        reporter.info(f"stage {output.name}{label}" + ("" if created else
                                                        " (not created: dry run)"))
    unwritten = ([f"{stage.name} (the extraction)"] if not keep else []) + [
        f"{step_stage.name} ({step.label}: {step.method})"
        for step, step_stage in zip(chain.steps, chain.stages, strict=True) if not step.keep]
    if chain.steps and unwritten:
        reporter.info(f"in this pass, not written: {', '.join(unwritten)}")
    _plan_items(stage, chain, layout, estimates)
    passed = _pass_estimates(estimates, chain)
    for estimate in passed:
        reporter.info(f"would compute {estimate.item_id}: {describe(estimate)}")
    totals = Totals.of(passed)
    todo = [e.item_id for e in estimates]
    reporter.info(f"dry run: {len(todo)} to compute, {summary.skipped} already complete; "
                  f"about {totals.frames:,} frames, {totals.rows:,} rows, "
                  f"{human_bytes(totals.bytes)} at rest (free on the store's disk: "
                  f"{human_bytes(free_bytes(store.root))})")
    sizes = []
    for output, output_name, each in written:
        known = [b for b in each if b is not None]
        total = round(sum(known) * len(each) / len(known)) if known else 0
        sizes.append(Written(output, output_name, total))
        if len(written) > 1:
            reporter.info(f"  {output_name or output.name}: {human_bytes(total)} at rest")
    return StageRun(stage, summary, todo, sizes)


def _check_disk(store, estimates, n_todo: int, disk_check: bool) -> Totals:
    """The stage's size from the estimates of a sample of its ``n_todo`` items; refused if
    the disk is too small."""
    if not n_todo:
        return Totals(0, 0, 0, 0)
    totals = Totals.of(estimates, n_todo)
    free = free_bytes(store.root)
    if disk_check and totals.bytes > free:
        raise FeatpipeError(
            f"this stage needs about {human_bytes(totals.bytes)} for {n_todo} items "
            f"({totals.frames:,} frames) but the store's disk has {human_bytes(free)} free: "
            "sample fewer frames (--fps/--every/--frames), shrink them (--max-pixels, "
            "--step), encode while extracting (--encode), or pass --no-disk-check")
    return totals


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


def _run(stage, extraction: Extraction, todo: list[tuple[str, str]], summary, total: Totals,
         options: RunOptions, reporter: Reporter, name: str | None) -> StageRun:
    """Run the items ``todo`` (id, path) in this process's pipeline: progress in frames, one
    summary line, the first failure ends the run with ``on_error='fail'``; a signal or a store
    that cannot be written (disk full) ends it cleanly, with one line."""
    extraction.on_warning = lambda item_id, text: reporter.warn(f"warning: {item_id}: {text}")
    runs = extraction.run(todo)
    try:
        label = f"{stage.kind} {name}" if name else stage.kind
        with reporter.progress(total.frames if todo else 0, label,
                               unit="frames") as progress:
            extraction.on_frames = progress.advance
            for item_id, error in runs:
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

