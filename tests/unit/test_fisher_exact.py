"""One posterior routine, and Fisher vectors that equal the float64 definition on any BLAS
kernel, any split of the descriptors and any thread count (issue 25, sections 1 and 2).

References: the literal float64 transcription of the FV (test_fisher.literal_fisher_vector),
scipy.special.logsumexp, and the source tree itself (no second log-sum-exp / GEMM form)."""

from __future__ import annotations

import re
from pathlib import Path

import array_api_strict
import numpy as np
import pytest
import scipy.special
import torch

import featpipe
from featpipe.encode import fisher, posterior
from featpipe.encode.fisher import (
    FisherAccumulator,
    GaussianMixtureModel,
    fisher_vector,
    fisher_vectors,
)
from featpipe.errors import InputError
from featpipe.learn.deep_fisher import fisher_forward
from tests.fisher_data import sample_image_descriptors
from tests.unit.test_fisher import literal_fisher_vector


@pytest.fixture(scope="module")
def real_sift():
    """Real dense SIFT (OpenCV grid) of the two sample photographs, PCA-32, a GMM (K = 16)."""
    images = sample_image_descriptors(step=8, bin_size=6)
    stacked = np.concatenate([d for d, _, _ in images]).astype(np.float64)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked[::4] - mean, full_matrices=False)[2][:32]
    projected = [((d - mean) @ components.T).astype(np.float32) for d, _, _ in images]
    gmm = GaussianMixtureModel(16, max_iter=20, random_state=0).fit(
        np.concatenate(projected)[::3])
    return projected, gmm


def _degenerate(gmm, x, near: bool):
    """The GMM with component 0 replaced by one at the variance floor that captures no
    descriptor: far from the data (``near=False``) or next to one descriptor, so that a few
    pairs get posteriors just above the 1e-6 cut-off (d_tk of order 1e2..1e3)."""
    weights, means, variances = (a.copy() for a in (gmm.weights_, gmm.means_,
                                                    gmm.variances_))
    floor = gmm.variance_floor_
    variances[0] = floor
    spread = x.std(axis=0)
    means[0] = x[7] + (0.05 if near else 6.0) * spread
    weights[0] = 0.02
    return weights / weights.sum(), means, variances


@pytest.mark.parametrize("near", [False, True])
def test_degenerate_floored_component_within_1e5_of_float64(real_sift, near):
    projected, gmm = real_sift
    for x in projected:
        weights, means, variances = _degenerate(gmm, x.astype(np.float64), near)
        # float64 GMM arrays, and float32 ones (another GMM: its own float64 reference)
        for gmm_arrays in ((weights, means, variances),
                           tuple(a.astype(np.float32) for a in (weights, means, variances))):
            ref = literal_fisher_vector(x.astype(np.float64),
                                        *(a.astype(np.float64) for a in gmm_arrays))
            ours = fisher_vector(x, *gmm_arrays)
            assert np.abs(ours - ref).max() <= 1e-5, np.abs(ours - ref).max()
        # the array-API body in float32 (numpy, torch): float64 moments where float32 cancels
        ref = literal_fisher_vector(x.astype(np.float64), weights, means, variances)
        theta = (np.log(weights), means, 0.5 * np.log(variances))
        for wrap in (np.asarray, torch.asarray):
            phi, cache = fisher_vectors(wrap(x[None]), *(wrap(p.astype(np.float32))
                                                         for p in theta))
            assert phi.dtype == cache.sdd.dtype == wrap(x).dtype
            assert np.abs(np.asarray(phi[0]) - ref).max() <= 1e-5
        raw = fisher_vector(x, weights, means, variances, improved=False)
        raw_ref = literal_fisher_vector(x.astype(np.float64), weights, means, variances,
                                        improved=False)
        np.testing.assert_allclose(raw, raw_ref, rtol=1e-6, atol=1e-9 * np.abs(raw_ref).max())


def test_real_fisher_vectors_within_1e5_of_float64(real_sift):
    projected, gmm = real_sift
    for x in projected:
        ref = literal_fisher_vector(x.astype(np.float64), gmm.weights_, gmm.means_,
                                    gmm.variances_)
        ours = fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
        assert np.abs(ours - ref).max() <= 1e-5
        phi, _ = fisher_forward(x.astype(np.float64), np.log(gmm.weights_), gmm.means_,
                                0.5 * np.log(gmm.variances_))
        assert np.abs(phi - ref).max() <= 1e-9


