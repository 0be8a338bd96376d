"""scikit-learn's contract for every featpipe estimator: BaseEstimator, declared and validated
parameters, clone, GridSearchCV, and check_estimator where the estimator takes 2-D arrays."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone, is_classifier
from sklearn.metrics import roc_auc_score
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV, check_cv
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC
from sklearn.utils._param_validation import generate_invalid_param_val, make_constraint
from sklearn.utils.estimator_checks import parametrize_with_checks

from featpipe.classify.kernels import PrecomputedKernel
from featpipe.classify.svm import OneVsRestLinearSVC, OneVsRestSVC
from featpipe.encode.bilinear import SecondOrderPooling
from featpipe.encode.fisher import FisherVector, GaussianMixtureModel, fisher_vector
from featpipe.encode.homkermap import HomogeneousKernelMap
from featpipe.encode.spatial import SpatialGridPooling
from featpipe.encode.standardize import Standardizer
from featpipe.encode.temporal import (
    ApproximateRankPooling,
    AveragePooling,
    HierarchicalRankPooling,
    MaxPooling,
    RankPooling,
    RecursiveRankPooling,
    TemporalPyramid,
)
from featpipe.errors import InputError, ParameterError
from featpipe.extract.pca import PCAProjection
from featpipe.learn.deep_fisher import DeepFisherKernel
from featpipe.learn.dhrp import DiscriminativeRankPooling
from featpipe.learn.gmsop import GatedMixtureSOP
from featpipe.parameters import estimator_parameters

ESTIMATORS = [AveragePooling, MaxPooling, TemporalPyramid, ApproximateRankPooling, RankPooling,
              HierarchicalRankPooling, RecursiveRankPooling, Standardizer, SpatialGridPooling,
              FisherVector, GaussianMixtureModel, SecondOrderPooling, HomogeneousKernelMap,
              PCAProjection, DeepFisherKernel, DiscriminativeRankPooling, GatedMixtureSOP,
              OneVsRestSVC, OneVsRestLinearSVC, PrecomputedKernel]

#: Why FisherVector fails these checks: every one of them calls ``transform`` on a 2-D array.
#: FisherVector.transform takes a *list* of (n_i, D) descriptor sets, one per item (documented
#: in its docstring), and refuses a 2-D array, which would be one image's descriptors: encoding
#: its rows as separate items would be silently wrong.  ``fit`` takes 2-D arrays and passes.
_LIST_INPUT = "transform takes a list of descriptor sets; this check transforms a 2-D array"
FISHER_VECTOR_EXPECTED_FAILURES = {name: _LIST_INPUT for name in (
    "check_dict_unchanged", "check_dtype_object", "check_estimators_dtypes",
    "check_estimators_nan_inf", "check_estimators_pickle", "check_f_contiguous_array_estimator",
    "check_fit2d_predict1d", "check_fit_idempotent", "check_fit_score_takes_y",
    "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_n_features_in_after_fitting", "check_pipeline_consistency",
    "check_transformer_data_not_an_array", "check_transformer_general",
    "check_transformer_preserve_dtypes")}


def _expected_failures(estimator):
    if isinstance(estimator, FisherVector):
        return FISHER_VECTOR_EXPECTED_FAILURES
    return {}  # HomogeneousKernelMap passes every check


@parametrize_with_checks([HomogeneousKernelMap(), FisherVector(n_components=2, max_iter=5)],
                         expected_failed_checks=_expected_failures)
def test_scikit_learn_checks(estimator, check):
    check(estimator)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_declared_cloned_and_validated(cls):
    """Every parameter has a docstring entry and a constraint, ``clone`` and ``set_params``
    round-trip, seeds are ``random_state``, and a value outside each constraint raises a
    ParameterError naming the parameter."""
    assert issubclass(cls, BaseEstimator)
    parameters = estimator_parameters(cls, exclude=("xp",))
    estimator = cls()
    params = estimator.get_params(deep=True)
    assert {p.name for p in parameters} <= set(params)
    assert "seed" not in params
    again = clone(estimator).set_params(**estimator.get_params(deep=False))
    assert again.get_params(deep=False) == estimator.get_params(deep=False)
    for param in parameters:
        constraints = [make_constraint(c) for c in param.constraints]
        for constraint in constraints:
            try:
                bad = generate_invalid_param_val(constraint)
            except NotImplementedError:
                continue
            if any(c.is_satisfied_by(bad) for c in constraints):
                continue
            with pytest.raises(ParameterError, match=f"^{param.name} must be") as raised:
                cls.check_param_values({param.name: bad})
            assert raised.value.param == param.name


def _drifting_sequences(n_per_class=8, seed=0):
    """'up' sequences drift one way, 'down' the other; the same values, so only the order
    separates them (rank pooling can, average pooling cannot)."""
    rng = np.random.default_rng(seed)
    seqs, labels = [], []
    for label, sign in (("up", 1.0), ("down", -1.0)):
        for _ in range(n_per_class):
            T = int(rng.integers(12, 20))
            drift = sign * np.linspace(-1, 1, T)[:, None] * np.array([1.0, 0.4, -0.6])
            seqs.append(drift + 0.2 * rng.standard_normal((T, 3)))
            labels.append(label)
    return seqs, np.asarray(labels)


def _hand_scores(grid, build, X, y) -> list[float]:
    """Each setting of a fitted search scored by hand: the estimator built by ``build(**params)``
    (its constructor, not ``set_params``), fitted and scored on the search's own folds."""
    folds = list(check_cv(grid.cv, y, classifier=is_classifier(grid.estimator)).split(X, y))
    scores = []
    for params in grid.cv_results_["params"]:
        fold_scores = []
        for train, test in folds:
            fit_on, score_on = [X[i] for i in train], [X[i] for i in test]
            if y is None:  # a density model: score = mean log-likelihood
                fold_scores.append(build(**params).fit(fit_on).score(score_on))
            else:
                fold_scores.append(build(**params).fit(fit_on, y[train]).score(score_on,
                                                                             y[test]))
        scores.append(float(np.mean(fold_scores)))
    return scores


