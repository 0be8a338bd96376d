"""Fisher vectors: VLFeat (cyvlfeat) on real dense SIFT, the literal formula, layouts, errors."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.encode.fisher import (
    FisherItemEncoder,
    FisherVector,
    GaussianMixtureModel,
    fisher_vector,
    pyramid_regions,
)
from featpipe.errors import InputError
from tests.fisher_data import sample_image_descriptors, single_thread_blas


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with single_thread_blas():
        yield



def literal_fisher_vector(x, weights, means, variances, improved=True, threshold=1e-6):
    """docs/methods.md (VLFeat's vl_fisher) transcribed in float64, one pair at a time."""
    k, dim = means.shape
    n = x.shape[0]
    sigma = np.sqrt(variances)
    valid = weights >= 1e-6
    logp = np.full((n, k), -np.inf)
    for j in range(k):
        if valid[j]:
            logp[:, j] = (np.log(weights[j]) - 0.5 * np.sum(np.log(2 * np.pi * variances[j]))
                          - 0.5 * np.sum((x - means[j]) ** 2 / variances[j], axis=1))
    gamma = np.exp(logp - logp.max(axis=1, keepdims=True))
    gamma /= gamma.sum(axis=1, keepdims=True)
    u = np.zeros((k, dim))
    v = np.zeros((k, dim))
    for j in range(k):
        if not valid[j]:
            continue
        for t in range(n):
            if gamma[t, j] < threshold:
                continue
            d = (x[t] - means[j]) / sigma[j]
            u[j] += gamma[t, j] * d
            v[j] += gamma[t, j] * (d * d - 1)
        u[j] /= n * np.sqrt(weights[j])
        v[j] /= n * np.sqrt(2 * weights[j])
    z = np.concatenate([u.ravel(), v.ravel()])
    if improved:
        z = np.sign(z) * np.sqrt(np.abs(z))
        z /= max(np.linalg.norm(z), 1e-12)
    return z


@pytest.fixture(scope="module")
def photo_sift():
    """Real dense SIFT (OpenCV, grid) of the two sample photographs, PCA-64, and a GMM."""
    images = sample_image_descriptors(step=8, bin_size=6)
    stacked = np.concatenate([d for d, _, _ in images]).astype(np.float64)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked[::4] - mean, full_matrices=False)[2][:64]
    projected = [((d - mean) @ components.T).astype(np.float32) for d, _, _ in images]
    sample = np.concatenate(projected)[::4]
    gmm = GaussianMixtureModel(16, max_iter=30, random_state=0).fit(sample)
    return projected, gmm, images


@pytest.mark.vlfeat
@pytest.mark.parametrize("improved", [True, False])
def test_equals_cyvlfeat_on_real_dense_sift(photo_sift, improved):
    cyvlfeat_fisher = pytest.importorskip("cyvlfeat.fisher").fisher
    projected, gmm, _ = photo_sift
    means = gmm.means_.astype(np.float32)
    variances = gmm.variances_.astype(np.float32)
    weights = gmm.weights_.astype(np.float32)
    for x in projected:
        ours = fisher_vector(x, weights, means, variances, improved=improved)
        ref = cyvlfeat_fisher(x, means, variances, weights, improved=improved).ravel()
        assert ours.shape == ref.shape == (2 * 16 * 64,)
        # improved: unit norm, 1e-5 absolute; raw: both sum thousands of float32 terms
        tolerance = 1e-5 if improved else 1e-4 * np.abs(ref).max()
        assert np.abs(ours - ref).max() <= tolerance


@pytest.mark.vlfeat
def test_tiny_prior_component_is_skipped_like_vlfeat(photo_sift):
    cyvlfeat_fisher = pytest.importorskip("cyvlfeat.fisher").fisher
    projected, gmm, _ = photo_sift
    weights = gmm.weights_.copy()
    weights[0] = 5e-7
    weights /= weights.sum()
    args = [a.astype(np.float32) for a in (gmm.means_, gmm.variances_, weights)]
    ours = fisher_vector(projected[0], args[2], args[0], args[1])
    ref = cyvlfeat_fisher(projected[0], *args, improved=True).ravel()
    assert np.abs(ours - ref).max() <= 1e-5
    assert not np.any(ours[:64]) and not np.any(ours[16 * 64:17 * 64])


