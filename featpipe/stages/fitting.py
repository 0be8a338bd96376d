"""The ``fit`` stages: models fitted once on the train items of a stage.

Each function checks its parameters (the estimator's constraints, :mod:`featpipe.parameters`),
then creates (or finds) a model stage keyed by them and its input, fits the model unless it is
already fitted (``force`` refits), saves it through the model contract
(:mod:`featpipe.models`), names the stage and returns it.  The estimator's parameters are
passed as keyword arguments (``**params``) and declared only by the estimator.

- :func:`fit_pca`: PCA of descriptors (e.g. SIFT 128 -> 64), :class:`PCAProjection`.
- :func:`fit_gmm`: a diagonal GMM by EM (VLFeat rules), :class:`GaussianMixtureModel`.
- :func:`fit_deep_gmm`: the GMM learned with the SVM (deep Fisher kernel, Algorithm 1).
- :func:`fit_dhrp`: discriminative hierarchical rank pooling (seed paper section 4.4).
- :func:`fit_gmsop`: gated mixture of second-order pooling (NeurIPS'18).
- :func:`fit_standardize`: per-channel mean and standard deviation of the train frames.

Descriptors for PCA and the GMM are sampled by :func:`sample_descriptors`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import time
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval

from featpipe.errors import FeatpipeError, ItemError, ParameterError
from featpipe.extract.groups import MODEL_NAME as GROUPS_MODEL
from featpipe.item_kinds import FITS, check_input, item_kind
from featpipe.manifest import Manifest
from featpipe.models import json_params
from featpipe.parameters import (
    check_params,
    estimator_parameters,
    parameter_record,
    typed_value,
)
from featpipe.stages.base import (
    RUNNING,
    Reporter,
    announce,
    check_name,
    mark_running,
    name_stage,
    train_item_ids,
)
from featpipe.stages.dryrun import input_width, sampled_rows, stand_in_rows
from featpipe.store import Stage, Store

log = logging.getLogger(__name__)


def _already(stage: Stage, model: str, force: bool, store: Store, name: str | None,
             reporter: Reporter, dry_run: bool = False) -> bool:
    """Whether the model is fitted (and kept) or this is a dry run; names a fitted stage."""
    if dry_run:
        fitted = stage.has_model(model) and not force
        reporter.info("dry run: " + ("model already fitted" if fitted else "would fit"))
        return True
    if stage.has_model(model) and not force:
        name_stage(store, name, stage, reporter)
        reporter.info("model already fitted (use --force to refit)")
        reporter.info("summary: 0 fitted, 1 skipped (already complete), 0 failed")
        return True
    return False


#: The fit stages' own parameters (beside their estimator's), typed in the stage key as the
#: estimators' parameters are (:func:`featpipe.parameters.typed_value`).
STAGE_CONSTRAINTS = {
    "sample": [Interval(Integral, 0, None, closed="left"), None],
    "random_state": [Interval(Integral, 0, None, closed="left")],
    "split": [Interval(Integral, 1, None, closed="left")],
    "val_fraction": [Interval(Real, 0, 1, closed="left")],
    "pca_dim": [Interval(Integral, 1, None, closed="left"), None],
    "pca_fraction": [Interval(Real, 0, 1, closed="right"), None],
    "fraction": [Interval(Real, 0, 1, closed="right"), None],
    "groups": [str, None],
}


def _typed(**values) -> tuple:
    """The fit stage's own parameters typed and checked as declared
    (:data:`STAGE_CONSTRAINTS`), in order."""
    typed = {k: typed_value(v, STAGE_CONSTRAINTS[k]) for k, v in values.items()}
    check_params(STAGE_CONSTRAINTS, typed)
    return tuple(typed.values())


def _model_stage(store: Store, kind: str, record: dict, inputs: list[Stage], model_name: str,
                 *, name: str | None, force: bool, dry_run: bool, reporter: Reporter,
                 **stage_params) -> tuple[Stage, bool]:
    """The model stage keyed by the estimator's parameter ``record`` (not its device: that
    changes where it is fitted, not what) and ``stage_params`` (typed by :func:`_typed`),
    announced; and whether there is nothing to fit (the model is fitted and kept, the stage
    then named, or this is a dry run)."""
    key = {k: v for k, v in json_params(record).items() if k != "device"}
    left_out = _input_failed(inputs[0], stage_params.get("split", 1))
    stage = store.stage(kind, {**key, **stage_params, **left_out},
                        inputs=inputs, items=Manifest([]), create=not dry_run)
    announce(stage, name, reporter)
    nothing_to_fit = _already(stage, model_name, force, store, name, reporter, dry_run)
    if not nothing_to_fit:
        _mark_running(store, name, stage)
    return stage, nothing_to_fit


#: The runs each fit function being called has marked (innermost call last).
_marked: list[list[tuple[Store, str | None, Stage]]] = []


def _mark_running(store: Store, name: str | None, stage: Stage) -> None:
    """:func:`~featpipe.stages.base.mark_running`, remembered for
    :func:`_unmarked_on_failure`."""
    mark_running(store, name, stage)
    if _marked:
        _marked[-1].append((store, name, stage))


def _unmarked_on_failure(fit):
    """A fit function whose failure (an error, not a signal) leaves no run marker: a failed
    fit keeps no partial work and its rerun fails the same way, so its stage's process
    marker and its name's unfinished-run marker go, and ``cache gc`` collects the stage it
    left without a model.  An interrupted fit (Ctrl-C, SIGTERM), like a killed one, keeps
    its name's marker: ``featpipe status NAME`` follows it and the same command fits it."""

    @functools.wraps(fit)
    def run(*args, **kwargs):
        _marked.append([])
        try:
            return fit(*args, **kwargs)
        except Exception:
            for store, name, stage in _marked[-1]:
                stage.unmark_running()
                marker = store.names_dir / RUNNING / name if name else None
                with contextlib.suppress(OSError, FeatpipeError):
                    if marker is not None and \
                            store.read_pointer(marker, name, "run of") == stage.name:
                        marker.unlink()
            raise
        finally:
            _marked.pop()

    return run
