"""The plan of an extraction, built in one place before anything runs: the features and their
parameters, the frame sampling, what an item holds (stored features, an ``--encode`` method's
output, a sample), the steps of its pass (``--temporal``, a pipeline's fused steps) and their
stages, the items to compute, their sizes at rest and (a dry run) their CPU time.

:func:`plan_extraction` reads what it needs of the store once (the ``--pca`` and model stages,
the stages the pass would write and what they hold already, the content hashes of the
manifest's files) and checks every parameter, item kind and projection: a problem is an error
before any stage exists (a dry run lists a missing weights file instead, and plans on).
:meth:`ExtractionPlan.estimate` adds each item's frames, rows and bytes from its container
(probed by the decoding workers: every item for a dry run, a sample otherwise);
:meth:`ExtractionPlan.dry_run` reports the plan (its nodes: :mod:`featpipe.plan`), calibrated
by :mod:`featpipe.stages.calibration`; :func:`featpipe.stages.extraction.extract` runs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from featpipe.chain import ChainRunner, ChainStep, Then, order_steps
from featpipe.errors import FeatpipeError, ItemError, ParameterError
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
from featpipe.extract.streaming import FrameSinks
from featpipe.io.images import is_image
from featpipe.io.video import Sampling
from featpipe.item_kinds import ItemKind, check_input, extraction_kind
from featpipe.manifest import Manifest, missing_file, row_fix
from featpipe.parallel import RunSummary, make_executor, parse_shard, plan
from featpipe.parameters import parameter_record, typed_value
from featpipe.reporting import Reporter
from featpipe.stages.base import (
    THIS_STEP,
    RunOptions,
    StageRun,
    Written,
    check_name,
    content_hashes,
    node_of,
)
from featpipe.stages.dryrun import PlannedItems, affine, item_bytes, planning_quickly
from featpipe.store import Stage, Store
from featpipe.store.content import ContentHashes

#: items probed to estimate a real run's size (a dry run probes every item)
ESTIMATE_SAMPLE = 64
#: the weights' place in the key of a dry run's stage whose weights file is missing (its
#: key, and those of the stages after it, are provisional; the problem is listed)
MISSING_WEIGHTS = "missing"


@dataclasses.dataclass
class ExtractionPlan:
    """An extraction, planned (:func:`plan_extraction`): what it extracts and how
    (``chosen``, ``sampling``, ``settings``), its key's record (``params``), input stages and
    outputs (``sinks``, ``layout``; ``read``: each item's file hash as keyed), its stage and
    the steps of its pass (planned, nothing on disk), the items it computes with the summary
    of the others and what to write of those some stages have already (``partial``), the
    problems a dry run found, and (after :meth:`estimate`) the items' estimates."""

    store: Store
    manifest: Manifest
    chosen: Chosen
    sampling: Sampling
    settings: ExtractSettings
    options: RunOptions
    params: dict
    inputs: list
    sinks: FrameSinks
    layout: Layout
    read: dict
    hashes: ContentHashes
    then: list[Then]
    keep: bool
    stage: Stage
    chain: _Chain
    todo: list[str]
    summary: RunSummary
    partial: dict
    problems: list[str]
    estimates: list[ItemEstimate] = dataclasses.field(default_factory=list)

    @property
    def paths(self) -> dict[str, str]:
        return {it.id: str(self.manifest.resolve_path(it)) for it in self.manifest}

    @property
    def shard(self):
        return parse_shard(self.options.shard)

    def estimate(self, pool) -> None:
        """Each item's frames, rows and bytes from what its container says (all the items
        to compute for a dry run, a sample otherwise, :data:`ESTIMATE_SAMPLE`)."""
        full = self.options.dry_run and not planning_quickly()
        probed = self.todo if full else sample_ids(self.todo, ESTIMATE_SAMPLE)
        infos = probe_infos(pool, self.paths, probed)
        self.estimates = [estimate_item(i, infos[i], self.sampling, self.layout)
                          for i in probed]

    def check_disk(self) -> Totals:
        """The size at rest of what the pass writes, from :attr:`estimates`; refused when it
        does not fit on the store's disk (unless ``disk_check`` is off)."""
        return _check_disk(self.store, _pass_estimates(self.estimates, self.chain),
                           len(self.todo), self.settings.disk_check)

    def dry_run(self, name: str | None, calibration, reporter: Reporter) -> StageRun:
        """The plan reported (:func:`_dry_run`), with what ``calibration`` measured
        (:class:`featpipe.stages.calibration.Calibration`; None: not calibrated)."""
        if calibration is not None:
            self.estimates = calibration.rescaled(self.estimates, self.layout)
        run = _dry_run(self.store, self.stage, name, self.chain, self.layout,
                       _Work(self.todo, self.estimates, self.summary), reporter)
        run.problems = self.problems
        run.cpu_seconds = run.nodes[0].cpu = None if calibration is None else \
            calibration.cpu_seconds
        return run


def plan_extraction(store: Store, manifest: Manifest, features: str, params: Mapping | None,
                    sampling: Sampling | None, settings: ExtractSettings | None,
                    options: RunOptions, reporter: Reporter) -> ExtractionPlan:
    """The plan of ``featpipe.stages.extract`` with these arguments (its docstring), every
    parameter checked and every stage it reads resolved, before any stage exists."""
    sampling = (sampling or Sampling()).validate()
    settings = settings or ExtractSettings()
    chosen = choose_features(features, params)
    settings.check(chosen.method)
    then = order_steps(settings.then)
    keep = not then if settings.keep is None else bool(settings.keep)
    _check_then(then, keep, settings, options)
    if settings.sample_window is not None:
        if sampling != Sampling():
            raise ParameterError("sample_window", "takes consecutive frames: not with --fps, "
                                 "--every or --frames")
        sampling = Sampling(window=int(typed_value(settings.sample_window, (int,))),
                            window_seed=int(typed_value(settings.sample_seed, (int,))))
    if chosen.method.default_fps is not None and sampling == Sampling():
        sampling = Sampling(fps=chosen.method.default_fps)
    if settings.human_boxes is not None:
        if sampling.fps is not None or sampling.frames is not None:
            raise ParameterError("human_boxes", "are given per video frame: sample every frame "
                                 "or every N-th (--every N), not --fps or --frames")
        settings = dataclasses.replace(settings,
                                       human_boxes=str(Path(settings.human_boxes).resolve()))
    hashes = content_hashes(store)
    problems: list[str] = []
    if not manifest.ids:
        raise FeatpipeError("the manifest has no items")
    read: dict[str, str | None] = {}
    key = _feature_key(manifest, chosen, sampling, settings, hashes, read,
                       problems if options.dry_run else None)
    _check_files(manifest, read, options, problems)
    estimator = chosen.estimator()
    dim, pca_stage = _projection(store, settings.pca, chosen.method.name,
                                 int(estimator.n_features))
    inputs = [pca_stage] if pca_stage is not None else []
    sinks = FrameSinks("", local=chosen.method.local, positions=settings.positions,
                       pca_path=None if pca_stage is None else str(pca_stage.path))
    layout, sinks, made, models = _items(store, chosen, settings, estimator, dim, sinks,
                                         extraction_kind(key))
    key.update(made)
    inputs += list(models.values())
    shard = parse_shard(options.shard)
    if options.executor != "dask":
        make_executor(options.executor).check_shard(shard)
    stage = store.stage("extract", key, inputs=inputs, items=manifest, dtype=settings.dtype,
                        create=False)
    chain = plan_chain(store, stage, then, keep, reporter, create=False)
    chain.sizes = _chain_sizes(chain, layout)
    todo, summary, partial = plan_pass(stage, chain, manifest.ids, options.force, shard)
    return ExtractionPlan(store, manifest, chosen, sampling, settings, options, key, inputs,
                          sinks, layout, read, hashes, then, keep, stage, chain, todo, summary,
                          partial, problems)


def manifest_digest(manifest: Manifest, hashes: ContentHashes,
                    read: dict[str, str | None] | None = None) -> str:
    """sha256 of the manifest rows, in order: id, the content of its file (size and SHA-256,
    :mod:`featpipe.store.content`; a missing file as missing), labels, splits.  A rewritten video
    gives a new stage; a moved or touched one keeps it.  ``read`` (when given) receives each
    item's SHA-256 (None: no file), for :func:`featpipe.store.content.read_hashes_record`."""
    rows = []
    for it in manifest:
        path = manifest.resolve_path(it)
        content = list(hashes.file_hash(path)) if path.is_file() else None
        rows.append([it.id, content, list(it.labels), list(it.splits)])
        if read is not None:
            read[it.id] = None if content is None else content[1]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=True).encode()).hexdigest()[:16]


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