def _check_search(grid, build, X, y=None):
    """The search's mean scores are the hand-made ones, its best setting their argmax, and
    the settings do not all score alike (the parameters reached the estimator)."""
    hand = _hand_scores(grid, build, X, y)
    np.testing.assert_allclose(grid.cv_results_["mean_test_score"], hand, rtol=1e-9)
    assert grid.best_params_ == grid.cv_results_["params"][int(np.argmax(hand))]
    assert len(set(np.round(hand, 12))) > 1
    return hand


def test_grid_search_over_temporal_encoder_parameters():
    seqs, labels = _drifting_sequences()
    pipe = make_pipeline(HierarchicalRankPooling(), LinearSVC(C=10.0))
    grid = GridSearchCV(pipe, {"hierarchicalrankpooling__window": [4, 8],
                               "hierarchicalrankpooling__psi": ["ssr", "ser"]}, cv=2)
    grid.fit(seqs, labels)
    _check_search(grid, lambda hierarchicalrankpooling__window, hierarchicalrankpooling__psi:
                  make_pipeline(HierarchicalRankPooling(window=hierarchicalrankpooling__window,
                                                        psi=hierarchicalrankpooling__psi),
                                LinearSVC(C=10.0)), seqs, labels)
    blind = GridSearchCV(make_pipeline(AveragePooling(), LinearSVC(C=10.0)),
                         {"linearsvc__C": [1.0, 10.0]}, cv=2).fit(seqs, labels)
    assert blind.best_score_ < grid.best_score_  # average pooling cannot see the order