class _WarningsOnly(Reporter):
    """Forwards only the warnings of a stand-in fit (its figures describe synthetic rows)."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def warn(self, text: str) -> None:
        self.reporter.warn(text)


def _stand_in_stage(stage: Stage, model: str, dry_run: bool, source: Stage,
                    ids) -> tuple[Stage, bool]:
    """In a dry run whose model is not fitted, the planned stage that receives a stand-in of
    it (:mod:`featpipe.stages.dryrun`: nothing is written, even to a stage folder that
    exists), and True; else ``stage`` and False (also when the input's rows are not known
    yet: the steps after the fit then wait for it)."""
    if not dry_run or stage.has_model(model):
        return stage, False
    try:
        input_width(source, ids)
    except ValueError:
        return stage, False
    if stage.exists:
        stage = Stage(stage.path, meta=stage.meta, items=Manifest([], root=stage.path))
    return stage, True


def _input_failed(source: Stage, split: int) -> dict:
    """``{"input_failed": ids}`` for the train items of ``split`` that failed in ``source``
    (left out of the fit by :func:`train_item_ids`), else nothing: part of the fit stage's
    key."""
    failed = source.failed() if source.items.ids else {}
    left_out = [i for i in source.items.split_ids(split, "train") if i in failed] \
        if failed else []
    return {"input_failed": left_out} if left_out else {}


def _fitted(store: Store, name: str | None, stage: Stage, reporter: Reporter) -> None:
    """The model is saved: the name moves to the stage, which is no longer running."""
    name_stage(store, name, stage, reporter)
    stage.unmark_running()


#: The estimator of each fit function (``module:class``), whose parameters it takes as
#: keyword arguments (``fit_standardize`` takes none).
ESTIMATORS = {
    "fit_pca": "featpipe.extract.pca:PCAProjection",
    "fit_gmm": "featpipe.encode.fisher:GaussianMixtureModel",
    "fit_deep_gmm": "featpipe.learn.deep_fisher:DeepFisherKernel",
    "fit_dhrp": "featpipe.learn.dhrp:DiscriminativeRankPooling",
    "fit_gmsop": "featpipe.learn.gmsop:GatedMixtureSOP",
}


def fit_input(store: Store, input: str, fit: str) -> Stage:
    """The input stage of ``fit FIT``, refused (a ParameterError) when its items are of a kind
    the fit does not take (:data:`featpipe.item_kinds.FITS`)."""
    source = store.resolve(input)
    check_input(f"fit {fit}", FITS[fit], {}, item_kind(source), repr(input))
    return source


def estimator_of(function: str) -> type:
    """The estimator class whose parameters fit function ``function`` takes."""
    module, _, name = ESTIMATORS[function].partition(":")
    return getattr(importlib.import_module(module), name)


def estimator_record(cls, params: dict) -> dict:
    """The canonical record of ``cls``'s parameters (:func:`parameter_record`: every one,
    defaults filled, typed), checked against ``cls``'s declarations (unknown names refused)."""
    record = parameter_record(estimator_parameters(cls, exclude=("xp",)), params, cls.__name__)
    cls.check_param_values(record)
    return record


# -- descriptor samples ---------------------------------------------------------------------

def _as_descriptors(array: np.ndarray, item_id: str) -> np.ndarray:
    if array.ndim == 3:
        array = array.reshape(-1, array.shape[-1])
    if array.ndim != 2:
        raise ItemError(item_id, f"expected descriptors (N, D) or (F, n, D), got shape "
                                 f"{array.shape}")
    return array


