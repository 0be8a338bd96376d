"""One classification experiment: encodings of a store's stages → kernels → SVMs → metrics.

For each split k: the train and test items come from the first input stage's manifest
(``split_ids(k, 'train' | 'test')``); every input is loaded for those items, each gets its own
kernel, the kernels are averaged (:mod:`featpipe.classify.fusion`), C is chosen by K-fold
cross-validation on the train items when several are given, the one-vs-rest SVMs are trained
on all train items and the test items are scored.  With chi2-exp, γ comes from the whole train
split and stays fixed inside the cross-validation folds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from featpipe.classify import fusion, metrics
from featpipe.classify.kernels import EXPLICIT_KERNELS, PrecomputedKernel, explicit_features
from featpipe.classify.svm import OneVsRestLinearSVC, OneVsRestSVC
from featpipe.encode.maps import l2_normalize
from featpipe.errors import FeatpipeError, InputError, ItemError, ParameterError
from featpipe.manifest import Manifest
from featpipe.store import Stage

METRICS = ("accuracy", "map")
SOLVERS = ("libsvm", "liblinear")
#: Folds of cross-validation when none are asked for (fewer when a class has fewer items).
DEFAULT_CV = 5


@dataclass(frozen=True)
class Settings:
    """Everything an experiment needs besides its inputs (defaults = the CLI's)."""

    Cs: tuple[float, ...] = (1000.0,)
    cv: int = DEFAULT_CV
    metric: str = "accuracy"
    ap_mode: str = "standard"
    solver: str = "libsvm"
    weights: tuple[float, ...] | None = None
    gamma: float | None = None
    order: int = 1
    n_jobs: int | None = None
    normalize: str = "l2"
    fusion_scale: str = fusion.SCALES[0]


def check_solver(solver: str, kernels) -> None:
    """liblinear trains on explicit features, so every kernel must have them."""
    bad = [k for k in kernels if k not in EXPLICIT_KERNELS]
    if solver == "liblinear" and bad:
        raise ParameterError("solver", f"liblinear needs explicit-feature kernels "
                             f"({', '.join(EXPLICIT_KERNELS)}), got {bad[0]!r}")


def load_encodings(stage: Stage, ids: Sequence[str], role: str) -> np.ndarray:
    """Stack one vector per item (a (1, D) array counts as a vector) into (items × D) float32."""
    rows = []
    dims = None
    first = None
    for item_id in ids:
        try:
            array = stage.read_item(item_id)
        except ItemError as err:
            raise ItemError(item_id, f"{role} item of input {stage.name}: {err.cause}") from None
        if array.ndim == 2 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 1:
            raise ItemError(item_id, f"{role} item of input {stage.name} has shape "
                                     f"{array.shape}; classify needs one vector per item "
                                     "(encode the per-frame features first)")
        if dims is None:
            dims, first = array.shape[0], item_id
        elif array.shape[0] != dims:
            raise ItemError(item_id, f"{role} item of input {stage.name} has {array.shape[0]} "
                                     f"dimensions, item {first!r} has {dims}")
        if not np.all(np.isfinite(array)):
            raise ItemError(item_id, f"{role} item of input {stage.name} contains NaN or Inf")
        rows.append(array)
    return np.asarray(rows, dtype=np.float32)


def normalize_rows(X: np.ndarray, normalize: str) -> np.ndarray:
    """``l2``: each encoding divided by its Euclidean norm (zero rows stay zero); ``none``."""
    if normalize == "none":
        return X
    if normalize == "l2":
        return l2_normalize(X)
    raise InputError(f"normalize must be 'none' or 'l2', got {normalize!r}")


def split_targets(manifest: Manifest, k: int):
    """(train ids, test ids, classes, Y_train, Y_test) for split k, or a clear error."""
    train = manifest.split_ids(k, "train")
    test = manifest.split_ids(k, "test")
    if not train:
        raise FeatpipeError(f"split {k} has no train items")
    if not test:
        raise FeatpipeError(f"split {k} has no test items")
    unlabeled = [i for i in train if not manifest[i].labels]
    if unlabeled:
        raise ItemError(unlabeled[0], f"train item of split {k} has no label "
                                      f"({len(unlabeled)} unlabeled train items)")
    classes = sorted({label for i in train for label in manifest[i].labels})
    if len(classes) < 2:
        raise FeatpipeError(f"split {k}: the train items have {len(classes)} class; "
                            "classification needs at least 2")
    known = set(classes)
    for item_id in test:
        item = manifest[item_id]
        if not item.labels:
            raise ItemError(item_id, f"test item of split {k} has no label")
        missing = [label for label in item.labels if label not in known]
        if missing:
            raise ItemError(item_id, f"class {missing[0]!r} of this test item appears in no "
                                     f"train item of split {k}")
    position = {c: n for n, c in enumerate(classes)}

    def matrix(ids):
        Y = np.zeros((len(ids), len(classes)), dtype=bool)
        for row, item_id in enumerate(ids):
            for label in manifest[item_id].labels:
                Y[row, position[label]] = True
        return Y

    return train, test, classes, matrix(train), matrix(test)


def _score(metric: str, ap_mode: str, Y_true: np.ndarray, scores: np.ndarray) -> float:
    if metric == "accuracy":
        return metrics.accuracy(Y_true.argmax(axis=1), scores.argmax(axis=1))
    return metrics.mean_average_precision(Y_true, scores, ap_mode)


def fold_count(manifest: Manifest, k: int, cv: int | None) -> tuple[int, str | None]:
    """Stratified folds for choosing C on the train items of split ``k``, and a note when
    fewer than :data:`DEFAULT_CV` are used.

    ``cv=None``: :data:`DEFAULT_CV`, or the smallest class's train count when that is fewer
    (each fold needs one item of every class). An explicit ``cv`` larger than that count is
    a :class:`ParameterError`; a class with a single train item is a :class:`FeatpipeError`
    (no stratified split exists).  Multi-label items use plain k-fold: ``cv`` or the default.
    """
    _, _, classes, Y_train, Y_test = split_targets(manifest, k)
    folds = DEFAULT_CV if cv is None else cv
    if Y_train.sum(axis=1).max() > 1 or Y_test.sum(axis=1).max() > 1:
        return folds, None
    counts = Y_train.sum(axis=0)
    smallest = int(counts.argmin())
    name, count = classes[smallest], int(counts[smallest])
    if count >= folds:
        return folds, None
    if count < 2:
        raise FeatpipeError(f"split {k}: class {name!r} has {count} train item, too few to "
                            "cross-validate several --C (each fold needs one of every "
                            "class); give one --C or more train items")
    if cv is not None:
        raise ParameterError("cv", f"is {cv}, but class {name!r} has only {count} train items "
                                   f"in split {k}; use {count} or fewer (or leave --cv out)")
    return count, (f"note: split {k}: class {name!r} has {count} train items, so C is chosen "
                   f"by {count}-fold cross-validation instead of {DEFAULT_CV}")


def _folds(Y: np.ndarray, n_folds: int, multilabel: bool):
    from sklearn.model_selection import KFold, StratifiedKFold

    if n_folds < 2:
        raise ParameterError("cv", f"must be at least 2 to choose among several C, got "
                             f"{n_folds}")
    if not multilabel:
        counts = Y.sum(axis=0)
        if counts.min() < n_folds:
            raise ParameterError("cv", f"is {n_folds}, but a class has only "
                                 f"{int(counts.min())} train items; use "
                                 f"{max(int(counts.min()), 2)} or fewer")
        splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=0)
        return list(splitter.split(np.zeros(len(Y)), Y.argmax(axis=1)))
    splitter = KFold(n_splits=n_folds, shuffle=True, random_state=0)
    return list(splitter.split(np.zeros(len(Y))))