def _perturbed_gemm(scale, seed):
    """The GEMM part of the distances with another kernel's rounding: each value moved by up
    to ``scale`` of the rounding bound the encoder assumes (|Δm| <= g (4 m + 5 bias))."""
    rng = np.random.default_rng(seed)
    exact = posterior.mahalanobis_gemm

    def gemm(lhs, rhs, out=None):  # the perturbed values in a fresh array (out unused)
        raw = exact(lhs, rhs)
        dim = lhs.shape[-1] // 2
        g = (2 * dim + 8) * 2.0**-24
        bias = np.sum(rhs[dim:] ** 2 / (4.0 * rhs[:dim]), axis=0)  # ‖mc/σ‖² from 1/σ², −2mc/σ²
        bound = g * (4.0 * np.maximum(raw + bias, 0.0) + 5.0 * bias)
        return (raw + scale * bound * rng.uniform(-1.0, 1.0, raw.shape)).astype(np.float32)

    return gemm


def test_independent_of_gemm_rounding_chunking_and_threads(real_sift, monkeypatch):
    projected, gmm = real_sift
    args = (gmm.weights_, gmm.means_, gmm.variances_)
    x = projected[0]
    whole = fisher_vector(x, *args)
    ref = literal_fisher_vector(x.astype(np.float64), *args)
    assert np.abs(whole - ref).max() <= 1e-5
    # the GEMM kernel: any rounding within the bound gives the same FV
    for seed in range(3):
        monkeypatch.setattr(fisher, "mahalanobis_gemm", _perturbed_gemm(0.999, seed))
        np.testing.assert_allclose(fisher_vector(x, *args), whole, rtol=0, atol=1e-7)
    monkeypatch.undo()
    # chunking: frames of 1, 37, 500 descriptors, blocks of 7, and one block per thread
    for size in (1, 37, 500):
        acc = FisherAccumulator(*args)
        for start in range(0, len(x), size):
            acc.add(x[start:start + size])
        np.testing.assert_allclose(acc.result(), whole, rtol=0, atol=1e-7)
    monkeypatch.setattr(fisher, "_BLOCK", 7)
    monkeypatch.setattr(fisher, "_TASK", 50)
    blocks = fisher_vector(x, *args)
    np.testing.assert_allclose(blocks, whole, rtol=0, atol=1e-7)
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("FEATPIPE_THREADS", threads)
        np.testing.assert_array_equal(fisher_vector(x, *args), blocks)


def test_gmm_prepared_for_the_encoder_follows_the_values_not_the_objects(real_sift):
    """The encoder reuses the last GMM it prepared while the same values come back: arrays
    changed in place, or another posterior cut-off, are prepared anew."""
    projected, gmm = real_sift
    weights, means, variances = (np.array(a) for a in (gmm.weights_, gmm.means_,
                                                       gmm.variances_))
    x = projected[0][:500]
    before = fisher_vector(x, weights, means, variances)
    means[3] += 0.5
    variances[5] *= 2.0
    after = fisher_vector(x, weights, means, variances)
    ref = literal_fisher_vector(x.astype(np.float64), weights, means, variances)
    assert np.abs(after - ref).max() <= 1e-5 < np.abs(after - before).max()
    cut = fisher_vector(x, weights, means, variances, posterior_threshold=0.3)
    ref = literal_fisher_vector(x.astype(np.float64), weights, means, variances, threshold=0.3)
    assert np.abs(cut - ref).max() <= 1e-5 < np.abs(cut - after).max()


def test_far_descriptors_make_every_pair_exact(real_sift):
    """A descriptor whose float32 distances overflow (1e25) or lose every digit (1e12) is
    resolved in float64 for all its pairs."""
    projected, gmm = real_sift
    args = (gmm.weights_, gmm.means_, gmm.variances_)
    x = np.concatenate([projected[1][:40], np.full((1, 32), 1e12), np.full((1, 32), -1e25)])
    acc = FisherAccumulator(*args).add(x)
    assert acc.exact_pairs >= 2 * 16
    ref = literal_fisher_vector(x.astype(np.float64), *args)
    assert np.abs(acc.result() - ref).max() <= 1e-5