def sample_descriptors(source: Stage, ids: Sequence[str], sample: int | None,
                       seed: int) -> np.ndarray:
    """A seeded sample of at most ``sample`` descriptors of the items ``ids`` (float32).

    Every item gives up to ⌈sample / items⌉ descriptors chosen without replacement, then the
    pool is cut to ``sample`` at random; ``None`` keeps every descriptor.  This is VLFeat's
    ``trainEncoder`` rule (``vl_colsubset`` of ⌈n / images⌉ descriptors per image), so that one
    long video does not make the vocabulary; only the rows drawn are read (memory-mapped).
    """
    rng = np.random.default_rng(seed)
    per_item = None if sample is None else -(-int(sample) // max(len(ids), 1))
    parts, dims = [], {}
    for item_id in ids:
        rows = _as_descriptors(source.read_item(item_id, mmap=True), item_id)
        dims.setdefault(rows.shape[1], item_id)
        if len(dims) > 1:
            raise ItemError(item_id, f"descriptors of dimension {rows.shape[1]}, item "
                                     f"{dims[min(dims)]!r} has {min(dims)}")
        if per_item is not None and len(rows) > per_item:
            rows = rows[np.sort(rng.choice(len(rows), per_item, replace=False))]
        parts.append(np.asarray(rows, dtype=np.float32))
    if not parts:
        raise FeatpipeError(f"stage {source.name}: no items to sample descriptors from")
    pool = np.concatenate(parts)
    if sample is not None and len(pool) > sample:
        pool = pool[np.sort(rng.choice(len(pool), int(sample), replace=False))]
    return pool


# -- PCA ------------------------------------------------------------------------------------

@_unmarked_on_failure
def fit_pca(store: Store, input: str, *, name: str | None = None, groups: str | None = None,
            fraction: float | None = None, sample: int = 100_000, random_state: int = 0,
            split: int = 1, force: bool = False, dry_run: bool = False,
            reporter: Reporter | None = None, **params) -> Stage:
    """PCA (:class:`~featpipe.extract.pca.PCAProjection`, ``params``: ``n_components``,
    ``whiten``) on a sample of ``sample`` train descriptors (0: all) of ``input``, drawn with
    seed ``random_state``; ``fraction`` keeps that fraction of the dimension (0.5 halves it)
    in place of ``n_components``.

    ``groups`` (``"hog,hof,mbh"``: descriptor groups of a dense-trajectory stage,
    :mod:`featpipe.extract.groups`) fits one PCA per group on its columns of the same sampled
    rows, saved as ``pca-<group>`` and listed by the ``groups`` model (written last);
    ``fit gmm --groups --pca NAME`` models each group in its projection."""
    from featpipe.extract.pca import MODEL_NAME, PCAProjection

    reporter = reporter or Reporter()
    check_name(name)
    groups, fraction, sample, random_state, split = _typed(
        groups=groups, fraction=fraction, sample=sample, random_state=random_state, split=split)
    if fraction is not None and "n_components" in params:
        raise ParameterError("fraction", "cannot be combined with n_components (--dim)")
    params = estimator_record(PCAProjection, params)
    source = fit_input(store, input, "pca")
    layout, columns = _group_layout(source, groups)
    # each group's dimension, checked before any stage exists (a group too narrow is refused)
    dims = {group: _projected_dim(cols.stop - cols.start, params["n_components"], fraction,
                                  group) for group, cols in layout or []}
    train = train_item_ids(source, split)
    if layout is None and fraction is None and source.exists:  # before any stage exists
        _projected_dim(_input_width(source, train[0]), params["n_components"], None, None)
    key = {k: v for k, v in params.items() if fraction is None or k != "n_components"}
    stage, fitted = _model_stage(store, "pca", key, [source],
                                 MODEL_NAME if layout is None else GROUPS_MODEL, name=name,
                                 force=force, dry_run=dry_run, reporter=reporter,
                                 sample=sample or None, random_state=random_state, split=split,
                                 **({"fraction": fraction} if fraction is not None else {}),
                                 **({"groups": ",".join(g for g, _ in layout)} if layout
                                    else {}))
    stage, stand_in = _stand_in_stage(stage, MODEL_NAME if layout is None else GROUPS_MODEL,
                                      dry_run, source, train)
    if fitted and not stand_in:
        return stage
    rows = stand_in_rows(input_width(source, train), seed=random_state) if stand_in else \
        sample_descriptors(source, train, sample or None, random_state)
    meta = {"input": source.name, "n_samples": len(rows), "n_items": len(train)}
    parts = layout or [(None, slice(0, rows.shape[1]))]
    for group, cols in parts:
        dim = dims[group] if layout else _projected_dim(cols.stop - cols.start,
                                                        params["n_components"], fraction, None)
        pca = PCAProjection(**{**params, "n_components": dim}).fit(rows[:, cols])
        stage.save_model(MODEL_NAME if group is None else f"pca-{group}", pca,
                         {**meta, "input_dim": cols.stop - cols.start,
                          **({"group": group} if group else {})})
        if stand_in:
            continue
        kept = float(pca.explained_variance_ratio_.sum())
        reporter.info(("" if group is None else f"{group}: columns {cols.start}..{cols.stop - 1}"
                       ", ") + f"PCA {cols.stop - cols.start} -> {dim} on {len(rows)} "
                      f"descriptors from {len(train)} train items ({100 * kept:.1f}% of the "
                      "variance)")
    if layout:
        _save_groups_model(stage, layout, columns, rows.shape[1])
    if stand_in:
        return stage
    _fitted(store, name, stage, reporter)
    reporter.info("summary: 1 fitted, 0 skipped (already complete), 0 failed")
    return stage


def _group_layout(source: Stage, groups: str | None):
    """(the modelling groups named by ``groups`` and their columns, the input's groups and
    columns) of an extract stage of dense trajectories, or (None, None) without ``groups``."""
    if groups is None:
        return None, None
    from featpipe.extract.groups import parse_groups, stage_columns

    columns = stage_columns(source)
    return parse_groups(groups, columns), columns


def _input_width(source: Stage, item_id: str) -> int:
    """The descriptor dimension of ``source``, from the header of its item ``item_id``."""
    return int(_as_descriptors(source.read_item(item_id, mmap=True), item_id).shape[1])


def _projected_dim(width: int, dim: int | None, fraction: float | None, group: str | None,
                   parameter: str = "n_components") -> int:
    """The dimension a projection of ``width`` values keeps: ``fraction`` of it (rounded, at
    least 1) or ``dim`` (the ``parameter``), which must fit."""
    if fraction is not None:
        return max(1, round(fraction * width))
    if dim > width:
        owner = "the input" if group is None else f"group {group}"
        raise ParameterError(parameter, f"{dim} is more than {owner}'s {width} values")
    return int(dim)


def _save_groups_model(stage: Stage, layout, columns, width: int) -> None:
    """The ``groups`` model of a grouped stage (written last): each group's columns ((G, 2)
    start and stop), the input's own groups and width (checked by the users)."""
    stage.save_model(GROUPS_MODEL, {"columns": np.array([[c.start, c.stop] for _, c in layout],
                                                        np.int64)},
                     {"model": GROUPS_MODEL, "groups": [g for g, _ in layout],
                      "input_groups": list(columns), "input_dim": int(width)})


# -- GMM ------------------------------------------------------------------------------------

@_unmarked_on_failure
def fit_gmm(store: Store, input: str, *, name: str, pca: str | None = None,
            pca_dim: int | None = None, pca_fraction: float | None = None,
            groups: str | None = None, sample: int = 200_000, force: bool = False,
            dry_run: bool = False, reporter: Reporter | None = None, **params) -> Stage:
    """A diagonal GMM (:class:`~featpipe.encode.fisher.GaussianMixtureModel`, ``params``) on
    ``sample`` train descriptors of ``input`` (seeded by the GMM's ``random_state``).

    ``pca`` names a fitted PCA stage applied first; ``pca_dim`` fits a PCA to that dimension
    on the same sample instead, ``pca_fraction`` to that fraction of the dimension (0.5
    halves it; one of the three).  The projection is saved in the GMM stage as its ``pca``
    model, so ``encode --method fisher`` projects before encoding.

    ``groups`` (``"hog,hof,mbh"``: descriptor groups of a dense-trajectory stage,
    :mod:`featpipe.extract.groups`) fits one projection (``pca_dim`` or ``pca_fraction``; or
    ``pca`` names a ``fit pca --groups`` stage, whose projections are used) and one GMM per
    group on the same sampled rows, saved as ``pca-<group>`` and ``gmm-<group>`` and listed,
    with the columns they take, by the ``groups`` model (written last).
    """
    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.extract.pca import MODEL_NAME, PCAProjection, load_pca

    reporter = reporter or Reporter()
    check_name(name)
    pca_dim, pca_fraction, groups, sample = _typed(pca_dim=pca_dim, pca_fraction=pca_fraction,
                                                   groups=groups, sample=sample)
    given = [k for k, v in (("pca", pca), ("pca_dim", pca_dim), ("pca_fraction", pca_fraction))
             if v]
    if len(given) > 1:
        raise ParameterError(given[1], f"cannot be combined with --{given[0].replace('_', '-')}")
    if pca_dim is not None:
        PCAProjection.check_param_values({"n_components": pca_dim})
    if sample < 1:
        raise ParameterError("sample", f"must be >= 1, got {sample}")
    params = estimator_record(GaussianMixtureModel, params)
    gmm = GaussianMixtureModel(**params)
    source = fit_input(store, input, "gmm")
    layout, columns = _group_layout(source, groups)
    groups = None if layout is None else ",".join(g for g, _ in layout)
    if layout and pca_dim is not None:  # a group narrower than pca_dim: before any stage
        for group, cols in layout:
            _projected_dim(cols.stop - cols.start, pca_dim, None, group, "pca_dim")
    ids = train_item_ids(source)
    if not layout and pca_dim is not None and source.exists:  # before any stage exists
        _projected_dim(_input_width(source, ids[0]), pca_dim, None, None, "pca_dim")
    pca_stages = [store.resolve(pca)] if pca else []
    loaded = None if not pca_stages else \
        _group_projections(pca_stages[0], pca, layout, columns) if layout else \
        load_pca(pca_stages[0])
    stage, fitted = _model_stage(store, "gmm", params, [source, *pca_stages],
                                 "gmm" if layout is None else "groups", name=name,
                                 force=force, dry_run=dry_run, reporter=reporter,
                                 pca=pca_stages[0].name if pca_stages else None,
                                 pca_dim=pca_dim, sample=sample, split=1,
                                 **({"pca_fraction": pca_fraction} if pca_fraction else {}),
                                 **({"groups": groups} if layout else {}))
    stage, stand_in = _stand_in_stage(stage, "gmm" if layout is None else "groups", dry_run,
                                      source, ids)
    if fitted and not stand_in:
        return stage
    if stand_in:  # a model of the real shapes for the dry run's later steps; nothing written
        rows = sampled_rows(source, ids, sample)
        x = stand_in_rows(input_width(source, ids), gmm.n_components, gmm.random_state)
        params = {**params, "max_iter": 1}
        gmm = GaussianMixtureModel(**params)
    else:
        x = sample_descriptors(source, ids, sample, gmm.random_state)
        rows = len(x)
    if layout is not None:
        projections = loaded or {
            g: None if pca_dim is None and pca_fraction is None else
            PCAProjection(_projected_dim(c.stop - c.start, pca_dim, pca_fraction, g,
                                         "pca_dim")).fit(x[:, c]) for g, c in layout}
        _fit_groups(stage, x, layout, columns, projections, params,
                    _WarningsOnly(reporter) if stand_in else reporter, rows)
        if stand_in:
            return stage
        _fitted(store, name, stage, reporter)
        reporter.info(f"summary: {len(layout)} groups, K={gmm.n_components}, on {len(x)} rows "
                      f"from {len(ids)} items")
        return stage
    dim = None if pca_dim is None and pca_fraction is None else \
        _projected_dim(x.shape[1], pca_dim, pca_fraction, None, "pca_dim")
    projection = loaded if pca_stages else PCAProjection(dim).fit(x) if dim else None
    if projection is not None:
        x = projection.transform(x)
    warn_thin_gmm(rows, gmm.n_components, x.shape[1], None, reporter)
    start = time.perf_counter()
    gmm.fit(x)
    seconds = time.perf_counter() - start
    meta = {"n_descriptors": int(x.shape[0]), "dim": int(x.shape[1]), "n_items": len(ids),
            "log_likelihood": float(gmm.log_likelihoods_[-1]), "seconds": seconds}
    if projection is not None:
        stage.save_model(MODEL_NAME, projection, {"input": source.name})
    stage.save_model("gmm", gmm, meta)
    if stand_in:
        return stage
    _fitted(store, name, stage, reporter)
    reporter.info(f"summary: K={gmm.n_components} D={x.shape[1]} on {x.shape[0]} descriptors "
                  f"from {len(ids)} items, {gmm.n_iter_} iterations, mean log-likelihood "
                  f"{meta['log_likelihood']:.4f}, {gmm.n_restarts_} restarts, {seconds:.1f}s")
    return stage


def _fit_groups(stage: Stage, x: np.ndarray, layout, columns, projections: dict,
                params: dict, reporter: Reporter, rows: int | None) -> None:
    """One GMM per group of ``layout`` on its columns of the sampled rows ``x``, in the group's
    projection (``projections``: group -> a fitted PCAProjection or None), saved as
    ``pca-<group>`` and ``gmm-<group>``; then the ``groups`` model.  ``rows``: the sample's
    rows (:func:`warn_thin_gmm`)."""
    from featpipe.encode.fisher import GaussianMixtureModel

    for group, cols in layout:
        part, pca = x[:, cols], projections[group]
        if pca is not None:
            part = pca.transform(part)
            stage.save_model(f"pca-{group}", pca, {"group": group})
        warn_thin_gmm(rows, params["n_components"], part.shape[1], group, reporter)
        gmm = GaussianMixtureModel(**params).fit(part)
        stage.save_model(f"gmm-{group}", gmm, {
            "group": group, "n_descriptors": int(part.shape[0]), "dim": int(part.shape[1]),
            "log_likelihood": float(gmm.log_likelihoods_[-1])})
        reporter.info(f"{group}: columns {cols.start}..{cols.stop - 1}"
                      + (f", PCA {cols.stop - cols.start} -> {part.shape[1]}" if pca else "")
                      + f", K={gmm.n_components}, {gmm.n_iter_} iterations, mean "
                      f"log-likelihood {gmm.log_likelihoods_[-1]:.4f}")
    _save_groups_model(stage, layout, columns, x.shape[1])


def parameters_per_component(dim: int) -> int:
    """The parameters of one diagonal Gaussian of a GMM in ``dim`` dimensions: a mean and a
    variance per dimension, and its weight (2·dim + 1)."""
    return 2 * dim + 1


def warn_thin_gmm(rows: int | None, n_components: int, dim: int, group: str | None,
                  reporter: Reporter) -> None:
    """Warn when a GMM of ``n_components`` diagonal Gaussians in ``dim`` dimensions is fitted
    on fewer rows per component than each component has parameters
    (:func:`parameters_per_component`): such a model is mostly its initialisation.  ``rows``
    is the sample's size (a dry run: what the sample will give; None: unknown)."""
    need = parameters_per_component(dim)
    if rows is None or rows >= need * n_components:
        return
    what = "" if group is None else f"group {group}: "
    reporter.warn(f"warning: {what}{rows:,} rows for K = {n_components} components is "
                  f"{rows / n_components:.1f} rows a component, fewer than the {need} "
                  f"parameters of each (2 x {dim} + 1): sample more rows (--sample, "
                  f"--sample-descriptors, more train items) or fit fewer components (at most "
                  f"{max(1, rows // need)} for these rows)")


def _group_projections(pca_stage: Stage, label: str, layout, columns) -> dict:
    """Each group's PCA from a ``fit pca --groups`` stage (named ``label``), which must hold
    every group of ``layout`` on the same columns of rows of the same groups (``columns``)."""
    from featpipe.extract.pca import PCAProjection

    if not pca_stage.has_model(GROUPS_MODEL):
        raise ParameterError("pca", f"stage {label} holds one PCA of whole rows; "
                             "--groups needs one per group (fit pca --groups)")
    arrays, meta = pca_stage.load_model(GROUPS_MODEL)
    held = {g: (int(a), int(b)) for g, (a, b) in zip(meta["groups"], arrays["columns"],
                                                     strict=True)}
    out = {}
    for group, cols in layout:
        if meta["input_groups"] != list(columns) or held.get(group) != (cols.start, cols.stop):
            raise ParameterError("pca", f"stage {label} has no PCA of group {group!r} on "
                                 f"columns {cols.start}..{cols.stop - 1} (it holds "
                                 f"{', '.join(held)}, of rows of the groups "
                                 f"{', '.join(meta['input_groups'])})")
        out[group] = pca_stage.load_model(f"pca-{group}", PCAProjection)
    return out


# -- deep Fisher kernel ---------------------------------------------------------------------

@_unmarked_on_failure
def fit_deep_gmm(store: Store, input: str, gmm: str, *, name: str, val_fraction: float = 0.25,
                 split: int = 1, force: bool = False, dry_run: bool = False,
                 reporter: Reporter | None = None, **params) -> Stage:
    """Learn a GMM end to end with linear SVMs (Sydorov et al. CVPR'14, Algorithm 1;
    :class:`~featpipe.learn.deep_fisher.DeepFisherKernel`, ``params``).

    Starts from the fitted GMM stage ``gmm`` (its PCA, if any, is applied to the descriptors
    and kept).  The train items of ``split`` are divided, stratified and seeded, into a
    learning part and a validation part (``val_fraction``; 0 learns on all of them, with the
    paper's ``selection="last"`` only) (:func:`featpipe.learn.splits.stratified_split`).

    The paper's evaluation (Table 2a) is reported and kept in the model's metadata
    (``evaluation``, :func:`deep_gmm_evaluation`): the average precision of each class on the
    validation part, from the SVMs of the initial GMM(s) (``base``) and of the learned ones
    (``learned``), and their means (mAP), under the paper's SVM and under the one
    ``classify`` trains.  Table 2b, the kernel transfer, is ``encode --method fisher --gmm NAME`` on
    every item, then ``classify`` trained on the whole train split.
    """
    from featpipe.encode.fisher import gmm_stage_arrays
    from featpipe.extract.pca import MODEL_NAME, PCAProjection
    from featpipe.learn.deep_fisher import DeepFisherKernel
    from featpipe.learn.splits import stratified_split

    reporter = reporter or Reporter()
    check_name(name)
    val_fraction, split = _typed(val_fraction=val_fraction, split=split)
    params = estimator_record(DeepFisherKernel, params)
    model = DeepFisherKernel(**params)
    if val_fraction == 0 and model.selection == "validation":
        raise ParameterError("val_fraction", "must be > 0 with selection validation")
    source = fit_input(store, input, "deep-gmm")
    gmm_stage = store.resolve(gmm)
    init = gmm_stage_arrays(gmm_stage)
    if init["means"].ndim != 2:
        raise ParameterError("gmm", f"{gmm} is a per-class model; deep-gmm starts from one GMM "
                             "(`featpipe fit gmm`)")
    ids = train_item_ids(source, split)
    items = source.items
    if items.is_multilabel:
        raise FeatpipeError("fit deep-gmm needs single-label items (multi-label manifests are "
                            "not supported)")
    stage, fitted = _model_stage(store, "deep-gmm", params, [source, gmm_stage], "gmm",
                                 name=name, force=force, dry_run=dry_run, reporter=reporter,
                                 val_fraction=val_fraction, split=split)
    if fitted:
        return stage
    labels = [items[i].label for i in ids]
    descs = []
    for item_id in ids:
        x = _as_descriptors(np.asarray(source.read_item(item_id), dtype=np.float64), item_id)
        if "pca_mean" in init:
            x = (x - init["pca_mean"]) @ init["pca_components"].T
        descs.append(x)
    learn, val = stratified_split(labels, val_fraction, model.random_state)
    start = time.perf_counter()
    model.fit([descs[i] for i in learn], np.asarray([labels[i] for i in learn]),
              [descs[i] for i in val], np.asarray([labels[i] for i in val]),
              (init["weights"], init["means"], init["variances"]))
    seconds = time.perf_counter() - start
    evaluation = deep_gmm_evaluation(model)
    meta = {"n_learn": len(learn), "n_val": len(val), "seconds": seconds,
            "evaluation": evaluation}
    if gmm_stage.has_model(MODEL_NAME):
        stage.save_model(MODEL_NAME, gmm_stage.load_model(MODEL_NAME, PCAProjection))
    stage.save_model("gmm", model, meta)
    _fitted(store, name, stage, reporter)
    for task, history in enumerate(model.history_):
        kept = history[[h["iteration"] for h in history].index(model.best_iteration_[task])]
        label = str(model.classes_[task]) if model.mode == "per-class" else "shared"
        reporter.info(f"{label}: objective {history[0]['objective']:.6g} -> "
                      f"{history[-1]['objective']:.6g} in {len(history) - 1} iterations; "
                      f"kept iteration {kept['iteration']}")
    if len(val):
        paper, ours = evaluation["paper"], evaluation["classify"]
        for cls in evaluation["classes"]:
            reporter.info(f"validation AP {cls}: {_number(paper['base'][cls])} -> "
                          f"{_number(paper['learned'][cls])} (paper's SVM), "
                          f"{_number(ours['base'][cls])} -> {_number(ours['learned'][cls])} "
                          "(classify's SVM)")
        reporter.info(f"validation mAP, the paper's SVM (squared hinge, no bias, C = "
                      f"{model.C:g}): {_number(paper['base_map'])} -> "
                      f"{_number(paper['learned_map'])}")
        reporter.info(f"validation mAP, classify's SVM (libsvm C-SVC with a bias, linear "
                      f"kernel, C = {model.C:g}): {_number(ours['base_map'])} -> "
                      f"{_number(ours['learned_map'])}: the gain that carries over to "
                      "`classify`")
    reporter.info(f"summary: {len(learn)} learn + {len(val)} validation items, {seconds:.1f}s")
    return stage


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def deep_gmm_evaluation(model) -> dict:
    """Per-class validation AP of the initial (``base``) and the learned (``learned``) GMM(s)
    and their means (``base_map``, ``learned_map``) under two SVMs trained on the learning
    items: ``paper``, the task's own squared-hinge SVM without a bias (Algorithm 1's, the
    paper's Table 2a), read from the history; ``classify``, what ``featpipe classify`` trains
    (libsvm C-SVC with a bias, linear kernel, the same C), whose gain is the one that carries
    over to the kernel transfer.  Each class comes from its own task (its own GMM in per-class
    mode, the shared GMM's SVM of that class otherwise)."""
    classes = [str(c) for c in model.classes_]
    paper = {"base": {}, "learned": {}}
    ours = {"base": {}, "learned": {}}
    libsvm = getattr(model, "libsvm_validation_ap_", None) or [{}] * len(model.history_)
    for task, history in enumerate(model.history_):
        kept = history[[h["iteration"] for h in history].index(model.best_iteration_[task])]
        names = [classes[task]] if model.mode == "per-class" else classes
        for j, cls in enumerate(names):
            paper["base"][cls] = (history[0]["validation_ap"] or [None] * len(names))[j]
            paper["learned"][cls] = (kept["validation_ap"] or [None] * len(names))[j]
            for which in ("base", "learned"):
                ours[which][cls] = (libsvm[task].get(which) or [None] * len(names))[j]

    def mean(values):
        values = [v for v in values.values() if v is not None]
        return float(np.mean(values)) if values else None

    return {"classes": classes, **{svm: {**scores, "base_map": mean(scores["base"]),
                                          "learned_map": mean(scores["learned"])}
                                   for svm, scores in (("paper", paper), ("classify", ours))}}


# -- discriminative HRP ---------------------------------------------------------------------

def _read(stage: Stage, ids) -> list[np.ndarray]:
    return [stage.read_item(item_id) for item_id in ids]


def _single_labels(stage: Stage, ids, part: str) -> np.ndarray:
    items = stage.items
    labels = []
    for item_id in ids:
        item = items[item_id]
        if len(item.labels) != 1:
            raise FeatpipeError(f"{item_id}: DHRP needs exactly one label per {part} item, "
                                f"got {item.label!r}")
        labels.append(item.labels[0])
    return np.asarray(labels)


def _dhrp_accuracy(model, seqs, labels, initial: bool = False) -> float:
    """Accuracy of the soft-max on u*(W), or (``initial``) of the classifier it started from
    on u*(I): ``classify``'s linear SVM on the same encodings."""
    from featpipe.learn.dhrp import DiscriminativeRankPooling

    if initial:
        model = DiscriminativeRankPooling.from_arrays(*model.to_arrays())
        model.W_ = np.eye(model.n_features_in_, dtype=np.float32)
    scores = model.scores(model.transform(seqs), initial=initial)
    return float(np.mean(model.classes_[np.argmax(scores, axis=1)] == labels))


@_unmarked_on_failure
def fit_dhrp(store: Store, input: str, *, name: str, split: int = 1,
             threads: int | None = None, force: bool = False, dry_run: bool = False,
             reporter: Reporter | None = None, **params) -> Stage:
    """Learn ψ(W x) and a soft-max classifier through rank pooling (DHRP).

    ``input`` holds per-item (T, D) sequences (``encode --method hrp --emit-layer L`` or a
    per-frame stage); ``params`` are
    :class:`~featpipe.learn.dhrp.DiscriminativeRankPooling`'s parameters.  The test items of
    ``split`` are scored and the scores kept in the model.
    """
    from featpipe.learn.dhrp import MODEL_NAME, DiscriminativeRankPooling, load_model

    reporter = reporter or Reporter()
    check_name(name)
    (split,) = _typed(split=split)
    if threads is not None and threads < 1:
        raise ParameterError("threads", f"must be >= 1, got {threads}")
    params = estimator_record(DiscriminativeRankPooling, params)
    model = DiscriminativeRankPooling(**params)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    source = fit_input(store, input, "dhrp")
    stage, fitted = _model_stage(store, "dhrp", params, [source], MODEL_NAME, name=name,
                                 force=force, dry_run=dry_run, reporter=reporter, split=split)
    if fitted:
        return stage
    train_ids = train_item_ids(source, split)
    test_ids = source.items.split_ids(split, "test")
    start = time.perf_counter()
    model.fit(_read(source, train_ids), _single_labels(source, train_ids, "train"),
              ids=train_ids,
              log=lambda h: log.info("epoch %d: train loss %.4f, val loss %.4f, val acc %.3f",
                                     h["epoch"], h["train_loss"], h["val_loss"],
                                     h["val_accuracy"]))
    seconds = time.perf_counter() - start
    report = {"train_items": len(train_ids), "fit_items": model.n_fit_,
              "val_items": model.n_val_, "best_epoch": model.best_epoch_,
              "epochs_run": len(model.history_) - 1, "seconds": round(seconds, 3)}
    best = model.history_[model.best_epoch_]
    reporter.info(f"trained {report['epochs_run']} epochs in {seconds:.1f} s; best epoch "
                  f"{model.best_epoch_}: train loss {best['train_loss']:.4f}, val loss "
                  f"{best['val_loss']:.4f}, val accuracy {best['val_accuracy']:.3f}")
    labelled_test = [i for i in test_ids if len(source.items[i].labels) == 1]
    if labelled_test:
        seqs = _read(source, labelled_test)
        labels = _single_labels(source, labelled_test, "test")
        report["test_items"] = len(labelled_test)
        report["test_accuracy"] = _dhrp_accuracy(model, seqs, labels)
        report["test_accuracy_init"] = _dhrp_accuracy(model, seqs, labels, initial=True)
        reporter.info(f"test accuracy (soft-max on u*(W)): {report['test_accuracy']:.4f}; "
                      f"the initialisation, classify's linear SVM on u*(I) (--normalize "
                      f"{model.normalize} --C {model.svm_C:g}): "
                      f"{report['test_accuracy_init']:.4f} ({len(labelled_test)} items)")
    stage.save_model(MODEL_NAME, model, {"input": source.name, "split": split,
                                         "report": report, "device": model.device_})
    load_model(stage)  # the saved model must load back before the name points at it
    _fitted(store, name, stage, reporter)
    reporter.info("summary: 1 done, 0 skipped (already complete), 0 failed")
    return stage


# -- GM-SOP ---------------------------------------------------------------------------------

@_unmarked_on_failure
def fit_gmsop(store: Store, input: str, *, name: str | None = None, split: int = 1,
              force: bool = False, dry_run: bool = False, reporter: Reporter | None = None,
              **params) -> Stage:
    """Fit GM-SOP (:class:`~featpipe.learn.gmsop.GatedMixtureSOP`, ``params``) on one conv
    map per train image of ``split``."""
    from featpipe.items import LocalFeatures
    from featpipe.learn.gmsop import MODEL_NAME, GatedMixtureSOP

    reporter = reporter or Reporter()
    check_name(name)
    (split,) = _typed(split=split)
    params = estimator_record(GatedMixtureSOP, params)
    model = GatedMixtureSOP(**params)
    source = fit_input(store, input, "gmsop")
    train = train_item_ids(source, split)
    if source.items.is_multilabel:
        raise FeatpipeError("fit gmsop trains a single-label classifier; the manifest of "
                            f"{source.name} is multi-label")
    stage, fitted = _model_stage(store, "gmsop", params, [source], MODEL_NAME, name=name,
                                 force=force, dry_run=dry_run, reporter=reporter, split=split)
    if fitted:
        return stage
    maps, labels = [], []
    for item_id in train:
        try:
            record = LocalFeatures.from_item(source.read_item(item_id),
                                             source.extras_of(item_id))
        except FeatpipeError as err:
            raise ItemError(item_id, err.cause) from None
        if record.n_frames != 1:
            raise ItemError(item_id, "fit gmsop takes one conv map per image, got frames")
        maps.append(record.descriptors)
        labels.append(source.items[item_id].label)
    model.fit(maps, labels)
    stage.save_model(MODEL_NAME, model, {"train_items": len(maps)})
    accuracy = float(np.mean(model.predict(maps) == np.asarray(labels)))
    _fitted(store, name, stage, reporter)
    reporter.info(f"fitted on {len(maps)} train items: final loss {model.loss_curve_[-1]:.4f}, "
                  f"train accuracy {accuracy:.3f}")
    reporter.info("summary: 1 done, 0 skipped (already complete), 0 failed")
    return stage


# -- standardisation ------------------------------------------------------------------------

@_unmarked_on_failure
def fit_standardize(store: Store, input: str, *, name: str | None = None, split: int = 1,
                    dry_run: bool = False, reporter: Reporter | None = None) -> Stage:
    """Per-channel mean and standard deviation of the train frames of ``input`` (then
    ``encode --method standardize --model NAME``)."""
    from featpipe.encode.standardize import MODEL_NAME, Standardizer

    reporter = reporter or Reporter()
    check_name(name)
    (split,) = _typed(split=split)
    source = fit_input(store, input, "standardize")
    train = train_item_ids(source, split)
    stage = store.stage("standardize", {"split": split, **_input_failed(source, split)},
                        inputs=[source], items=Manifest([], root=source.path),
                        create=not dry_run)
    announce(stage, name, reporter)
    if dry_run:
        _already(stage, MODEL_NAME, False, store, name, reporter, dry_run)
        stage, stand_in = _stand_in_stage(stage, MODEL_NAME, dry_run, source, train)
        if stand_in:
            width = input_width(source, train)
            stage.save_model(MODEL_NAME, Standardizer().fit([stand_in_rows(width)]))
        return stage
    if not stage.has_model(MODEL_NAME):
        _mark_running(store, name, stage)
        model = Standardizer().fit([source.read_item(i) for i in train])
        stage.save_model(MODEL_NAME, model, {"input": source.name, "split": split,
                                             "n_items": len(train)})
        reporter.info(f"standardize: {model.mean_.shape[0]} channels from {len(train)} "
                      "train items")
    _fitted(store, name, stage, reporter)
    return stage
