"""Deep Fisher kernel: reverse-mode gradient vs finite differences, the learning loop on
numpy / torch / array_api_strict, the SVM's C mapping, real digits, `fit deep-gmm`."""

from __future__ import annotations

import array_api_compat.torch as torch_xp
import array_api_strict
import numpy as np
import pytest
from scipy.optimize import minimize

from featpipe.encode.fisher import FisherItemEncoder, GaussianMixtureModel, fisher_vector
from featpipe.errors import InputError
from featpipe.learn.deep_fisher import (
    DeepFisherKernel,
    fisher_backward,
    fisher_forward,
    svm_objective,
    train_squared_hinge,
)
from featpipe.manifest import Manifest, ManifestItem
from featpipe.store import Store
from tests.fisher_data import digits_descriptors, single_thread_blas


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with single_thread_blas():
        yield


@pytest.fixture(scope="module")
def digits():
    """Dense SIFT of real digits 3/5/8, PCA to 12 dims, and a K=4 GMM on them."""
    descs, labels = digits_descriptors(per_class=24)
    stacked = np.concatenate(descs).astype(np.float64)
    mean = stacked.mean(axis=0)
    components = np.linalg.svd(stacked - mean, full_matrices=False)[2][:12]
    projected = [(d - mean) @ components.T for d in descs]
    gmm = GaussianMixtureModel(4, random_state=0).fit(np.concatenate(projected))
    return projected, labels, gmm


def _theta(gmm):
    return (np.log(gmm.weights_), gmm.means_.copy(), 0.5 * np.log(gmm.variances_))


def test_forward_equals_the_fisher_encoder(digits):
    projected, _, gmm = digits
    for x in projected[:5]:
        phi, _ = fisher_forward(x, *_theta(gmm))
        ref = fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
        np.testing.assert_allclose(phi, ref, atol=2e-6)


def _finite_differences(x, theta, g_phi, threshold, h=1e-6):
    def value(params):
        return float(fisher_forward(x, *params, threshold=threshold)[0] @ g_phi)

    grads = []
    for block in range(3):
        grad = np.zeros_like(theta[block])
        for index in np.ndindex(theta[block].shape):
            plus = [p.copy() for p in theta]
            minus = [p.copy() for p in theta]
            plus[block][index] += h
            minus[block][index] -= h
            grad[index] = (value(plus) - value(minus)) / (2 * h)
        grads.append(grad)
    return grads


@pytest.mark.parametrize("cutoff, threshold, rtol", [
    (0.0, 1e-6, 1e-6),   # exact gradient of the VLFeat-skipping FV
    (0.0, 0.0, 1e-6),    # exact gradient of the FV without skipping
    (1e-5, 1e-6, 2e-3),  # the paper's cut-off: pairs below 1e-5 left out of the posterior term
])
def test_gradient_equals_central_finite_differences(digits, cutoff, threshold, rtol):
    projected, _, gmm = digits
    x = projected[0][:, :5]
    rng = np.random.default_rng(0)
    k = 4
    theta = (rng.normal(size=k) * 0.3,
             x[rng.choice(len(x), k, replace=False)] + 0.1 * rng.normal(size=(k, 5)),
             np.log(0.5 * x.std(axis=0)) + 0.1 * rng.normal(size=(k, 5)))
    phi, cache = fisher_forward(x, *theta, threshold=threshold)
    gamma = cache.gamma
    # pairs below both thresholds exist, so the skipping and the cut-off both matter here
    assert np.any((gamma > 0) & (gamma < 1e-6)) and np.any((gamma >= 1e-6) & (gamma < 1e-5))
    g_phi = rng.normal(size=phi.shape)
    grads = fisher_backward(cache, g_phi, posterior_cutoff=cutoff)
    reference = _finite_differences(x, theta, g_phi, threshold)
    for name, ours, ref in zip(("log pi", "mu", "log sigma"), grads, reference, strict=True):
        error = np.abs(ours - ref).max() / np.abs(ref).max()
        assert error <= rtol, f"{name}: relative error {error:.2e}"
    if cutoff:
        exact = fisher_backward(cache, g_phi, posterior_cutoff=0.0)
        assert any(not np.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(grads, exact,
                                                                            strict=True))