def test_posterior_routine_on_numpy_torch_and_array_api_strict():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 5)) * 2.0
    means = rng.standard_normal((4, 5))
    variances = rng.uniform(0.1, 2.0, (4, 5))
    weights = np.array([0.5, 0.3, 0.2, 0.0])
    log_pi = np.where(weights > 0, np.log(np.maximum(weights, 1e-300)), -np.inf)
    norm = posterior.log_normaliser(log_pi, np.log(variances).sum(axis=1), dim=5)
    # reference: the density of each Gaussian, one pair at a time
    ref = np.array([[np.log(w) - 0.5 * np.sum(np.log(2 * np.pi * v) + (t - m) ** 2 / v)
                     if w > 0 else -np.inf for w, m, v in zip(weights, means, variances,
                                                              strict=True)] for t in x])
    for wrap in (np.asarray, torch.asarray, array_api_strict.asarray):
        lj = posterior.log_joint(wrap(x), wrap(norm), wrap(means), wrap(1.0 / variances))
        np.testing.assert_allclose(np.asarray(lj), ref, rtol=1e-12, atol=1e-12)
        gamma, evidence = posterior.normalise(lj)
        np.testing.assert_allclose(np.asarray(evidence), scipy.special.logsumexp(ref, axis=1),
                                   rtol=1e-12)
        np.testing.assert_allclose(np.asarray(gamma), scipy.special.softmax(ref, axis=1),
                                   atol=1e-14)
        floored = posterior.floor_variances(wrap(variances), 0.5)
        np.testing.assert_array_equal(np.asarray(floored), np.maximum(variances, 0.5))
    # a row of -inf: posteriors 0 and evidence -inf, never NaN
    gamma, evidence = posterior.normalise(np.full((1, 3), -np.inf))
    assert not np.any(gamma) and evidence[0] == -np.inf


def test_em_uses_the_posterior_routine_like_scipy(real_sift):
    projected, gmm = real_sift
    x = projected[0].astype(np.float64)
    per_pair = np.stack([np.log(w) - 0.5 * np.sum(np.log(2 * np.pi * v) + (x - m) ** 2 / v,
                                                  axis=1)
                         for w, m, v in zip(gmm.weights_, gmm.means_, gmm.variances_,
                                            strict=True)], axis=1)
    assert gmm.score(x) == pytest.approx(np.mean(scipy.special.logsumexp(per_pair, axis=1)),
                                         rel=1e-12)


#: the routine's own module and its compiled copy (fused with the FV sums, numba)
_OWNERS = {"encode/posterior.py", "encode/_fisher_loop.py"}
_GEMM_FORM = re.compile(r"concat(?:enate)?\(\s*\[\s*(\w+)\s*\*\s*\1\s*,\s*\1\s*\]|"
                        r"-\s*2(?:\.0)?\s*\*\s*\w+\s*\*\s*inv_var")


def test_one_posterior_routine_in_the_source_tree():
    """No second log-sum-exp over components and no second ‖x‖² − 2xμ + ‖μ‖² GEMM form: the
    definitions live in featpipe/encode/posterior.py (and its compiled copy); callers import
    them (a call of ``logsumexp(`` is a use, a ``def``/``exp(l − max)`` is an implementation)."""
    root = Path(featpipe.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in _OWNERS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"def\s+(logsumexp|log_sum_exp|posteriors|normalise)\b", code) or \
                    re.search(r"exp\([^)\n]*-\s*(top|\w*max\w*)\b", code) or \
                    _GEMM_FORM.search(code):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "a second posterior implementation:\n" + "\n".join(found)
    text = (root / "encode/posterior.py").read_text()
    assert len(re.findall(r"xp\.exp\(", text)) == 1  # the one exponential of the routine