def test_grid_search_over_fisher_vector_and_kernel_map_parameters():
    rng = np.random.default_rng(1)
    items = [rng.normal(size=(30, 4)) + (i % 2) for i in range(12)]
    labels = np.arange(12) % 2
    grid = GridSearchCV(make_pipeline(FisherVector(max_iter=10), LinearSVC()),
                        {"fishervector__n_components": [2, 3],
                         "fishervector__improved": [True, False]}, cv=2,
                        scoring="roc_auc").fit(items, labels)
    folds = list(check_cv(2, labels, classifier=True).split(items, labels))
    for params, score in zip(grid.cv_results_["params"], grid.cv_results_["mean_test_score"],
                             strict=True):
        aucs = []
        for train, test in folds:
            model = make_pipeline(FisherVector(max_iter=10,
                                               n_components=params["fishervector__n_components"],
                                               improved=params["fishervector__improved"]),
                                  LinearSVC()).fit([items[i] for i in train], labels[train])
            aucs.append(roc_auc_score(labels[test],
                                      model.decision_function([items[i] for i in test])))
        assert score == pytest.approx(np.mean(aucs), rel=1e-9)
    X = np.abs(rng.normal(size=(40, 5))) + np.arange(40)[:, None] % 2
    y = np.arange(40) % 2
    grid = GridSearchCV(make_pipeline(HomogeneousKernelMap(), LinearSVC()),
                        {"homogeneouskernelmap__order": [1, 2]}, cv=2).fit(X, y)
    maps = [HomogeneousKernelMap(order=n).fit_transform(X) for n in (1, 2)]
    assert [m.shape[1] for m in maps] == [15, 25]  # (2n + 1) D: the order reached the map
    np.testing.assert_allclose(grid.cv_results_["mean_test_score"], _hand_scores(
        grid, lambda homogeneouskernelmap__order: make_pipeline(
            HomogeneousKernelMap(order=homogeneouskernelmap__order), LinearSVC()), X, y))
    sets = [rng.normal(size=(10, 3)) * (1 + i % 2) for i in range(12)]
    grid = GridSearchCV(make_pipeline(SecondOrderPooling(), LinearSVC()),
                        {"secondorderpooling__norm": ["ssr", "sqrtm"]}, cv=2).fit(sets, labels)
    np.testing.assert_allclose(grid.cv_results_["mean_test_score"], _hand_scores(
        grid, lambda secondorderpooling__norm: make_pipeline(
            SecondOrderPooling(norm=secondorderpooling__norm), LinearSVC()), sets, labels))
    blobs = rng.normal(size=(200, 2)) + np.repeat([[0, 0], [5, 5], [0, 5]], [70, 70, 60], 0)
    blobs = rng.permutation(blobs)
    grid = GridSearchCV(GaussianMixtureModel(max_iter=10), {"n_components": [1, 3]}, cv=2)
    grid.fit(blobs)
    hand = _check_search(grid, lambda n_components: GaussianMixtureModel(
        max_iter=10, n_components=n_components), blobs)
    assert grid.best_params_ == {"n_components": 3}  # the log-likelihood picks three blobs
    assert hand[1] > hand[0]


def test_fisher_vector_accepts_a_fitted_scikit_learn_diagonal_gmm():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 3))
    sk = GaussianMixture(3, covariance_type="diag", random_state=0).fit(X)
    items = [rng.normal(size=(20, 3)) for _ in range(3)]
    got = FisherVector(gmm=sk).fit(X).transform(items)
    for row, x in zip(got, items, strict=True):
        np.testing.assert_array_equal(row, fisher_vector(x, sk.weights_, sk.means_,
                                                         sk.covariances_))
    with pytest.raises(ParameterError, match="gmm must have diagonal covariances"):
        FisherVector(gmm=GaussianMixture(2, covariance_type="full").fit(X)).fit(X)
    with pytest.raises(ParameterError, match="gmm must be a fitted GMM"):
        FisherVector(gmm=GaussianMixture(2, covariance_type="diag")).fit(X)
    with pytest.raises(InputError, match="dimension 2 does not match the GMM's 3"):
        FisherVector(gmm=sk).fit(X[:, :2])