def test_empty_item_gives_zero_fv_and_zero_gradient(digits):
    _, _, gmm = digits
    phi, cache = fisher_forward(np.zeros((0, 12)), *_theta(gmm))
    assert not np.any(phi)
    grads = fisher_backward(cache, np.ones_like(phi))
    assert all(np.all(np.isfinite(g)) and not np.any(g) for g in grads)


def test_squared_hinge_svm_and_its_C_mapping(digits):
    projected, labels, gmm = digits
    phi = np.stack([fisher_vector(x, gmm.weights_, gmm.means_, gmm.variances_)
                    for x in projected]).astype(np.float64)
    y = np.where(labels == 3, 1.0, -1.0)
    C = 10.0
    w = train_squared_hinge(phi, y, C, tol=1e-8)

    def objective(v):  # liblinear's (and libsvm's) C: the weight of the summed loss
        margins = np.maximum(0.0, 1.0 - y * (phi @ v))
        grad = v - 2 * C * phi.T @ (margins * y)
        return 0.5 * v @ v + C * margins @ margins, grad

    ref = minimize(objective, np.zeros(phi.shape[1]), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000}).x
    assert svm_objective(w, phi, y[:, None], C) == pytest.approx(objective(ref)[0], rel=1e-7)
    np.testing.assert_allclose(w, ref, atol=1e-4 * np.abs(ref).max())



def test_both_helps_say_how_the_two_Cs_relate(cli):
    """Issue 24: --C of fit deep-gmm is classify's C (the weight of the summed loss; the test
    above checks it against that objective), and each help says so."""
    deep = " ".join(cli("fit", "deep-gmm", "--help").output.split())
    classify = " ".join(cli("classify", "--help").output.split())
    assert "the meaning of classify --C (libsvm's C, hinge loss)" in deep
    assert "its C is n times this one" in deep
    assert "`fit deep-gmm --C` means the same, with the squared hinge" in classify


def _split(labels):
    idx = np.arange(len(labels))
    return idx[idx % 3 == 0], idx[idx % 3 == 1], idx[idx % 3 == 2]


def _fit(digits, **kwargs):
    projected, labels, gmm = digits
    train, val, _ = _split(labels)
    options = {"C": 0.5, "max_iter": 4, "patience": 10, **kwargs}
    return DeepFisherKernel(**options).fit(
        [projected[i] for i in train], labels[train], [projected[i] for i in val], labels[val],
        (gmm.weights_, gmm.means_, gmm.variances_))


def test_same_learning_path_on_numpy_torch_and_array_api_strict(digits):
    runs = {name: _fit(digits, max_iter=2, xp=xp) for name, xp in
            (("numpy", None), ("strict", array_api_strict), ("torch", torch_xp))}
    reference = runs["numpy"].history_[0]
    assert len(reference) == 3
    for name in ("strict", "torch"):
        history = runs[name].history_[0]
        assert len(history) == len(reference)
        for ours, ref in zip(history, reference, strict=True):
            assert ours["objective"] == pytest.approx(ref["objective"], rel=1e-10), name
            assert ours["step"] == pytest.approx(ref["step"], rel=1e-10), name
        np.testing.assert_allclose(runs[name].means_, runs["numpy"].means_, rtol=1e-10)


def test_training_lowers_the_objective_and_keeps_the_best_validation(digits):
    projected, labels, _ = digits
    model = _fit(digits, max_iter=6, selection="validation")
    history = model.history_[0]
    objectives = [h["objective"] for h in history]
    assert len(objectives) >= 3
    assert all(b < a for a, b in zip(objectives, objectives[1:], strict=False))
    best = max(h["validation"] for h in history)
    kept = [h for h in history if h["iteration"] == model.best_iteration_[0]][0]
    assert kept["validation"] == best >= history[0]["validation"]
    encoder = FisherItemEncoder(model.to_arrays()[0])
    train, _, test = _split(labels)
    phi = np.stack(encoder.encode_batch(projected, [{}] * len(projected))).astype(np.float64)
    scores = phi[test] @ model.svm_weights_.T
    accuracy = np.mean(model.classes_[np.argmax(scores, axis=1)] == labels[test])
    assert accuracy > 0.6  # three digit classes: chance is 1/3


def test_per_class_mode_learns_one_gmm_per_class(digits):
    projected, _, gmm = digits
    model = _fit(digits, mode="per-class", max_iter=1)
    assert model.means_.shape == (3, 4, 12) and model.weights_.shape == (3, 4)
    np.testing.assert_allclose(model.weights_.sum(axis=1), 1.0)
    assert len(model.history_) == 3
    out = FisherItemEncoder(model.to_arrays()[0]).encode_one(projected[0], {})
    assert out.shape == (3 * 2 * 4 * 12,)