def test_equals_the_literal_formula_with_skipped_pairs():
    rng = np.random.default_rng(0)
    k, dim = 6, 5
    means = rng.normal(size=(k, dim)) * 3
    variances = rng.uniform(0.2, 2.0, size=(k, dim))
    weights = rng.dirichlet(np.ones(k))
    weights[2] = 1e-7  # skipped component
    weights /= weights.sum()
    x = means[rng.integers(0, k, 300)] + rng.normal(size=(300, dim))
    for improved in (True, False):
        ours = fisher_vector(x, weights, means, variances, improved=improved)
        ref = literal_fisher_vector(x, weights, means, variances, improved=improved)
        np.testing.assert_allclose(ours, ref, rtol=2e-5, atol=2e-6 * np.abs(ref).max())
    ours = fisher_vector(x, weights, means, variances, posterior_threshold=0.2)
    np.testing.assert_allclose(ours, literal_fisher_vector(x, weights, means, variances,
                                                           threshold=0.2), atol=2e-6)


def test_empty_or_zero_signal_gives_zeros_not_nan():
    means = np.zeros((3, 4))
    variances = np.ones((3, 4))
    weights = np.full(3, 1 / 3)
    empty = fisher_vector(np.zeros((0, 4)), weights, means, variances)
    assert empty.shape == (24,) and not np.any(empty)
    # one descriptor at the common mean with unit variance: every posterior is 1/3, so
    # F^k = 0 and G^k = (1/3)(0 - 1)/sqrt(2/3) per dimension (all means first, then all
    # variances); improved: SSR then L2 over 12 equal entries gives -1/sqrt(12)
    raw = fisher_vector(np.zeros((1, 4)), weights, means, variances, improved=False)
    np.testing.assert_allclose(raw, np.r_[np.zeros(12), np.full(12, -(1 / 3) / np.sqrt(2 / 3))],
                               rtol=1e-6)
    fv = fisher_vector(np.zeros((1, 4)), weights, means, variances)
    np.testing.assert_allclose(fv, np.r_[np.zeros(12), np.full(12, -1 / np.sqrt(12))],
                               rtol=1e-6)


def test_estimator_fit_transform_and_errors(photo_sift):
    projected, _, _ = photo_sift
    small = [x[:, :8] for x in projected]
    enc = FisherVector(n_components=4, max_iter=20).fit(small)
    out = enc.transform(small)
    assert out.shape == (2, 2 * 4 * 8) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    with pytest.raises(InputError, match="list of"):
        enc.transform(small[0])
    with pytest.raises(InputError, match="does not match"):
        enc.transform([projected[0]])
    with pytest.raises(InputError, match="not fitted"):
        FisherVector().transform(small)


def _encoder(gmm, **kwargs):
    return FisherItemEncoder(gmm.to_arrays()[0], **kwargs)


def test_spatial_pyramid_regions_on_real_positions(photo_sift):
    projected, gmm, images = photo_sift
    x, (_, positions, shape) = projected[0], images[0]
    enc = _encoder(gmm, pyramid="1x1+2x2+3x1")
    out = enc.encode_one(x, {"positions": positions, "image_size": np.asarray(shape)})
    block = 2 * 16 * 64
    assert out.shape == (8 * block,)
    masks = pyramid_regions(positions, shape, "1x1+2x2+3x1")
    assert [int(m.sum()) for m in masks][0] == len(x)
    assert sum(int(m.sum()) for m in masks[1:5]) == len(x) == sum(int(m.sum())
                                                                  for m in masks[5:])
    top_left = (positions[:, 0] < shape[1] / 2) & (positions[:, 1] < shape[0] / 2)
    np.testing.assert_array_equal(masks[1], top_left)
    middle_band = (positions[:, 1] >= shape[0] / 3) & (positions[:, 1] < 2 * shape[0] / 3)
    np.testing.assert_array_equal(masks[6], middle_band)
    for i, mask in enumerate(masks):
        expected = fisher_vector(x[mask], gmm.weights_, gmm.means_, gmm.variances_)
        np.testing.assert_array_equal(out[i * block:(i + 1) * block], expected)
    with pytest.raises(InputError, match="positions"):
        enc.encode_one(x, {})