class _Fitted:
    """Train-side data of one split: a fused kernel (libsvm) or fused features (liblinear)."""

    def __init__(self, settings: Settings, train_sets, test_sets, kernels):
        weights = fusion.normalised_weights(len(kernels), settings.weights)
        scale = settings.fusion_scale if len(kernels) > 1 else "none"  # one kernel: as is
        self.gammas = []
        self.scales: list[float] = []  # the factor of each kernel (fusion.scale_factor)
        if settings.solver == "liblinear":
            check_solver(settings.solver, kernels)
            train = [explicit_features(k, X, settings.order)
                     for k, X in zip(kernels, train_sets, strict=True)]
            test = [explicit_features(k, X, settings.order)
                    for k, X in zip(kernels, test_sets, strict=True)]
            self.scales = [fusion.scale_factor(np.einsum("ij,ij->i", F, F), scale)
                           for F in train]
            weights = weights * np.asarray(self.scales)
            self.train = fusion.fuse_features(train, weights)
            self.test = fusion.fuse_features(test, weights)
            self.gammas = [None] * len(kernels)
            return
        self.train = self.test = None  # one input's kernels at a time, added into the sums
        for kernel, X_train, X_test, weight in zip(kernels, train_sets, test_sets, weights,
                                                   strict=True):
            fitted = PrecomputedKernel(kernel, gamma=settings.gamma, order=settings.order,
                                       n_jobs=settings.n_jobs).fit(X_train)
            self.gammas.append(fitted.gamma_)
            factor = fusion.scale_factor(np.diagonal(fitted.train_kernel_), scale)
            self.scales.append(factor)
            self.test = fusion.accumulate(self.test, fitted.transform(X_test), weight * factor)
            self.train = fusion.accumulate(self.train, fitted.train_kernel_, weight * factor)

    def train_subset(self, rows, cols, kernel: bool):
        return self.train[np.ix_(rows, cols)] if kernel else self.train[rows]


