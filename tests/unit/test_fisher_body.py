"""The one Fisher-vector body: batched segment sums equal per-item FVs, descriptors far from
every Gaussian (1e6..1e13) against a float64 reference, autograd gradients (gradcheck), the
reverse pass of a batch, and the squared-hinge SVMs fed to liblinear as CSR."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
import scipy.special
import torch
from scipy.stats import norm

from featpipe.encode.fisher import (
    FisherAccumulator,
    GaussianMixtureModel,
    fisher_vector,
    fisher_vectors,
    improve,
    logsumexp,
    posteriors,
)
from featpipe.errors import InputError
from featpipe.learn.deep_fisher import (
    bucket_plan,
    fisher_backward,
    fisher_forward,
    svm_objective,
    train_squared_hinge,
    train_squared_hinge_classes,
)
from tests.unit.test_fisher import literal_fisher_vector


@pytest.fixture(scope="module")
def normal_gmm():
    """A GMM fitted on N(0, 1) data, as in the bug report."""
    x = np.random.default_rng(0).standard_normal((4000, 6))
    return GaussianMixtureModel(8, max_iter=30, random_state=0).fit(x)


def _theta(gmm):
    return np.log(gmm.weights_), gmm.means_, 0.5 * np.log(gmm.variances_)


SCALES = [1e3, 1e5, 1e6, 1e7, 1e8, 1e9, 1e11, 1e12, 1e13, 1e15, 1e18, 1e30]


@pytest.mark.parametrize("scale", SCALES)
def test_far_descriptors_against_the_float64_reference(normal_gmm, scale):
    gmm = normal_gmm
    rng = np.random.default_rng(int(np.log10(scale)))
    outliers = [np.full((1, 6), scale), np.full((1, 6), -scale),
                scale * rng.uniform(0.5, 1.0, (3, 6)) * rng.choice([-1, 1], (3, 6)),
                np.concatenate([rng.standard_normal((50, 6)), np.full((1, 6), scale)])]
    for x in outliers:
        ref = literal_fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
        assert abs(np.linalg.norm(ref) - 1.0) < 1e-9
        ours = fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
        assert abs(np.linalg.norm(ours) - 1.0) < 1e-5, (scale, np.linalg.norm(ours))
        np.testing.assert_allclose(ours, ref, atol=2e-6)
        if scale <= 1e13:  # the body in float64, through the GEMM of the deep Fisher path
            phi, _ = fisher_forward(x, *_theta(gmm))
            np.testing.assert_allclose(phi, ref, atol=1e-9)


def test_descriptors_beyond_float64_squares_are_refused(normal_gmm):
    gmm = normal_gmm
    with pytest.raises(InputError, match="too large"):
        fisher_vector(np.full((1, 6), 1e200), gmm.weights_, gmm.means_, gmm.variances_)


def test_posteriors_and_logsumexp_never_underflow_to_zero():
    log_joint = np.array([[-1e26, -2e26, -1e27], [-np.inf, -5.0, -np.inf], [0.0, -1e3, -1e3]])
    gamma = posteriors(log_joint)
    np.testing.assert_allclose(gamma.sum(axis=1), 1.0)
    assert gamma[0, 0] == 1.0 and gamma[1, 1] == 1.0
    np.testing.assert_allclose(logsumexp(log_joint, axis=1), [-1e26, -5.0, 0.0])
    assert logsumexp(np.full((1, 3), -np.inf), axis=1)[0] == -np.inf


def test_gmm_e_step_with_a_far_outlier(normal_gmm):
    gmm = normal_gmm
    x = np.concatenate([np.random.default_rng(1).standard_normal((20, 6)),
                        np.full((1, 6), 1e9)])
    # the literal mean log-likelihood, log Σ_k w_k N(x; μ_k, σ_k²) in float64 (about -1.5e17)
    literal = np.mean(scipy.special.logsumexp(np.log(gmm.weights_) + norm.logpdf(
        x[:, None, :], gmm.means_, np.sqrt(gmm.variances_)).sum(axis=2), axis=1))
    assert gmm.score(x) == pytest.approx(literal, rel=1e-9)
    stats, loglik = gmm._e_step(x - gmm.center_, gmm.weights_, gmm.means_ - gmm.center_,
                                gmm.variances_)
    assert loglik == pytest.approx(literal, rel=1e-9) and stats[0].sum() == pytest.approx(21.0)


def test_batched_body_equals_each_item_and_the_encoder(normal_gmm):
    gmm = normal_gmm
    rng = np.random.default_rng(2)
    items = [rng.standard_normal((n, 6)) * 1.5 for n in (7, 30, 1, 18)]
    width = max(len(x) for x in items)
    X = np.zeros((len(items), width, 6))
    for b, x in enumerate(items):
        X[b, :len(x)] = x
        X[b, len(x):] = 50.0  # padding must not count, whatever it holds
    phi, _ = fisher_vectors(X, *_theta(gmm), lengths=[len(x) for x in items])
    for b, x in enumerate(items):
        np.testing.assert_allclose(phi[b], fisher_forward(x, *_theta(gmm))[0], atol=1e-12)
        np.testing.assert_allclose(phi[b], fisher_vector(x, gmm.weights_, gmm.means_,
                                                         gmm.variances_), atol=2e-6)
    strict, _ = fisher_vectors(array_api_strict.asarray(X),
                               *(array_api_strict.asarray(p) for p in _theta(gmm)),
                               lengths=[len(x) for x in items])
    np.testing.assert_allclose(np.asarray(strict), phi, atol=1e-12)


def test_accumulator_parts_and_raw_fv_use_the_same_normalisation(normal_gmm):
    gmm = normal_gmm
    x = np.random.default_rng(3).standard_normal((40, 6))
    parts = FisherAccumulator(gmm.weights_, gmm.means_, gmm.variances_, improved=False)
    for chunk in np.array_split(x, 4):
        parts.add(chunk)
    raw, _ = fisher_vectors(x[None], *_theta(gmm), improved=False)
    np.testing.assert_allclose(parts.result(), raw[0], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(improve(raw[0]), fisher_vector(x, gmm.weights_, gmm.means_,
                                                              gmm.variances_), atol=2e-6)


def test_batched_reverse_pass_is_the_sum_of_per_item_passes(normal_gmm):
    gmm = normal_gmm
    rng = np.random.default_rng(4)
    items = [rng.standard_normal((n, 6)) for n in (9, 4, 12)]
    X = np.zeros((3, 12, 6))
    for b, x in enumerate(items):
        X[b, :len(x)] = x
    phi, cache = fisher_vectors(X, *_theta(gmm), lengths=[9, 4, 12])
    g_phi = rng.standard_normal(phi.shape)
    batch = fisher_backward(cache, g_phi)
    single = [fisher_backward(fisher_forward(x, *_theta(gmm))[1], g) for x, g in
              zip(items, g_phi, strict=True)]
    for block in range(3):
        np.testing.assert_allclose(batch[block], sum(s[block] for s in single), rtol=1e-10,
                                   atol=1e-12)


def test_gradcheck_fisher_forward(normal_gmm):
    """torch autograd through the FV (the normaliser included) equals finite differences."""
    gmm = normal_gmm
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.standard_normal((12, 6)), requires_grad=True)
    theta = [torch.tensor(p, requires_grad=True) for p in _theta(gmm)]

    def forward(x, a, mu, s):
        return fisher_forward(x, a, mu, s, threshold=0.0)[0]

    assert torch.autograd.gradcheck(forward, (x, *theta))
    # and equals the hand-written reverse pass
    g_phi = torch.tensor(rng.standard_normal(2 * 8 * 6))
    phi, cache = fisher_forward(x.detach(), *(p.detach() for p in theta), threshold=0.0)
    ours = fisher_backward(cache, g_phi)
    auto = torch.autograd.grad(forward(x, *theta) @ g_phi, theta)
    for a, b in zip(ours, auto, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-10)


def test_fisher_backward_refuses_tensors_that_require_grad(normal_gmm):
    x = torch.zeros((3, 6), dtype=torch.float64)
    phi, cache = fisher_forward(x, *(torch.tensor(p) for p in _theta(normal_gmm)))
    with pytest.raises(InputError, match="not differentiable"):
        fisher_backward(cache, torch.ones_like(phi, requires_grad=True))


def test_bucket_plan_bounds_padding_and_memory():
    lengths = [10, 1000, 11, 12, 990, 0, 40]
    buckets = bucket_plan(lengths, row_bytes=8, budget=8 * 2500)
    assert sorted(np.concatenate([b.index for b in buckets]).tolist()) == list(range(7))
    for bucket in buckets:
        sizes = np.asarray(lengths)[bucket.index]
        assert bucket.width == sizes.max()
        assert bucket.width <= 1.25 * sizes.min() + 16
        assert len(sizes) * max(bucket.width, 1) * 8 <= 8 * 2500 or len(sizes) == 1
        assert (bucket.lengths is None) == bool(np.all(sizes == bucket.width))


def test_squared_hinge_svms_of_all_classes_equal_separate_liblinear_calls():
    from liblinear import liblinearutil

    rng = np.random.default_rng(6)
    phi = rng.standard_normal((60, 25))
    phi[:, 3] = 0.0  # an all-zero feature keeps its (zero) weight
    Y = np.where(rng.integers(0, 3, 60)[:, None] == np.arange(3), 1.0, -1.0)
    W = train_squared_hinge_classes(phi, Y, C=5.0, tol=1e-8)
    for j in range(3):
        model = liblinearutil.train(Y[:, j], phi, "-s 2 -c 5.0 -B -1 -e 1e-8 -q")
        w = np.zeros(25)
        raw = np.ctypeslib.as_array(model.w, shape=(model.nr_feature,))
        w[:len(raw)] = raw if model.get_labels()[0] == 1 else -raw
        ours, ref = svm_objective(W[j], phi, Y[:, j:j + 1], 5.0), \
            svm_objective(w, phi, Y[:, j:j + 1], 5.0)
        assert abs(ours - ref) <= 1e-6 * ref
        np.testing.assert_allclose(W[j], w, atol=1e-6)
    np.testing.assert_allclose(train_squared_hinge(phi, Y[:, 1], 5.0, 1e-8), W[1])
