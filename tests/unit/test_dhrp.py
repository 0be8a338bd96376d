"""Discriminative HRP: the argmin gradient (gradcheck, the paper's diagonal formula), training
on a real sequence set, persistence, and the fit/encode commands."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from featpipe.encode.svr import rank_svr_liblinear, rank_svr_objective  # noqa: E402
from featpipe.errors import InputError  # noqa: E402
from featpipe.learn.dhrp import DiscriminativeRankPooling  # noqa: E402
from featpipe.manifest import from_rows  # noqa: E402
from featpipe.nn.functional import (  # noqa: E402
    argmin_input_gradient,
    mapped_sequences,
    rank_pool,
    solve_rank_svr,
)
from featpipe.store import Store  # noqa: E402

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These small batched ops run far faster on one thread when the machine is busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def unit_rows(rng, B, T, D):
    V = torch.as_tensor(rng.standard_normal((B, T, D)), dtype=F64)
    return V / V.norm(dim=-1, keepdim=True)


def residual_margin(V, U, epsilon):
    """Active/inactive split and the distance of |t − uᵀv_t| from ε (finite differences must
    not cross it)."""
    T = V.shape[1]
    res = torch.arange(1, T + 1, dtype=V.dtype) - torch.einsum("btd,bd->bt", V, U)
    return (res.abs() > epsilon), (res.abs() - epsilon).abs().min().item()


# -- forward ----------------------------------------------------------------------------------

def test_forward_is_featpipes_solver_and_matches_liblinear():
    rng = np.random.default_rng(0)
    V = unit_rows(rng, 3, 12, 5)
    U = rank_pool(V, C=1.0, epsilon=0.1)
    ref = rank_svr_liblinear(V.numpy(), C=1.0, epsilon=0.1, tol=1e-10)
    ours, theirs = rank_svr_objective(V, U), rank_svr_objective(V, ref)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_allclose(U.numpy(), ref, atol=1e-4)


def test_padding_does_not_change_u():
    rng = np.random.default_rng(1)
    W = torch.eye(4, dtype=F64)
    long, short = rng.standard_normal((9, 4)), rng.standard_normal((5, 4))
    X = torch.zeros((2, 9, 4), dtype=F64)
    X[0], X[1, :5] = torch.as_tensor(long), torch.as_tensor(short)
    mask = torch.ones((2, 9), dtype=F64)
    mask[1, 5:] = 0
    V = mapped_sequences(X, mask, W, "ssr", 1e-3)
    alone = rank_pool(mapped_sequences(X[1:, :5], mask[1:, :5], W, "ssr", 1e-3))
    # zero rows alone leave u unchanged; with lengths they are no constraints at all
    for lengths in (None, [9, 5]):
        batched = rank_pool(V, lengths=lengths)
        np.testing.assert_allclose(batched[1].numpy(), alone[0].numpy(), atol=1e-12)
    _, active = solve_rank_svr(V, 1.0, 0.1, lengths=[9, 5])
    assert not active[1, 5:].any()


# -- exact gradient: gradcheck ----------------------------------------------------------------

@pytest.mark.parametrize("epsilon, C", [(0.1, 1.0), (2.5, 10.0)])
def test_gradcheck_u_of_V_exact(epsilon, C):
    rng = np.random.default_rng(2)
    V = unit_rows(rng, 2, 6, 4)
    with torch.no_grad():
        U, _ = solve_rank_svr(V, C, epsilon)
    active, margin = residual_margin(V, U, epsilon)
    assert margin > 1e-4
    if epsilon > 1:  # the large-ε case must really have strictly inactive constraints
        assert active.any() and (~active).any()
    V.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: rank_pool(v, C, epsilon, "exact"), (V,),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("psi", ["ssr", "ser", "tanh"])
@pytest.mark.parametrize("epsilon, C", [(0.1, 1.0), (2.0, 20.0)])
def test_gradcheck_u_of_W_exact(psi, epsilon, C):
    rng = np.random.default_rng(3)
    D = 4
    X = torch.as_tensor(rng.standard_normal((2, 8, D)), dtype=F64)
    mask = torch.ones((2, 8), dtype=F64)
    mask[1, 6:] = 0  # a shorter item, padded
    W = torch.eye(D, dtype=F64) + 0.2 * torch.as_tensor(rng.standard_normal((D, D)), dtype=F64)

    def u_of_W(W):
        return rank_pool(mapped_sequences(X, mask, W, psi, 1e-2), C, epsilon, "exact", F64,
                         [8, 6])

    with torch.no_grad():
        V = mapped_sequences(X, mask, W, psi, 1e-2)
        U, _ = solve_rank_svr(V, C, epsilon)
    active, margin = residual_margin(V[:1], U[:1], epsilon)
    assert margin > 1e-4
    if epsilon > 1:
        assert active.any() and (~active).any()
    W.requires_grad_(True)
    assert torch.autograd.gradcheck(u_of_W, (W,), eps=1e-6, atol=1e-6, rtol=1e-5)


# -- Hessians written out literally -----------------------------------------------------------

def hand_case():
    """T = 3 window vectors in D = 2 with ε chosen so that t = 2 is strictly inactive."""
    V = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [0.28, 0.96]]], dtype=F64)
    C, epsilon = 1.0, 0.4
    U, active = solve_rank_svr(V, C, epsilon)
    return V, U, active, C, epsilon


def test_hand_case_has_inactive_constraint_and_is_optimal():
    V, U, active, C, epsilon = hand_case()
    assert active[0].tolist() == [True, False, True]
    u, v = U[0].numpy(), V[0].numpy()
    # stationarity u = 2C Σ_{t∈A} (t − uᵀv_t − ε s_t) v_t, written out
    rhs = np.zeros(2)
    for t in (1, 3):
        res = t - u @ v[t - 1]
        rhs += 2 * C * (res - epsilon * np.sign(res)) * v[t - 1]
    np.testing.assert_allclose(u, rhs, atol=1e-12)


def literal_dL_dV(V, U, active, g, C, epsilon, hessian):
    """∂u_i/∂v_{t,k} = Σ_j (H⁻¹)_{ij} c (r_t δ_{jk} − v_{t,j} u_k) for active t (0 otherwise),
    c = 2C, r_t = t − uᵀv_t − ε sign(t − uᵀv_t), H = I + c Σ_{t∈A} v_t v_tᵀ; the paper's
    approximation (supplement eqs. 21–27) keeps only diag(H): (H⁻¹)_{ij} = δ_{ij} / H_ii.
    Then ∂L/∂v_{t,k} = Σ_i g_i ∂u_i/∂v_{t,k}."""
    v, u, g = V[0].numpy(), U[0].numpy(), g[0].numpy()
    T, D = v.shape
    c = 2 * C
    H = np.eye(D)
    for t in range(T):
        if active[0, t]:
            H += c * np.outer(v[t], v[t])
    Hinv = np.linalg.inv(H) if hessian == "exact" else np.diag(1.0 / np.diag(H))
    out = np.zeros((T, D))
    for t in range(T):
        if not active[0, t]:
            continue
        res = (t + 1) - u @ v[t]
        r = res - epsilon * np.sign(res)
        for k in range(D):
            du = np.zeros(D)
            for i in range(D):
                for j in range(D):
                    du[i] += Hinv[i, j] * c * (r * (j == k) - v[t, j] * u[k])
            out[t, k] = g @ du
    return out


@pytest.mark.parametrize("hessian", ["exact", "diagonal"])
def test_backward_equals_the_literal_formula(hessian):
    V, U, active, C, epsilon = hand_case()
    g = torch.tensor([[0.7, -1.3]], dtype=F64)
    ours = argmin_input_gradient(V, U, active, g, C, epsilon, hessian)[0].numpy()
    np.testing.assert_allclose(ours, literal_dL_dV(V, U, active, g, C, epsilon, hessian),
                               atol=1e-12)
    # through autograd, the option reaches the backward
    Vg = V.clone().requires_grad_(True)
    (rank_pool(Vg, C, epsilon, hessian) * g).sum().backward()
    np.testing.assert_allclose(Vg.grad[0].numpy(), ours, atol=1e-12)
    assert np.all(ours[1] == 0)  # the inactive constraint gets no gradient


def test_diagonal_differs_from_exact_where_hessian_is_not_diagonal():
    V, U, active, C, epsilon = hand_case()
    g = torch.tensor([[0.7, -1.3]], dtype=F64)
    exact = argmin_input_gradient(V, U, active, g, C, epsilon, "exact")
    diagonal = argmin_input_gradient(V, U, active, g, C, epsilon, "diagonal")
    assert not torch.allclose(exact, diagonal, atol=1e-3)


# -- training on a real sequence set ----------------------------------------------------------

@pytest.fixture(scope="module")
def basic_motions():
    """aeon's BasicMotions (6-channel smartwatch activity, 4 classes), its own train/test
    files, channels standardised with train statistics; sequences (T=100, D=6)."""
    load = pytest.importorskip("aeon.datasets").load_basic_motions
    Xtr, ytr = load(split="train")
    Xte, yte = load(split="test")
    mean = Xtr.mean(axis=(0, 2))[:, None]
    std = Xtr.std(axis=(0, 2))[:, None]

    def to_seqs(X):
        return [((x - mean) / std).T.astype(np.float32) for x in X]

    return to_seqs(Xtr), np.asarray(ytr), to_seqs(Xte), np.asarray(yte)


HRP = {"window": 20, "stride": 5, "depth": 2, "psi": "ssr"}


@pytest.mark.parametrize("hessian", ["exact", "diagonal"])
def test_training_lowers_the_loss_and_compares_with_hrp_svm(basic_motions, hessian):
    """DHRP on the HRP layer-2 sequence X^(2) versus plain HRP + linear SVM."""
    from sklearn.svm import LinearSVC

    from featpipe.encode.temporal import HierarchicalRankPooling

    tr, ytr, te, yte = basic_motions
    layer = HierarchicalRankPooling(**HRP, emit_layer=2)
    tr2, te2 = layer.transform_sequences(tr), layer.transform_sequences(te)
    model = DiscriminativeRankPooling(psi="ssr", hessian=hessian, lr=0.01, epochs=8,
                                      weight_decay=1e-3, val_fraction=0.2, device="cpu",
                                      random_state=0)
    model.fit(tr2, ytr)
    again = DiscriminativeRankPooling(psi="ssr", hessian=hessian, epochs=1, device="cpu",
                                      weight_decay=1e-3, val_fraction=0.2, random_state=0)
    np.testing.assert_array_equal(again.fit(tr2, ytr).coef_init_, model.coef_init_)
    losses = [h["train_loss"] for h in model.history_]
    assert min(losses[1:]) < losses[0]  # from the SVM's start (what `classify` scores)
    hrp = HierarchicalRankPooling(**HRP)
    svm = LinearSVC(C=1.0, fit_intercept=False, max_iter=100_000, random_state=0)
    svm.fit(hrp.transform(tr), ytr)
    hrp_acc = float(np.mean(svm.predict(hrp.transform(te)) == yte))
    dhrp_acc = float(np.mean(model.predict(te2) == yte))
    print(f"\nBasicMotions test accuracy: DHRP ({hessian}, ssr, 8 epochs, best epoch "
          f"{model.best_epoch_}) {dhrp_acc:.3f}; HRP (M=20, S=5, ssr) + linear SVM "
          f"{hrp_acc:.3f}; train loss {losses[0]:.3f} -> {min(losses[1:]):.3f}")
    assert dhrp_acc > 0.5  # 4 classes: chance is 0.25
    proba = model.predict_proba(te2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)


def test_sgd_early_stopping_and_persistence(tmp_path):
    _, _, arrays = fill_store(tmp_path / "s", n_per_class=8)
    ids = sorted(arrays)
    seqs, labels = [arrays[i] for i in ids], [i.split("/")[0] for i in ids]
    model = DiscriminativeRankPooling(psi="tanh", optimizer="sgd", lr=0.05, epochs=15,
                                      patience=2, val_fraction=0.25, device="cpu")
    model.fit(seqs, labels)
    epochs_run = len(model.history_) - 1
    assert epochs_run == min(15, model.best_epoch_ + 2)  # stopped 2 epochs after the best
    best = model.history_[model.best_epoch_]
    assert best["val_loss"] == min(h["val_loss"] for h in model.history_)
    assert model.history_[-1]["train_loss"] < model.history_[0]["train_loss"]
    # the kept W is the best epoch's: its validation loss is reproduced after a round trip
    loaded = DiscriminativeRankPooling.from_arrays(*model.to_arrays())
    np.testing.assert_array_equal(loaded.W_, model.W_)
    np.testing.assert_allclose(loaded.decision_function(seqs), model.decision_function(seqs),
                               rtol=1e-6)
    assert model.n_val_ == 4 and model.n_fit_ == 12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_matches_cpu(tmp_path):
    _, _, arrays = fill_store(tmp_path / "s")
    ids = sorted(arrays)
    seqs, labels = [arrays[i] for i in ids], [i.split("/")[0] for i in ids]
    fits = [DiscriminativeRankPooling(epochs=3, val_fraction=0, device=device).fit(seqs, labels)
            for device in ("cpu", "cuda")]
    assert fits[1].device_.startswith("cuda")
    np.testing.assert_allclose(fits[1].W_, fits[0].W_, atol=1e-3)
    np.testing.assert_allclose(fits[1].transform(seqs), fits[0].transform(seqs), atol=1e-3)


def test_bad_inputs_are_named():
    seqs = [np.ones((5, 3)), np.ones((4, 3))]
    with pytest.raises(InputError, match="item-b: sequence has non-finite"):
        DiscriminativeRankPooling(epochs=1).fit(
            [seqs[0], np.full((4, 3), np.nan)], ["a", "b"], ids=["item-a", "item-b"])
    with pytest.raises(InputError, match="sequence 1: empty sequence"):
        DiscriminativeRankPooling(epochs=1).fit([seqs[0], np.ones((0, 3))], ["a", "b"])
    with pytest.raises(InputError, match="expected 3 features per frame, got 2"):
        DiscriminativeRankPooling(epochs=1).fit([seqs[0], np.ones((4, 2))], ["a", "b"])
    with pytest.raises(InputError, match="delta must be > 0"):
        DiscriminativeRankPooling(delta=0).fit(seqs, ["a", "b"])
    with pytest.raises(InputError, match="hessian must be one of"):
        DiscriminativeRankPooling(hessian="full").fit(seqs, ["a", "b"])
    with pytest.raises(InputError, match="at least 2 classes"):
        DiscriminativeRankPooling().fit(seqs, ["a", "a"])


# -- the commands -----------------------------------------------------------------------------

def fill_store(root, n_per_class=6, seed=0):
    """A sequence stage: class 'up' drifts upwards over time, 'down' downwards (+ noise)."""
    rng = np.random.default_rng(seed)
    rows, arrays = [], {}
    for label, sign in (("up", 1.0), ("down", -1.0)):
        for i in range(n_per_class):
            item_id = f"{label}/{i}"
            T = int(rng.integers(10, 16))
            drift = sign * np.linspace(-1, 1, T)[:, None] * np.array([1.0, 0.5, -0.3])
            arrays[item_id] = (drift + 0.3 * rng.standard_normal((T, 3))).astype(np.float32)
            rows.append((item_id, "", [label], ["train" if i < n_per_class - 2 else "test"]))
    store = Store(root)
    stage = store.stage("import", {"test": seed}, items=from_rows(rows, root=root))
    for item_id, array in arrays.items():
        stage.write_item(item_id, array)
    store.set_name("seqs", stage)
    return store, stage, arrays


def test_fit_and_encode_commands(tmp_path, cli):
    store, source, _ = fill_store(tmp_path / "s")
    # the input: the HRP layer-2 sequence X^(2) (windows of 4, stride 2)
    result = cli("encode", "--store", store.root, "--input", "seqs", "--method", "hrp",
                 "--window", "4", "--stride", "2", "--psi", "ssr", "--emit-layer", "2",
                 "--name", "layer2")
    assert result.exit_code == 0, result.output
    layer2 = store.resolve("layer2")
    arrays = {i: layer2.read_item(i) for i in layer2.items.ids}
    assert all(a.ndim == 2 and a.shape[1] == 3 for a in arrays.values())
    result = cli("fit", "dhrp", "--store", store.root, "--input", "layer2", "--name", "m",
                 "--epochs", "3", "--val-fraction", "0.25", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "test accuracy (soft-max on u*(W))" in result.output
    assert "summary: 1 done" in result.output
    fitted = store.resolve("m")
    arrays_saved, meta = fitted.load_model("dhrp")
    assert set(arrays_saved) == {"W", "coef", "intercept", "coef_init", "intercept_init",
                                 "classes"}
    assert meta["params"]["hessian"] == "exact" and meta["report"]["train_items"] == 8
    again = cli("fit", "dhrp", "--store", store.root, "--input", "layer2", "--name", "m",
                "--epochs", "3", "--val-fraction", "0.25", "--device", "cpu")
    assert "already fitted" in again.output

    result = cli("encode", "--store", store.root, "--input", "layer2", "--method", "dhrp",
                 "--model", "m", "--name", "enc")
    assert result.exit_code == 0, result.output
    model = DiscriminativeRankPooling.from_arrays(arrays_saved, meta)
    enc = store.resolve("enc")
    ids = sorted(arrays)
    expected = model.transform([arrays[i] for i in ids])
    got = np.stack([enc.read_item(i) for i in ids])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

    result = cli("encode", "--store", store.root, "--input", "layer2", "--method", "dhrp",
                 "--model", "m", "--dhrp-output", "scores", "--name", "scores")
    assert result.exit_code == 0, result.output
    scores = np.stack([store.resolve("scores").read_item(i) for i in ids])
    unit = expected / np.linalg.norm(expected, axis=1, keepdims=True)  # --normalize l2
    np.testing.assert_allclose(scores, unit @ model.coef_.T + model.intercept_, rtol=1e-4,
                               atol=1e-4)
    assert scores.shape == (len(ids), 2)


def test_command_errors(tmp_path, cli):
    store, source, _ = fill_store(tmp_path / "s")
    result = cli("encode", "--store", store.root, "--input", "seqs", "--method", "dhrp",
                 "--name", "x")
    assert result.exit_code == 2 and "error: --model is required by --method dhrp" \
        in result.output and "`featpipe fit dhrp`" in result.output
    result = cli("fit", "dhrp", "--store", store.root, "--input", "seqs", "--name", "m",
                 "--psi", "cube")
    assert result.exit_code == 2
    result = cli("fit", "dhrp", "--store", store.root, "--input", "seqs", "--name", "m",
                 "--split", "2")
    assert result.exit_code == 1 and "split 2 does not exist" in result.output
    # a model trained on 3 features refuses items with 2, naming the item
    assert cli("fit", "dhrp", "--store", store.root, "--input", "seqs", "--name", "m",
               "--epochs", "1", "--device", "cpu").exit_code == 0
    other = store.stage("import", {"narrow": 1}, items=source.items)
    for item_id in source.items.ids:
        other.write_item(item_id, np.ones((5, 2)))
    store.set_name("narrow", other)
    result = cli("encode", "--store", store.root, "--input", "narrow", "--method", "dhrp",
                 "--model", "m", "--name", "bad", "--on-error", "skip")
    assert result.exit_code == 1
    assert "failed: down/0: expected 3 features per frame, got 2" in result.output


def test_the_initial_classifier_scores_what_classify_scores_on_the_same_encodings(tmp_path, cli):
    """Epoch 0 of `fit dhrp` is `classify --kernel linear --normalize l2 --C svm_C` on the
    encodings u*(I): the same test accuracy (issue 33), on a set where neither is perfect."""
    import json

    rng = np.random.default_rng(3)
    rows, arrays = [], {}
    for label in ("a", "b", "c"):
        direction = rng.standard_normal(4)
        for i in range(12):
            T = int(rng.integers(8, 14))
            drift = 1.5 * np.linspace(-1, 1, T)[:, None] * direction
            item_id = f"{label}/{i}"
            arrays[item_id] = (drift + rng.standard_normal((T, 4))).astype(np.float32)
            rows.append((item_id, "", [label], ["train" if i < 7 else "test"]))
    store = Store(tmp_path / "s")
    source = store.stage("import", {"issue": 33}, items=from_rows(rows, root=tmp_path))
    for item_id, array in arrays.items():
        source.write_item(item_id, array)
    store.set_name("seqs", source)
    result = cli("fit", "dhrp", "--store", store.root, "--input", "seqs", "--name", "m",
                 "--epochs", 1, "--val-fraction", 0, "--svm-C", 10, "--device", "cpu")
    assert result.exit_code == 0, result.output
    model, meta = store.resolve("m").load_model("dhrp")
    initial = meta["report"]["test_accuracy_init"]
    assert "the initialisation, classify's linear SVM on u*(I) (--normalize l2 --C 10): " \
        f"{initial:.4f} (15 items)" in result.output

    # the encodings u*(I) as a stage of their own, then the real `classify`
    identity = DiscriminativeRankPooling.from_arrays(
        {**model, "W": np.eye(4, dtype=np.float32)}, meta)
    encoded = store.stage("import", {"u*(I)": 1}, items=source.items)
    for item_id, u in zip(source.items.ids, identity.transform(
            [arrays[i] for i in source.items.ids]), strict=True):
        encoded.write_item(item_id, u)
    store.set_name("u0", encoded)
    report = tmp_path / "u0.json"
    result = cli("classify", "--store", store.root, "--input", "u0", "--kernel", "linear",
                 "--normalize", "l2", "--C", 10, "--report", report)
    assert result.exit_code == 0, result.output
    accuracy = json.loads(report.read_text())["summary"]["mean"]
    assert 1 / 3 < accuracy < 1.0  # above chance, not perfect: a comparison that can fail
    assert initial == pytest.approx(accuracy, abs=1e-12)