def _classifier(settings: Settings, C: float):
    if settings.solver == "liblinear":
        return OneVsRestLinearSVC(C=C)
    return OneVsRestSVC(C=C)


def run_split(stages: Sequence[Stage], kernels: Sequence[str], manifest: Manifest, k: int,
              settings: Settings) -> dict:
    """Classify split ``k``; returns a JSON-ready dict of settings, numbers and predictions."""
    if settings.solver not in SOLVERS:
        raise InputError(f"solver must be one of {SOLVERS}, got {settings.solver!r}")
    train, test, classes, Y_train, Y_test = split_targets(manifest, k)
    multilabel = bool(Y_train.sum(axis=1).max() > 1 or Y_test.sum(axis=1).max() > 1)
    if settings.metric == "accuracy" and multilabel:
        raise ParameterError("metric", "accuracy is undefined for multi-label items; use map")
    started = time.perf_counter()
    train_sets = [normalize_rows(load_encodings(s, train, "train"), settings.normalize)
                  for s in stages]
    test_sets = [normalize_rows(load_encodings(s, test, "test"), settings.normalize)
                 for s in stages]
    for stage, X_train, X_test in zip(stages, train_sets, test_sets, strict=True):
        if X_test.shape[1] != X_train.shape[1]:
            raise InputError(f"input {stage.name}: test items have {X_test.shape[1]} "
                             f"dimensions, train items have {X_train.shape[1]}")
    data = _Fitted(settings, train_sets, test_sets, kernels)
    kernel_seconds = time.perf_counter() - started
    use_kernel = settings.solver == "libsvm"

    cv_scores = {}
    C = settings.Cs[0]
    if len(settings.Cs) > 1:
        folds = _folds(Y_train, settings.cv, multilabel)
        for candidate in settings.Cs:
            fold_scores = []
            for fit_rows, val_rows in folds:
                model = _classifier(settings, candidate).fit(
                    data.train_subset(fit_rows, fit_rows, use_kernel), Y_train[fit_rows])
                scores = model.decision_function(
                    data.train_subset(val_rows, fit_rows, use_kernel))
                fold_scores.append(_score(settings.metric, settings.ap_mode,
                                          Y_train[val_rows], scores))
            cv_scores[repr(float(candidate))] = float(np.mean(fold_scores))
        C = max(settings.Cs, key=lambda c: cv_scores[repr(float(c))])  # first best wins ties

    started = time.perf_counter()
    model = _classifier(settings, C).fit(data.train, Y_train)
    scores = model.decision_function(data.test)
    train_seconds = time.perf_counter() - started

    ap = metrics.per_class_ap(Y_test, scores, settings.ap_mode)
    result = {
        "split": k,
        "n_train": len(train),
        "n_test": len(test),
        "classes": classes,
        "multilabel": multilabel,
        "C": float(C),
        "cv_scores": cv_scores,
        "cv_folds": settings.cv if len(settings.Cs) > 1 else None,
        "gammas": data.gammas,
        "kernel_scales": data.scales,
        "per_class_ap": [None if np.isnan(v) else float(v) for v in ap],
        "map": float(np.nanmean(ap)) if not np.all(np.isnan(ap)) else None,
        "seconds": {"kernels": round(kernel_seconds, 3), "svm": round(train_seconds, 3)},
    }
    predictions = []
    if not multilabel:
        true_index = Y_test.argmax(axis=1)
        predicted = scores.argmax(axis=1)
        result["accuracy"] = metrics.accuracy(true_index, predicted)
        result["n_correct"] = int((true_index == predicted).sum())
        per_class = metrics.per_class_accuracy(true_index, predicted, len(classes))
        result["per_class_accuracy"] = [None if np.isnan(v) else float(v) for v in per_class]
        result["mean_per_class_accuracy"] = float(np.nanmean(per_class))
        result["confusion"] = metrics.confusion_matrix(true_index, predicted,
                                                       len(classes)).tolist()
    for row, item_id in enumerate(test):
        entry = {"id": item_id, "labels": list(manifest[item_id].labels),
                 "scores": [float(v) for v in scores[row]]}
        if not multilabel:
            entry["predicted"] = classes[int(scores[row].argmax())]
        predictions.append(entry)
    result["predictions"] = predictions
    result["score"] = result["accuracy"] if settings.metric == "accuracy" else result["map"]
    return result


def summarise(results: Sequence[dict], metric: str) -> dict:
    """Mean and (population) standard deviation of the headline metric over splits."""
    values = np.array([r["score"] for r in results], dtype=np.float64)
    return {"metric": metric, "splits": [r["split"] for r in results],
            "values": values.tolist(), "mean": float(values.mean()),
            "std": float(values.std())}