def test_per_frame_layouts(photo_sift):
    projected, gmm, _ = photo_sift
    x = projected[0][:90]
    frames = np.repeat([0, 2, 3], 30)
    enc = _encoder(gmm, per_frame=True)
    out = enc.encode_one(x, {"frame_index": frames, "timestamps": np.arange(5) / 25.0})
    assert out.shape == (5, 2 * 16 * 64)
    np.testing.assert_array_equal(out[2], fisher_vector(x[30:60], gmm.weights_, gmm.means_,
                                                        gmm.variances_))
    assert not np.any(out[1]) and not np.any(out[4])
    stacked = enc.encode_one(x.reshape(3, 30, 64), {})
    np.testing.assert_array_equal(stacked[1], out[2])
    with pytest.raises(InputError, match="frame"):
        enc.encode_one(x, {})
    with pytest.raises(InputError, match="expected"):
        _encoder(gmm).encode_one(x[:, :10], {})


def test_stacked_per_class_gmm_concatenates(photo_sift):
    projected, gmm, _ = photo_sift
    arrays = {k: np.stack([v, v]) for k, v in gmm.to_arrays()[0].items()}
    out = FisherItemEncoder(arrays).encode_one(projected[1], {})
    single = fisher_vector(projected[1], gmm.weights_, gmm.means_, gmm.variances_)
    np.testing.assert_array_equal(out, np.concatenate([single, single]))


def test_large_items_are_encoded_in_blocks(photo_sift, monkeypatch):
    import featpipe.encode.fisher as fisher_module

    projected, gmm, _ = photo_sift
    whole = fisher_vector(projected[0], gmm.weights_, gmm.means_, gmm.variances_)
    monkeypatch.setattr(fisher_module, "_CHUNK", 1000)
    blocks = fisher_vector(projected[0], gmm.weights_, gmm.means_, gmm.variances_)
    np.testing.assert_allclose(blocks, whole, atol=1e-6)


def test_real_descriptors_are_resolved_by_the_float32_bound():
    """On real PCA-SIFT the float32 GEMM's rounding bound leaves few pairs to recompute in
    float64 (a bound that sent every pair there made the encoder 10x slower), and the FV is
    the float64 one.  featpipe's dense SIFT zeroes low-contrast descriptors, which gives the
    GMM narrow components (variance floor): the hard case for the bound."""
    from sklearn.datasets import load_sample_images

    from featpipe.encode.fisher import FisherAccumulator
    from featpipe.extract.dsift import DenseSIFT, to_grey

    sift = DenseSIFT(sizes=[4, 6, 8, 10], step=8)
    descs = [sift.compute(to_grey(image)).descriptors.astype(np.float64)
             for image in load_sample_images().images]
    stacked = np.concatenate(descs)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked[::4] - mean, full_matrices=False)[2][:64]
    projected = [(d - mean) @ components.T for d in descs]
    gmm = GaussianMixtureModel(16, max_iter=30, random_state=0).fit(
        np.concatenate(projected)[::2])
    for x in projected:
        accumulator = FisherAccumulator(gmm.weights_, gmm.means_, gmm.variances_).add(x)
        ref = literal_fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
        assert np.abs(accumulator.result() - ref).max() <= 1e-5
        assert accumulator.exact_pairs <= 6 * len(x), accumulator.exact_pairs / len(x)