def test_bad_parameters_are_refused(digits):
    projected, labels, gmm = digits
    init = (gmm.weights_, gmm.means_, gmm.variances_)
    with pytest.raises(InputError, match="mode"):
        DeepFisherKernel(mode="both").fit(projected[:2], labels[:2], projected[:2],
                                          labels[:2], init)
    with pytest.raises(InputError, match="2 classes"):
        DeepFisherKernel().fit(projected[:2], np.zeros(2), projected[:2], np.zeros(2), init)
    with pytest.raises(InputError, match="expected"):
        DeepFisherKernel().fit([x[:, :3] for x in projected[:4]], labels[:4], projected[:2],
                               labels[:2], init)


def _digits_with_a_gmm(store_dir, cli, digits, id_format):
    """The digits' descriptor sets as an import stage ``desc`` (every third item in test), and
    a 4-component GMM ``g`` fitted on them; returns the store and the stage."""
    projected, labels, _ = digits
    items = [ManifestItem(id_format.format(i), "", (str(lab),),
                          ("train" if i % 3 else "test",)) for i, lab in enumerate(labels)]
    store = Store(store_dir)
    stage = store.stage("import", {"digits": id_format}, items=Manifest(items, root=store_dir))
    for item, x in zip(items, projected, strict=True):
        stage.write_item(item.id, x)
    store.set_name("desc", stage)
    assert cli("fit", "gmm", "--store", store_dir, "--input", "desc", "--name", "g",
               "--components", 4).exit_code == 0
    return store, stage


def test_fit_deep_gmm_command(store_dir, cli, digits):
    store, stage = _digits_with_a_gmm(store_dir, cli, digits, "d{}")
    result = cli("fit", "deep-gmm", "--store", store_dir, "--input", "desc", "--gmm", "g",
                 "--name", "deep", "--C", 10, "--max-iter", 2)
    assert result.exit_code == 0, result.output
    assert "shared: objective" in result.output and "summary: 36 learn + 12 validation" \
        in result.output
    model, meta = store.resolve("deep").load_model("gmm")
    assert meta["classes"] == ["3", "5", "8"] and model["means"].shape == (4, 12)
    result = cli("encode", "--store", store_dir, "--input", "desc", "--method", "fisher",
                 "--gmm", "deep", "--name", "fv")
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(
        store.resolve("fv").read_item("d0"),
        fisher_vector(stage.read_item("d0"), model["weights"], model["means"],
                      model["variances"]))


