"""The ``fit`` stages: models fitted once on the train items of a stage.

Each function creates (or finds) a model stage keyed by its parameters and input, fits the
model unless it is already fitted (``force`` refits), names the stage and returns it.

- :func:`fit_pca`: PCA of descriptors (e.g. SIFT 128 -> 64).
- :func:`fit_gmm`: a diagonal GMM by EM on a seeded sample of descriptors (VLFeat rules).
- :func:`fit_deep_gmm`: the GMM learned with the SVM (deep Fisher kernel, Algorithm 1).
- :func:`fit_dhrp`: discriminative hierarchical rank pooling (seed paper section 4.4).
- :func:`fit_gmsop`: gated mixture of second-order pooling (NeurIPS'18).
- :func:`fit_standardize`: per-channel mean and standard deviation of the train frames.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from featpipe.errors import FeatpipeError, InputError, ItemError, ParameterError
from featpipe.manifest import Manifest
from featpipe.stages.base import Reporter, announce, train_item_ids
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
        if name:
            store.set_name(name, stage)
        reporter.info("model already fitted (use --force to refit)")
        reporter.info("summary: 0 fitted, 1 skipped (already complete), 0 failed")
        return True
    return False


# -- PCA ------------------------------------------------------------------------------------

def fit_pca(store: Store, input: str, *, name: str | None = None, dim: int = 64,
            sample: int = 100_000, seed: int = 0, split: int = 1, whiten: bool = False,
            force: bool = False, dry_run: bool = False, reporter: Reporter | None = None
            ) -> Stage:
    """PCA on a seeded sample of ``sample`` train descriptors (0: all) of stage ``input``."""
    from featpipe.extract.pca import MODEL_NAME, PCAProjection, sample_rows, save_pca

    reporter = reporter or Reporter()
    if sample < 0:
        raise ParameterError("sample", f"must be >= 0, got {sample}")
    source = store.resolve(input)
    train = train_item_ids(source, split)
    params = {"dim": dim, "sample": sample or None, "seed": seed, "split": split,
              "whiten": whiten}
    stage = store.stage("pca", params, inputs=[source], items=Manifest([], root=source.path),
                        create=not dry_run)
    announce(stage, name, reporter)
    if _already(stage, MODEL_NAME, force, store, name, reporter, dry_run):
        return stage
    rows = sample_rows(source, train, sample or None, seed)
    pca = PCAProjection(n_components=dim, whiten=whiten).fit(rows)
    save_pca(stage, pca, {"input": source.name, "n_samples": len(rows),
                          "n_items": len(train), "input_dim": int(rows.shape[1])})
    if name:
        store.set_name(name, stage)
    kept = float(pca.explained_variance_ratio_.sum())
    reporter.info(f"PCA {rows.shape[1]} -> {dim} on {len(rows)} descriptors from {len(train)} "
                  f"train items ({100 * kept:.1f}% of the variance)")
    reporter.info("summary: 1 fitted, 0 skipped (already complete), 0 failed")
    return stage


# -- GMM ------------------------------------------------------------------------------------

def _as_descriptors(array: np.ndarray, item_id: str) -> np.ndarray:
    if array.ndim == 3:
        array = array.reshape(-1, array.shape[-1])
    if array.ndim != 2:
        raise FeatpipeError(f"item {item_id}: expected descriptors (N, D) or (F, n, D), got "
                            f"shape {array.shape}")
    return array


def sample_descriptors(source: Stage, ids: list[str], sample: int | None, seed: int
                       ) -> np.ndarray:
    """``sample`` descriptors drawn uniformly without replacement over the items (seeded)."""
    arrays = [_as_descriptors(source.read_item(i, mmap=True), i) for i in ids]
    dims = {a.shape[1] for a in arrays}
    if len(dims) != 1:
        raise FeatpipeError(f"input stage {source.name}: descriptor dimensions differ across "
                            f"items ({sorted(dims)})")
    counts = np.array([a.shape[0] for a in arrays])
    total = int(counts.sum())
    if sample is None or sample >= total:
        return np.concatenate([np.asarray(a, dtype=np.float64) for a in arrays])
    picks = np.sort(np.random.default_rng(seed).choice(total, size=sample, replace=False))
    offsets = np.r_[0, np.cumsum(counts)]
    owner = np.searchsorted(offsets, picks, side="right") - 1
    return np.concatenate([np.asarray(arrays[j][picks[owner == j] - offsets[j]],
                                      dtype=np.float64) for j in np.unique(owner)])


def pca_arrays(pca_stage: Stage | None, pca_dim: int | None, x: np.ndarray, seed: int
               ) -> dict[str, np.ndarray]:
    """PCA (``pca_mean``, ``pca_components``) to apply before the GMM ({} for none)."""
    from featpipe.extract.pca import load_pca

    if pca_stage is not None:
        pca = load_pca(pca_stage)
        components = pca.components_
        if pca.whiten:  # fold the whitening into the projection: y = (x − m) Pᵀ / √λ
            components = components / np.sqrt(np.maximum(
                pca.explained_variance_, np.finfo(np.float32).tiny))[:, None]
        return {"pca_mean": pca.mean_, "pca_components": components}
    if pca_dim:
        if not 1 <= pca_dim <= x.shape[1]:
            raise InputError(f"--pca-dim must be in 1..{x.shape[1]}, got {pca_dim}")
        from sklearn.decomposition import PCA

        pca = PCA(pca_dim, random_state=seed).fit(x)
        return {"pca_mean": pca.mean_, "pca_components": pca.components_}
    return {}


def fit_gmm(store: Store, input: str, *, name: str, components: int = 256,
            pca: str | None = None, pca_dim: int | None = None, sample: int = 200_000,
            seed: int = 0, dtype: str = "float64", max_iter: int = 100, init: str = "kmeans",
            force: bool = False, dry_run: bool = False, reporter: Reporter | None = None
            ) -> Stage:
    """A diagonal GMM (VLFeat conventions) on ``sample`` train descriptors of ``input``.

    ``pca`` names a fitted PCA stage applied first; ``pca_dim`` fits a seeded PCA on the
    same sample instead (not both).  The PCA is stored with the GMM, so ``encode --method
    fisher`` projects before encoding.
    """
    from featpipe.encode.fisher import GaussianMixtureModel

    reporter = reporter or Reporter()
    if pca and pca_dim:
        raise ParameterError("pca_dim", "cannot be combined with --pca (a fitted PCA stage)")
    source = store.resolve(input)
    ids = train_item_ids(source)
    pca_stages = [store.resolve(pca)] if pca else []
    params = {"components": components, "pca": pca, "pca_dim": pca_dim,
              "sample": sample, "seed": seed, "dtype": dtype, "max_iter": max_iter,
              "init": init, "split": 1}
    stage = store.stage("gmm", params, inputs=[source, *pca_stages], items=Manifest([]),
                        create=not dry_run)
    announce(stage, name, reporter)
    if _already(stage, "gmm", force, store, name, reporter, dry_run):
        return stage
    x = sample_descriptors(source, ids, sample, seed)
    projection = pca_arrays(pca_stages[0] if pca_stages else None, pca_dim, x, seed)
    if projection:
        x = (x - projection["pca_mean"]) @ projection["pca_components"].T
    start = time.perf_counter()
    gmm = GaussianMixtureModel(components, max_iter=max_iter, init=init, random_state=seed,
                               dtype=dtype).fit(x)
    seconds = time.perf_counter() - start
    meta = {"n_descriptors": int(x.shape[0]), "dim": int(x.shape[1]), "n_items": len(ids),
            "n_iter": gmm.n_iter_, "converged": gmm.converged_, "n_restarts": gmm.n_restarts_,
            "log_likelihood": float(gmm.log_likelihoods_[-1]),
            "variance_floor": gmm.variance_floor_, "seconds": seconds}
    stage.save_model("gmm", {**gmm.to_arrays(), **projection}, meta)
    store.set_name(name, stage)
    reporter.info(f"summary: K={components} D={x.shape[1]} on {x.shape[0]} descriptors from "
                  f"{len(ids)} items, {gmm.n_iter_} iterations, mean log-likelihood "
                  f"{meta['log_likelihood']:.4f}, {gmm.n_restarts_} restarts, {seconds:.1f}s")
    return stage


# -- deep Fisher kernel ---------------------------------------------------------------------

def stratified_split(labels: list[str], fraction: float, seed: int) -> tuple[list, list]:
    """Indices (learn, validation): ``fraction`` of each class (at least one) to validation."""
    rng = np.random.default_rng(seed)
    learn, val = [], []
    for label in sorted(set(labels)):
        members = [i for i, lab in enumerate(labels) if lab == label]
        if len(members) < 2:
            raise FeatpipeError(f"class {label!r} has {len(members)} train item(s); need 2 to "
                                "hold one out for validation")
        members = list(rng.permutation(members))
        n_val = min(len(members) - 1, max(1, round(fraction * len(members))))
        val += members[:n_val]
        learn += members[n_val:]
    return sorted(learn), sorted(val)


def fit_deep_gmm(store: Store, input: str, gmm: str, *, name: str, mode: str = "shared",
                 C: float = 1.0, max_iter: int = 20, patience: int = 3,
                 posterior_cutoff: float = 1e-5, subsample: float = 0.1,
                 val_fraction: float = 0.25, split: int = 1, seed: int = 0,
                 device: str = "cpu", dtype: str = "float64", force: bool = False,
                 dry_run: bool = False, reporter: Reporter | None = None) -> Stage:
    """Learn a GMM end to end with linear SVMs (Sydorov et al. CVPR'14, Algorithm 1).

    Starts from the fitted GMM stage ``gmm`` (its PCA, if any, is applied to the descriptors
    and kept).  The train items of ``split`` are divided, stratified and seeded, into a
    learning part and a validation part (``val_fraction``) that selects the best GMM.
    """
    from featpipe.learn.deep_fisher import DeepFisherKernel

    reporter = reporter or Reporter()
    if not 0 < val_fraction < 1:
        raise ParameterError("val_fraction", f"must be in (0, 1), got {val_fraction}")
    source = store.resolve(input)
    gmm_stage = store.resolve(gmm)
    ids = train_item_ids(source, split)
    items = source.items
    if items.is_multilabel:
        raise FeatpipeError("fit deep-gmm needs single-label items (multi-label manifests are "
                            "not supported)")
    params = {"mode": mode, "C": C, "max_iter": max_iter, "patience": patience,
              "posterior_cutoff": posterior_cutoff, "subsample": subsample,
              "val_fraction": val_fraction, "split": split, "seed": seed, "dtype": dtype}
    stage = store.stage("deep-gmm", params, inputs=[source, gmm_stage], items=Manifest([]),
                        create=not dry_run)
    announce(stage, name, reporter)
    if _already(stage, "gmm", force, store, name, reporter, dry_run):
        return stage
    init, _ = gmm_stage.load_model("gmm")
    if init["means"].ndim != 2:
        raise FeatpipeError(f"--gmm {gmm}: expected one GMM, got a per-class model")
    pca = {k: init[k] for k in ("pca_mean", "pca_components") if k in init}
    labels = [items[i].label for i in ids]
    descs = []
    for item_id in ids:
        x = np.asarray(source.read_item(item_id), dtype=np.float64)
        x = x.reshape(-1, x.shape[-1]) if x.ndim == 3 else x
        if pca:
            x = (x - pca["pca_mean"]) @ pca["pca_components"].T
        descs.append(x)
    learn, val = stratified_split(labels, val_fraction, seed)
    start = time.perf_counter()
    model = DeepFisherKernel(C=C, mode=mode, max_iter=max_iter, patience=patience,
                             posterior_cutoff=posterior_cutoff, subsample=subsample,
                             random_state=seed, device=device, dtype=dtype).fit(
        [descs[i] for i in learn], np.asarray([labels[i] for i in learn]),
        [descs[i] for i in val], np.asarray([labels[i] for i in val]),
        (init["weights"], init["means"], init["variances"]))
    seconds = time.perf_counter() - start
    meta = {"classes": [str(c) for c in model.classes_], "mode": mode, "history": model.history_,
            "best_iteration": model.best_iteration_, "n_learn": len(learn), "n_val": len(val),
            "seconds": seconds}
    stage.save_model("gmm", {**model.to_arrays(), **pca}, meta)
    stage.save_model("svm", {"weights": model.svm_weights_}, {"classes": meta["classes"]})
    store.set_name(name, stage)
    for task, history in enumerate(model.history_):
        first, best = history[0], history[[h["iteration"] for h in history].index(
            model.best_iteration_[task])]
        label = meta["classes"][task] if mode == "per-class" else "shared"
        reporter.info(f"{label}: objective {first['objective']:.6g} -> "
                      f"{history[-1]['objective']:.6g} in {len(history) - 1} steps; validation "
                      f"{first['validation']:.4f} -> best {best['validation']:.4f} "
                      f"(iteration {best['iteration']})")
    reporter.info(f"summary: {len(learn)} learn + {len(val)} validation items, {seconds:.1f}s")
    return stage


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


def _dhrp_accuracy(model, seqs, labels, coef=None, identity=False) -> float:
    from featpipe.learn.dhrp import DiscriminativeRankPooling

    if identity:
        model = DiscriminativeRankPooling.from_arrays(*model.to_arrays())
        model.W_ = np.eye(model.n_features_in_, dtype=np.float32)
    U = model.transform(seqs)
    scores = U @ (model.coef_ if coef is None else coef).T
    return float(np.mean(model.classes_[np.argmax(scores, axis=1)] == labels))


def fit_dhrp(store: Store, input: str, *, name: str, split: int = 1, device: str | None = None,
             threads: int | None = None, force: bool = False, dry_run: bool = False,
             reporter: Reporter | None = None, **hyper) -> Stage:
    """Learn ψ(W x) and a soft-max classifier through rank pooling (DHRP).

    ``input`` holds per-item (T, D) sequences (``encode --method hrp --emit-layer L`` or a
    per-frame stage); ``hyper`` are :class:`~featpipe.learn.dhrp.DiscriminativeRankPooling`'s
    parameters.  The test items of ``split`` are scored and the scores kept in the model.
    """
    from featpipe.learn.dhrp import MODEL_NAME, DiscriminativeRankPooling, load_model

    reporter = reporter or Reporter()
    if threads is not None:
        if threads < 1:
            raise ParameterError("threads", f"must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    source = store.resolve(input)
    params = {"split": split, **hyper}
    stage = store.stage("dhrp", params, inputs=[source], items=Manifest([], root=source.path),
                        create=not dry_run)
    announce(stage, name, reporter)
    if _already(stage, MODEL_NAME, force, store, name, reporter, dry_run):
        return stage
    train_ids = train_item_ids(source, split)
    test_ids = source.items.split_ids(split, "test")
    model = DiscriminativeRankPooling(device=device, **hyper)
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
        report["test_accuracy_init"] = _dhrp_accuracy(model, seqs, labels, model.coef_init_,
                                                      identity=True)
        reporter.info(f"test accuracy (soft-max on u*(W)): {report['test_accuracy']:.4f}; "
                      f"rank pooling u*(I) + linear SVM (the initialisation): "
                      f"{report['test_accuracy_init']:.4f} ({len(labelled_test)} items)")
    arrays, meta = model.to_arrays()
    meta.update(input=source.name, split=split, report=report, device=model.device_)
    stage.save_model(MODEL_NAME, arrays, meta)
    load_model(stage)  # the saved model must load back before the name points at it
    store.set_name(name, stage)
    reporter.info("summary: 1 done, 0 skipped (already complete), 0 failed")
    return stage


# -- GM-SOP ---------------------------------------------------------------------------------

def fit_gmsop(store: Store, input: str, *, name: str | None = None, split: int = 1,
              device: str = "cpu", force: bool = False, dry_run: bool = False,
              reporter: Reporter | None = None,
              components: int = 16, top_k: int = 8, dim: int = 32, ns_iters: int = 3,
              balance_weight: float = 100.0, epochs: int = 30, lr: float = 0.01,
              batch_size: int = 32, weight_decay: float = 1e-4, seed: int = 0) -> Stage:
    """Fit GM-SOP (gated mixture of parametric second-order pooling) on one conv map per
    train image of ``split``."""
    from featpipe.items import LocalFeatures
    from featpipe.learn.gmsop import MODEL_NAME, GatedMixtureSOP

    reporter = reporter or Reporter()
    params = {"components": components, "top_k": top_k, "dim": dim, "ns_iters": ns_iters,
              "balance_weight": balance_weight, "epochs": epochs, "lr": lr,
              "batch_size": batch_size, "weight_decay": weight_decay, "seed": seed}
    source = store.resolve(input)
    train = train_item_ids(source, split)
    if source.items.is_multilabel:
        raise FeatpipeError("fit gmsop trains a single-label classifier; the manifest of "
                            f"{source.name} is multi-label")
    stage = store.stage("gmsop", {"split": split, **params}, inputs=[source],
                        items=Manifest([], root=store.root), create=not dry_run)
    announce(stage, name, reporter)
    if _already(stage, MODEL_NAME, force, store, name, reporter, dry_run):
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
    model = GatedMixtureSOP(
        n_components=components, top_k=top_k, dim=dim, ns_iters=ns_iters,
        balance_weight=balance_weight, epochs=epochs, lr=lr, batch_size=batch_size,
        weight_decay=weight_decay, seed=seed, device=device)
    model.fit(maps, labels)
    arrays, meta = model.to_arrays()
    stage.save_model(MODEL_NAME, arrays, {**meta, "train_items": len(maps)})
    accuracy = float(np.mean(model.predict(maps) == np.asarray(labels)))
    if name:
        store.set_name(name, stage)
    reporter.info(f"fitted on {len(maps)} train items: final loss {model.loss_curve_[-1]:.4f}, "
                  f"train accuracy {accuracy:.3f}")
    reporter.info("summary: 1 done, 0 skipped (already complete), 0 failed")
    return stage


# -- standardisation ------------------------------------------------------------------------

def fit_standardize(store: Store, input: str, *, name: str | None = None, split: int = 1,
                    dry_run: bool = False, reporter: Reporter | None = None) -> Stage:
    """Per-channel mean and standard deviation of the train frames of ``input`` (then
    ``encode --method standardize --model NAME``)."""
    from featpipe.encode.standardize import MODEL_NAME, Standardizer

    reporter = reporter or Reporter()
    source = store.resolve(input)
    train = train_item_ids(source, split)
    stage = store.stage("standardize", {"split": split}, inputs=[source],
                        items=Manifest([], root=source.path), create=not dry_run)
    announce(stage, name, reporter)
    if dry_run:
        _already(stage, MODEL_NAME, False, store, name, reporter, dry_run)
        return stage
    if not stage.has_model(MODEL_NAME):
        model = Standardizer().fit([source.read_item(i) for i in train])
        stage.save_model(MODEL_NAME, {"mean": model.mean_, "scale": model.scale_},
                         {"input": source.name, "split": split, "n_items": len(train)})
        reporter.info(f"standardize: {model.mean_.shape[0]} channels from {len(train)} "
                      "train items")
    if name:
        store.set_name(name, stage)
    return stage