def test_em_e_step_equals_the_dense_float64_e_step(real_sift):
    """The E-step (the encoder's pass, posteriors below 1e-10 left out of the sums) against
    dense float64 posteriors of every pair (scipy's softmax and logsumexp)."""
    projected, gmm = real_sift
    x = projected[1].astype(np.float64) - gmm.center_
    means = gmm.means_ - gmm.center_
    (s0, s1, s2), loglik = gmm._e_step(x, gmm.weights_, means, gmm.variances_)
    per_pair = np.stack([np.log(w) - 0.5 * np.sum(np.log(2 * np.pi * v) + (x - m) ** 2 / v,
                                                  axis=1)
                         for w, m, v in zip(gmm.weights_, means, gmm.variances_,
                                            strict=True)], axis=1)
    gamma = scipy.special.softmax(per_pair, axis=1)
    assert loglik == pytest.approx(np.mean(scipy.special.logsumexp(per_pair, axis=1)),
                                   rel=1e-12)
    np.testing.assert_allclose(s0, gamma.sum(axis=0), rtol=1e-8, atol=1e-6)
    np.testing.assert_allclose(s1, gamma.T @ x, rtol=1e-8, atol=1e-6)
    np.testing.assert_allclose(s2, gamma.T @ (x * x), rtol=1e-8, atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_finite_descriptor_is_a_one_line_error_in_any_task(real_sift, monkeypatch, bad,
                                                               dtype):
    """The encoder checks finiteness in its compiled operand pass: a NaN or Inf in any task
    (here the last of several, on two threads) is refused with the input check's message,
    and the accumulator keeps nothing of that part."""
    projected, gmm = real_sift
    args = (gmm.weights_, gmm.means_, gmm.variances_)
    monkeypatch.setattr(fisher, "_TASK", 50)
    monkeypatch.setenv("FEATPIPE_THREADS", "2")
    x = projected[0][:300].astype(dtype)
    x[-1, 5] = bad
    acc = FisherAccumulator(*args)
    with pytest.raises(InputError, match="^descriptors: contains NaN or Inf$"):
        acc.add(x)
    assert acc.count == 0 and not np.any(acc.mass) and not np.any(acc.first)
    np.testing.assert_array_equal(acc.add(x[:-1]).result(),
                                  fisher_vector(x[:-1], *args))


@pytest.mark.parametrize("improved", [True, False])
def test_the_parts_of_a_batch_each_get_the_fv_of_their_descriptors_alone(real_sift,
                                                                        monkeypatch, improved):
    """Per-frame FVs encode a batch of frames together (one operand pass, one compiled pass
    for every frame's sums, one for their FVs; buffers kept between calls): each frame's FV
    is, to the bit, fisher_vector of its descriptors alone, whatever the frames beside it
    (empty, one row, several GEMM blocks, longer than a task), the column it is written at,
    and what the kept buffers held from the call before."""
    projected, gmm = real_sift
    args = (gmm.weights_, gmm.means_, gmm.variances_)
    monkeypatch.setattr(fisher, "_BLOCK", 16)
    monkeypatch.setattr(fisher, "_TASK", 60)
    x = projected[0][:400]
    for sizes in ([0, 1, 37, 0, 50, 9], [70, 3, 0, 130, 2], [200]):
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        width = 2 * gmm.means_.size
        out = np.full((len(sizes), width + 5), 7.0, np.float32)  # written from column 3
        for _ in range(2):  # the second call on the buffers the first left
            fisher.fisher_vectors_of_parts(x[:offsets[-1]], offsets, *args, improved,
                                           out=out, column=3)
            for p, n in enumerate(sizes):
                alone = fisher_vector(x[offsets[p]:offsets[p + 1]], *args, improved)
                np.testing.assert_array_equal(out[p, 3:3 + width], alone)
                assert n or not np.any(alone)
            assert np.all(out[:, :3] == 7.0) and np.all(out[:, 3 + width:] == 7.0)
        reference = literal_fisher_vector(x[:sizes[0]].astype(np.float64), *args,
                                          improved=improved) if sizes[0] else None
        if reference is not None:
            assert np.abs(out[0, 3:3 + width] - reference).max() <= 1e-5


def test_a_bad_frame_of_a_batch_is_refused_with_the_encoders_message(real_sift):
    projected, gmm = real_sift
    args = (gmm.weights_, gmm.means_, gmm.variances_)
    x = projected[0][:60].astype(np.float64)
    offsets = [0, 20, 40, 60]
    for bad, message in ((np.nan, "^descriptors: contains NaN or Inf$"),
                         (1e200, "^descriptors too large to encode: largest \\|value\\| 1e"
                                 "\\+200 overflows float64")):
        y = x.copy()
        y[45, 3] = bad
        with pytest.raises(InputError, match=message):
            fisher.fisher_vectors_of_parts(y, offsets, *args)
    # the buffers of the refused call are not reused half-written
    good = fisher.fisher_vectors_of_parts(x, offsets, *args)
    np.testing.assert_array_equal(good[1], fisher_vector(x[20:40], *args))


def test_compiled_normalisation_equals_the_array_api_body(real_sift):
    """fisher_rows (the CPU encoder's normalisation) against fisher_from_sums (the FV body of
    deep Fisher learning), a component below the prior cut-off and one that took nothing."""
    projected, gmm = real_sift
    weights = gmm.weights_.copy()
    weights[2] = 1e-7
    weights /= weights.sum()
    acc = FisherAccumulator(weights, gmm.means_, gmm.variances_).add(projected[1][:300])
    acc.mass[5] = 0.0
    acc.first[5] = 0.0
    acc.second[5] = 0.0
    for improved in (True, False):
        acc.improved = improved
        expected, _ = fisher.fisher_from_sums(acc.first[None], acc.second[None],
                                              acc.mass[None, :, None],
                                              np.asarray([acc.count]), weights,
                                              weights >= fisher.PRIOR_THRESHOLD, improved)
        got = acc.result()
        np.testing.assert_allclose(got, expected[0], rtol=1e-6, atol=1e-9)
        assert not np.any(got.reshape(2, 16, -1)[:, [2, 5]])