def test_fit_deep_gmm_paper_protocol_on_real_digits(store_dir, cli, digits, tmp_path):
    """Per-class GMMs, a fixed number of iterations (the paper's rule), the per-class
    validation AP of each task's own SVM (Table 2a) checked against an independent
    recomputation (featpipe's FV encoder, scikit-learn's LinearSVC and AP), then the kernel
    transfer (Table 2b) from the command line: `encode --method fisher` with the learned GMMs
    and `classify --metric map` on the whole train split, checked against scikit-learn's SVC."""
    import json

    from sklearn.metrics import average_precision_score
    from sklearn.svm import SVC, LinearSVC

    from featpipe.learn.splits import stratified_split

    store, stage = _digits_with_a_gmm(store_dir, cli, digits, "d{:02d}")
    items = list(stage.items)
    C = 0.5
    result = cli("fit", "deep-gmm", "--store", store_dir, "--input", "desc", "--gmm", "g",
                 "--name", "deep", "--mode", "per-class", "--C", C, "--max-iter", 3,
                 "--subsample", 1, "--svm-tol", 1e-8)
    assert result.exit_code == 0, result.output
    model, meta = store.resolve("deep").load_model("gmm")
    ev = meta["evaluation"]
    assert ev["classes"] == ["3", "5", "8"] and model["means"].shape == (3, 4, 12)
    for task, history in enumerate(meta["history"]):  # fixed iterations, the last one kept
        assert [h["iteration"] for h in history] == [0, 1, 2, 3]
        assert meta["best_iteration"][task] == 3
        objectives = [h["objective"] for h in history]
        assert objectives == sorted(objectives, reverse=True)
    paper, ours = ev["paper"], ev["classify"]
    for cls in ev["classes"]:
        assert f"validation AP {cls}: {paper['base'][cls]:.4f} -> " \
            f"{paper['learned'][cls]:.4f} (paper's SVM), {ours['base'][cls]:.4f} -> " \
            f"{ours['learned'][cls]:.4f} (classify's SVM)" in result.output
    for svm, scores in (("the paper's SVM (squared hinge, no bias", paper),
                        ("classify's SVM (libsvm C-SVC with a bias", ours)):
        assert scores["learned_map"] == pytest.approx(np.mean(list(scores["learned"].values())))
        assert f"validation mAP, {svm}" in result.output
        assert f"C = 0.5): {scores['base_map']:.4f} -> {scores['learned_map']:.4f}" \
            in result.output

    # independent recomputation of Table 2a
    train_ids = [it.id for it in items if it.splits[0] == "train"]
    train_labels = [it.label for it in items if it.splits[0] == "train"]
    learn, val = stratified_split(train_labels, 0.25, 0)
    assert (meta["n_learn"], meta["n_val"]) == (len(learn), len(val))
    desc = {it.id: stage.read_item(it.id) for it in items}
    g, _ = store.resolve("g").load_model("gmm")
    for c, cls in enumerate(ev["classes"]):
        y_learn = np.array([train_labels[i] == cls for i in learn])
        y_val = np.array([train_labels[i] == cls for i in val])
        for which, gmm_arrays in (("learned", [model[k][c] for k in
                                               ("weights", "means", "variances")]),
                                  ("base", [g[k] for k in ("weights", "means", "variances")])):
            def fv(i, arrays=gmm_arrays):
                return fisher_vector(desc[train_ids[i]], *arrays).astype(np.float64)

            phi_learn = np.stack([fv(i) for i in learn])
            phi_val = np.stack([fv(i) for i in val])
            if which == "learned":
                w = model["svm_weights"][c]
            else:
                w = LinearSVC(C=C, loss="squared_hinge", fit_intercept=False, tol=1e-10,
                              max_iter=100_000).fit(phi_learn, y_learn).coef_[0]
            ap = average_precision_score(y_val, phi_val @ w)
            assert ap == pytest.approx(paper[which][cls], abs=1e-6), (which, cls)
            # what `classify` trains: a C-SVC with a bias on the linear kernel (scikit-learn's
            # SVC, an independent libsvm binding)
            svc = SVC(kernel="precomputed", C=C, tol=1e-8).fit(phi_learn @ phi_learn.T, y_learn)
            ap = average_precision_score(y_val, svc.decision_function(phi_val @ phi_learn.T))
            assert ap == pytest.approx(ours[which][cls], abs=1e-4), (which, cls)

    # Table 2b: the learned GMMs as an ordinary encoder, SVMs on the whole train split
    result = cli("encode", "--store", store_dir, "--input", "desc", "--method", "fisher",
                 "--gmm", "deep", "--name", "fv")
    assert result.exit_code == 0, result.output
    concat = np.concatenate([fisher_vector(desc["d00"], *[model[k][c] for k in
                                                          ("weights", "means", "variances")])
                             for c in range(3)])
    np.testing.assert_allclose(store.resolve("fv").read_item("d00"), concat, atol=1e-6)
    report = tmp_path / "transfer.json"
    result = cli("classify", "--store", store_dir, "--input", "fv", "--kernel", "linear",
                 "--normalize", "l2", "--C", 10, "--metric", "map", "--report", report)
    assert result.exit_code == 0, result.output
    fvs = {i: store.resolve("fv").read_item(i).astype(np.float64) for i in desc}
    X = {i: v / np.linalg.norm(v) for i, v in fvs.items()}
    test_ids = [it.id for it in items if it.splits[0] == "test"]
    test_labels = np.array([it.label for it in items if it.splits[0] == "test"])
    A, B = np.stack([X[i] for i in train_ids]), np.stack([X[i] for i in test_ids])
    aps = [average_precision_score(test_labels == cls, SVC(kernel="precomputed", C=10).fit(
        A @ A.T, np.array(train_labels) == cls).decision_function(B @ A.T))
        for cls in ev["classes"]]
    data = json.loads(report.read_text())
    assert data["summary"]["metric"] == "map"
    assert data["summary"]["mean"] == pytest.approx(np.mean(aps), abs=1e-4)