def _check_files(manifest: Manifest, read: Mapping[str, str | None], options: RunOptions,
                 problems: list[str]) -> None:
    """Items whose file is missing (``read``: no hash) cannot finish a stage that fails on
    an item (``on_error='fail'``): refused before any work, naming the first row and the way
    out (a dry run lists it); with ``on_error='skip'`` they fail as items."""
    missing = [item_id for item_id, sha in read.items() if sha is None]
    if not missing or options.on_error != "fail":
        return
    first = missing[0]
    text = (f"{len(missing)} item(s) have no file (first: {first!r}: "
            f"{missing_file(manifest.resolve_path(manifest[first]))}; "
            f"{row_fix(manifest, first)}), or --on-error skip computes the others")
    if options.dry_run:
        problems.append(text)
        return
    raise FeatpipeError(text + ": nothing was computed")


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
           sinks: FrameSinks, features: ItemKind | None):
    """What an item holds: (its size layout, the sinks, the key's record of it, the model
    stages an encoder reads); ``features``: the item kind of the features."""
    rows_per_frame, local = estimator.count, chosen.method.local
    itemsize = np.dtype(settings.dtype).itemsize
    if settings.encode is not None:
        sinks, layout, models, encoded = _encoder_plan(
            store, settings, sinks, (rows_per_frame, dim, itemsize), features,
            chain=(chosen.method.name, int(estimator.n_features), settings.pca,
                   tuple(g for g, _ in estimator.groups()) if hasattr(estimator, "groups")
                   else None))
        return layout, sinks, {"encode": encoded}, models
    if settings.sample_descriptors is not None:
        rows = int(typed_value(settings.sample_descriptors, (int,)))
        seed = int(typed_value(settings.sample_seed, (int,)))
        sinks = dataclasses.replace(sinks, kind="sample", sample=rows, seed=seed)
        layout = Layout(rows_per_frame, dim, 4, kind="sample", sample=rows)
        record = {"rows": rows, "seed": seed}
        if settings.sample_window is not None:  # (keys without a window stay as they were)
            record["window"] = int(typed_value(settings.sample_window, (int,)))
        return layout, sinks, {"sample": record}, {}
    layout = Layout(rows_per_frame, dim, itemsize, local=local, positions=settings.positions)
    return layout, sinks, ({"positions": settings.positions} if local else {}), {}


