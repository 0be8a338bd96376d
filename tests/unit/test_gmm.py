"""GMM by EM (featpipe.encode.fisher.GaussianMixtureModel) and `featpipe fit gmm`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture

from featpipe.encode.fisher import GaussianMixtureModel, fisher_vector
from featpipe.errors import InputError
from featpipe.manifest import Manifest, ManifestItem
from featpipe.store import Store
from tests.fisher_data import digits_descriptors, single_thread_blas
from tests.unit.test_fisher import literal_fisher_vector


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with single_thread_blas():
        yield



@pytest.fixture(scope="module")
def sift_sample():
    descs, _ = digits_descriptors(per_class=8)
    x = np.concatenate(descs).astype(np.float64)
    x -= x.mean(axis=0)
    components = np.linalg.svd(x, full_matrices=False)[2][:16]
    return x @ components.T  # PCA-16 of real dense SIFT


def test_em_log_likelihood_is_monotone_on_real_sift(sift_sample):
    gmm = GaussianMixtureModel(8, random_state=0).fit(sift_sample)
    ll = gmm.log_likelihoods_
    assert gmm.n_restarts_ == 0 and len(ll) > 3
    assert np.all(np.diff(ll) >= -1e-10 * np.abs(ll[1:])), np.diff(ll).min()
    assert ll[-1] > ll[0]
    assert np.isclose(gmm.score(sift_sample), ll[-1], rtol=1e-9)
    assert np.isclose(gmm.weights_.sum(), 1.0)
    assert np.all(gmm.variances_ >= gmm.variance_floor_)
    assert gmm.converged_ or gmm.n_iter_ == 100


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_one_em_iteration_matches_scikit_learn(sift_sample):
    x = sift_sample
    rng = np.random.default_rng(0)
    k = 5
    init = {"weights": np.full(k, 1.0 / k), "means": x[rng.choice(len(x), k, replace=False)],
            "variances": np.tile(x.var(axis=0), (k, 1))}
    ours = GaussianMixtureModel(k, max_iter=1, variance_floor=0.0).fit(x, init_params=init)
    ref = GaussianMixture(k, covariance_type="diag", max_iter=1, reg_covar=0.0,
                          weights_init=init["weights"], means_init=init["means"],
                          precisions_init=1.0 / init["variances"]).fit(x)
    np.testing.assert_allclose(ours.weights_, ref.weights_, rtol=1e-9)
    np.testing.assert_allclose(ours.means_, ref.means_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(ours.variances_, ref.covariances_, rtol=1e-8, atol=1e-12)


def test_variance_floor_is_max_data_variance_times_1e4():
    rng = np.random.default_rng(0)
    x = np.c_[rng.normal(size=500) * 10.0, rng.normal(size=500) * 1e-5]
    gmm = GaussianMixtureModel(3, random_state=0).fit(x)
    floor = 1e-4 * x.var(axis=0).max()
    assert gmm.variance_floor_ == pytest.approx(floor, rel=1e-9)
    np.testing.assert_allclose(gmm.variances_[:, 1], floor, rtol=1e-9)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_constant_and_duplicate_descriptors_give_no_nan(dtype):
    constant = np.ones((200, 6)) * 3.0
    gmm = GaussianMixtureModel(4, dtype=dtype, random_state=0).fit(constant)
    for array in (gmm.weights_, gmm.means_, gmm.variances_, gmm.log_likelihoods_):
        assert np.all(np.isfinite(array))
    np.testing.assert_allclose(gmm.means_, 3.0, rtol=1e-6)
    fv = fisher_vector(constant, gmm.weights_, gmm.means_, gmm.variances_)
    np.testing.assert_allclose(fv, literal_fisher_vector(
        constant, gmm.weights_, gmm.means_, gmm.variances_), atol=1e-6)
    rng = np.random.default_rng(1)
    duplicates = np.repeat(rng.normal(size=(5, 6)), 40, axis=0)  # 5 distinct points, K = 8
    gmm = GaussianMixtureModel(8, dtype=dtype, random_state=0).fit(duplicates)
    assert np.all(np.isfinite(gmm.means_)) and np.all(gmm.variances_ > 0)
    assert np.isclose(gmm.weights_.sum(), 1.0)


def test_component_that_loses_all_points_is_restarted(sift_sample):
    x = sift_sample
    k = 4
    means = x[[0, 100, 200, 300]].copy()
    means[3] = 1e6  # far from every descriptor: it gets no mass
    init = {"weights": np.full(k, 0.25), "means": means,
            "variances": np.tile(x.var(axis=0), (k, 1))}
    gmm = GaussianMixtureModel(k, max_iter=30).fit(x, init_params=init)
    assert gmm.n_restarts_ >= 1
    assert np.all(gmm.weights_ > 1e-3)
    assert np.all(np.abs(gmm.means_) < 1e3)
    assert np.all(np.isfinite(gmm.log_likelihoods_))


@pytest.mark.parametrize("bad, message", [
    (np.zeros(10), "2-D"),
    (np.zeros((3, 2)), "at least n_components"),
    (np.full((20, 2), np.nan), "NaN"),
])
def test_bad_input_is_refused_with_a_clear_error(bad, message):
    with pytest.raises(InputError, match=message):
        GaussianMixtureModel(4).fit(bad)


def _descriptor_stage(store_dir, n_items=6, seed=0):
    rng = np.random.default_rng(seed)
    items = [ManifestItem(f"img{i}", "", ("a" if i % 2 else "b",),
                          ("train" if i < 4 else "test",)) for i in range(n_items)]
    store = Store(store_dir)
    stage = store.stage("import", {"test": seed}, items=Manifest(items, root=store_dir))
    arrays = {}
    for item in items:
        arrays[item.id] = rng.normal(size=(60, 10)).astype(np.float32) + (item.label == "a")
        stage.write_item(item.id, arrays[item.id])
    store.set_name("desc", stage)
    return store, arrays


def test_fit_gmm_command_and_fisher_encoding(store_dir, cli):
    store, arrays = _descriptor_stage(store_dir)
    result = cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
                 "--components", 3, "--sample", 200, "--seed", 1)
    assert result.exit_code == 0, result.output
    assert "summary: K=3 D=10 on 200 descriptors from 4 items" in result.output
    model_stage = store.resolve("g")
    model, meta = model_stage.load_model("gmm")
    assert model["means"].shape == (3, 10) and meta["n_descriptors"] == 200
    again = cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
                "--components", 3, "--sample", 200, "--seed", 1)
    assert "already fitted" in again.output
    result = cli("encode", "--store", store_dir, "--input", "desc", "--method", "fisher",
                 "--gmm", "g", "--name", "fv")
    assert result.exit_code == 0, result.output
    encoded = store.resolve("fv")
    for item_id, array in arrays.items():
        expected = fisher_vector(array, model["weights"], model["means"], model["variances"])
        np.testing.assert_array_equal(encoded.read_item(item_id), expected)


def test_fit_gmm_with_pca_dim_projects_before_encoding(store_dir, cli):
    store, arrays = _descriptor_stage(store_dir, seed=3)
    result = cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
                 "--components", 2, "--pca-dim", 4)
    assert result.exit_code == 0, result.output
    model, _ = store.resolve("g").load_model("gmm")
    pca, _ = store.resolve("g").load_model("pca")  # the projection fitted with the GMM
    assert pca["components"].shape == (4, 10) and model["means"].shape == (2, 4)
    result = cli("encode", "--store", store_dir, "--input", "desc", "--method", "fisher",
                 "--gmm", "g", "--no-improved", "--name", "fv")
    assert result.exit_code == 0, result.output
    x = arrays["img0"]
    projected = (x - pca["mean"]) @ pca["components"].T
    expected = fisher_vector(projected, model["weights"], model["means"], model["variances"],
                             improved=False)
    np.testing.assert_allclose(store.resolve("fv").read_item("img0"), expected, rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("whiten", [False, True])
def test_fit_gmm_on_a_fit_pca_stage_uses_its_projection(store_dir, cli, whiten):
    from featpipe.extract.pca import load_pca

    store, arrays = _descriptor_stage(store_dir, seed=4)
    result = cli("fit", "pca", "--store", store_dir, "--input", "desc", "--name", "p",
                 "--dim", 4, *(["--whiten"] if whiten else []))
    assert result.exit_code == 0, result.output
    result = cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
                 "--components", 2, "--pca", "p")
    assert result.exit_code == 0, result.output
    result = cli("encode", "--store", store_dir, "--input", "desc", "--method", "fisher",
                 "--gmm", "g", "--no-improved", "--name", "fv")
    assert result.exit_code == 0, result.output
    model, _ = store.resolve("g").load_model("gmm")
    projected = load_pca(store.resolve("p")).transform(arrays["img0"])
    expected = fisher_vector(projected, model["weights"], model["means"], model["variances"],
                             improved=False)
    np.testing.assert_allclose(store.resolve("fv").read_item("img0"), expected, rtol=1e-4,
                               atol=1e-6)


def test_fit_gmm_errors_are_one_line(store_dir, cli):
    _descriptor_stage(store_dir)
    result = cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
                 "--components", 500, "--sample", 100)
    assert result.exit_code == 1
    assert "need at least n_components=500 descriptors" in result.output
    result = cli("fit", "gmm", "--store", store_dir, "--input", "nope", "--name", "g")
    assert result.exit_code == 1 and "no stage named 'nope'" in result.output


def test_encode_names_the_item_with_wrong_descriptors(store_dir, cli):
    store, _ = _descriptor_stage(store_dir)
    assert cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
               "--components", 2, "--sample", 100).exit_code == 0
    items = [ManifestItem("good", "", ("a",), ("train",)), ManifestItem("bad", "", ("a",),
                                                                        ("train",))]
    stage = store.stage("import", {"bad": 1}, items=Manifest(items, root=store_dir))
    stage.write_item("good", np.zeros((5, 10), np.float32))
    stage.write_item("bad", np.zeros((5, 7), np.float32))
    store.set_name("mixed", stage)
    result = cli("encode", "--store", store_dir, "--input", "mixed", "--method", "fisher",
                 "--gmm", "g", "--name", "fv", "--on-error", "skip")
    assert result.exit_code == 1
    assert "bad" in result.output and "expected (N, 10)" in result.output
    assert "name fv points to stage encode-" in result.output  # skip: named, 1 failed
    stage = store.resolve(re.search(r"stage (encode-\w+)", result.output).group(1))
    assert stage.done_ids() == {"good"}


def test_encode_per_frame_and_pyramid_from_sidecars(store_dir, cli):
    store, _ = _descriptor_stage(store_dir)
    assert cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
               "--components", 2, "--sample", 100).exit_code == 0
    model, _ = store.resolve("g").load_model("gmm")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 10)).astype(np.float32)
    frames = np.repeat(np.arange(4), 10)
    positions = np.c_[rng.uniform(0, 64, 40), rng.uniform(0, 48, 40), np.full(40, 4.0)]
    stage = store.stage("import", {"frames": 1}, items=Manifest(
        [ManifestItem("v", "", ("a",), ("train",))], root=store_dir))
    stage.write_item("v", x, extras={"frame_index": frames, "positions": positions,
                                     "image_size": np.array([48, 64])})
    store.set_name("video", stage)
    result = cli("encode", "--store", store_dir, "--input", "video", "--method", "fisher",
                 "--gmm", "g", "--per-frame", "--name", "frames")
    assert result.exit_code == 0, result.output
    per_frame = store.resolve("frames").read_item("v")
    assert per_frame.shape == (4, 2 * 2 * 10)
    np.testing.assert_array_equal(per_frame[1], fisher_vector(
        x[10:20], model["weights"], model["means"], model["variances"]))
    result = cli("encode", "--store", store_dir, "--input", "video", "--method", "fisher",
                 "--gmm", "g", "--pyramid", "1x1+2x2+3x1", "--name", "spm")
    assert result.exit_code == 0, result.output
    spm = store.resolve("spm").read_item("v")
    assert spm.shape == (8 * 40,)
    bottom_band = positions[:, 1] >= 32  # last of the three 3x1 bands: y in [32, 48)
    np.testing.assert_array_equal(spm[7 * 40:], fisher_vector(
        x[bottom_band], model["weights"], model["means"], model["variances"]))


def test_per_frame_fisher_vectors_can_be_rank_pooled(store_dir, cli):
    store = Store(store_dir)
    items = [ManifestItem(f"v{i}", "", ("a" if i % 2 else "b",), ("train",)) for i in range(4)]
    stage = store.stage("import", {"traj": 1}, items=Manifest(items, root=store_dir))
    rng = np.random.default_rng(0)
    for item in items:
        stage.write_item(item.id, rng.normal(size=(60, 6)).astype(np.float32),
                         extras={"frame_index": np.repeat(np.arange(6), 10)})
    store.set_name("traj", stage)
    for args in (("fit", "gmm", "--input", "traj", "--name", "g", "--components", 2),
                 ("encode", "--input", "traj", "--method", "fisher", "--gmm", "g",
                  "--per-frame", "--name", "fvf"),
                 ("encode", "--input", "fvf", "--method", "rankpool", "--name", "rp")):
        result = cli(*args, "--store", store_dir)
        assert result.exit_code == 0, result.output
    assert store.resolve("fvf").read_item("v0").shape == (6, 24)
    assert store.resolve("rp").read_item("v0").shape[0] % 24 == 0