def _encoder_plan(store, settings: ExtractSettings, outputs, shape, features, chain):
    """The encoder of ``extract --encode``: ``featpipe encode``'s method, parameters (an
    encoder with a device runs on ``settings.device`` unless told otherwise) and model
    stages (so its stage key says the same), checked on a synthetic frame and against the
    features' item kind ``features``; ``shape`` is (rows per frame, dimension, item size) of
    the features."""
    from featpipe.encode.registry import load_methods
    from featpipe.stages.encoding import method_models

    rows_per_frame, dim, itemsize = shape
    method = settings.encode
    chosen = load_methods()[method]
    given = dict(settings.encode_params or {})
    if "device" in chosen.defaults:
        given.setdefault("device", settings.device)
    params, models = method_models(store, chosen, given)
    check_input(method, chosen.kinds, params, features, "the features", "encode")
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


def plan_chain(store: Store, source: Stage, then: Sequence[Then], keep: bool,
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
            stage, _, compute, _ = plan_encode(
                store, parent, step.method, step.params, reporter=reporter, create=create,
                retried=True, view=view, param="temporal",
                source_label="the extraction" if step.input is None else f"step {step.input!r}")
        except ParameterError as err:
            error = ParameterError(err.param, f"{err.cause} (step {step.key}, {step.method})")
            error.step = step.key  # the step of the pass whose plan fails (a pipeline's)
            raise error from None
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
    return [affine(two, three) for two, three in zip(*measured, strict=True)]


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


def plan_pass(stage: Stage, chain: _Chain, ids, force: bool, shard):
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


@dataclasses.dataclass
class _Work:
    """What a pass computes: the items ``todo``, the estimates of all of them or of a sample
    (:func:`featpipe.stages.dryrun.quick_plan`), and the summary of the others."""

    todo: list[str]
    estimates: list[ItemEstimate]
    summary: RunSummary


def _dry_run(store, stage, name, chain: _Chain, layout: Layout, work: _Work,
             reporter) -> StageRun:
    """List the work with its estimate; create nothing.  The run's nodes are the extraction
    and each step of its pass, written or not."""

    todo, estimates, summary = work.todo, work.estimates, work.summary
    keep, fused = chain.keep, bool(chain.steps)
    host = THIS_STEP if fused else None
    each = {stage.name: [e.bytes for e in estimates] if keep else None}
    for step, step_stage, (fixed, per_frame), view in zip(
            chain.steps, chain.stages, chain.sizes, chain.views, strict=True):
        each[step_stage.name] = [None if e.bytes is None else fixed + per_frame * e.frames
                                 for e in estimates] if step.keep else \
            [0 for _ in estimates] if view else None  # a view: a record, no items
    nodes = [node_of(stage, name if keep else None, written=keep, pass_step=host,
                     todo=len(todo))]
    nodes += [node_of(step_stage, step_name, written=each[step_stage.name] is not None,
                      step=step.label, pass_step=host, todo=len(todo))
              for step, step_stage, step_name in zip(chain.steps, chain.stages, chain.names,
                                                     strict=True)]
    written = []
    for node, output in zip(nodes, [stage, *chain.stages], strict=True):
        sizes = each[output.name]
        if sizes is None:
            continue
        known = [b for b in sizes if b is not None]
        node.bytes = round(sum(known) * len(todo) / len(known)) if known else 0
        written.append(Written(output, node.name, node.bytes))
        created = (output.path / "stage.json").exists()
        reporter.info(f"stage {output.name}" + (f" as {node.name!r}" if node.name else "")
                      + ("" if created else " (not created: dry run)"))
    unwritten = ([f"{stage.name} (the extraction)"] if not keep else []) + [
        f"{step_stage.name} ({step.label}: {step.method})"
        for step, step_stage, node in zip(chain.steps, chain.stages, nodes[1:], strict=True)
        if not node.written]
    if fused and unwritten:
        reporter.info(f"in this pass, not written: {', '.join(unwritten)}")
    _plan_items(stage, chain, layout, estimates)
    passed = _pass_estimates(estimates, chain)
    for estimate in passed:
        reporter.info(f"would compute {estimate.item_id}: {describe(estimate)}")
    totals = Totals.of(passed, len(todo))
    reporter.info(f"dry run: {len(todo)} to compute, {summary.skipped} already complete; "
                  f"about {totals.frames:,} frames, {totals.rows:,} rows, "
                  f"{human_bytes(totals.bytes)} at rest (free on the store's disk: "
                  f"{human_bytes(free_bytes(store.root))})")
    if len(written) > 1:
        for output in written:
            reporter.info(f"  {output.name or output.stage.name}: {human_bytes(output.bytes)} "
                          "at rest")
    return StageRun(stage, summary, list(todo), written, nodes=nodes)


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
