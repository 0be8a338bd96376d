"""GM-SOP (featpipe.learn.gmsop): gate, balance loss, components, training and the CLI.

References: a numpy transcription of the forward pass (gate, top-K softmax, Σ_j, iSQRT-COV,
upper triangle, weighted sum), the authors' hand-written balance-loss gradient
(``Balance_loss.m`` backward), gradcheck, and held-out accuracy on synthetic conv maps whose
classes differ only in second-order statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from featpipe.learn.gmsop import GatedMixtureSOP  # noqa: E402
from featpipe.nn.functional import balance_loss, top_k_softmax  # noqa: E402
from tests.unit.test_bilinear import fill_store, ns_transcription  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small arrays: one thread (torch and BLAS) avoids spin-waiting on a shared machine."""
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


def synthetic_maps(n_items=48, n=24, d=6, seed=0):
    """Two classes with zero-mean features along class-specific directions: first-order
    pooling cannot separate them, second-order pooling can."""
    rng = np.random.default_rng(seed)
    directions = np.linalg.qr(rng.standard_normal((d, d)))[0][:, :2].T
    maps, labels = [], []
    for i in range(n_items):
        label = i % 2
        signs = rng.choice([-1.0, 1.0], (n, 1))
        x = 2.0 * signs * directions[label] + 0.5 * rng.standard_normal((n, d))
        maps.append(x.astype(np.float32))
        labels.append("ab"[label])
    return maps, np.array(labels)


def test_top_k_softmax_keeps_k_entries():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.0], [1.0, 1.1, 1.2, -5.0, 0.9]])
    gates = top_k_softmax(logits, 2).numpy()
    assert (np.count_nonzero(gates, axis=1) == 2).all()
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-6)
    expect = np.exp([2.0, 1.5]) / np.exp([2.0, 1.5]).sum()
    np.testing.assert_allclose(gates[0, [1, 3]], expect, rtol=1e-6)


def test_balance_loss_and_its_gradient_match_the_authors_formulas():
    rng = np.random.default_rng(1)
    weights = torch.tensor(rng.random((7, 5)), requires_grad=True)
    w, M = 100.0, 5
    loss = balance_loss(weights, w)
    s = weights.detach().numpy().sum(axis=0)
    rsd = s.std(ddof=1) / s.mean()
    np.testing.assert_allclose(loss.item(), w * rsd ** 2, rtol=1e-12)
    (grad,) = torch.autograd.grad(loss, weights)
    m = s.mean()  # Balance_loss.m backward, per component, same for every image
    der = s * 2 * w / ((M - 1) * m ** 2) - 2 * w * (1 / (M - 1) + rsd ** 2 / M) / m
    np.testing.assert_allclose(grad.numpy(), np.tile(der, (7, 1)), rtol=1e-10)


def transcribed_code(model, x):
    """GM-SOP forward of one image, written out in numpy (no gate noise)."""
    P = model.projections_.astype(np.float64)
    if model.gate == "average":
        h = x.mean(axis=0) @ model.gate_weight_
    else:  # SR-SOP: triu of the NS square root of the reduced second moment
        r = x @ model.gate_projection_
        g = model.gate_projection_.shape[1]
        h = ns_transcription(r.T @ r / len(x), model.ns_iters)[np.triu_indices(g)] \
            @ model.gate_weight_
    top = np.argsort(-h, kind="stable")[: model.top_k]
    g = np.exp(h[top] - h[top].max())
    g /= g.sum()
    d = P.shape[2]
    rows, cols = np.triu_indices(d)
    code = np.zeros(d * (d + 1) // 2)
    for weight, j in zip(g, top, strict=True):
        z = x @ P[j]
        code += weight * ns_transcription(z.T @ z / len(x), model.ns_iters)[rows, cols]
    return code


@pytest.fixture(scope="module", params=["sr-sop", "average"])
def fitted(request):
    maps, labels = synthetic_maps()
    model = GatedMixtureSOP(n_components=4, top_k=2, dim=3, epochs=25, lr=0.05,
                            batch_size=8, random_state=0, gate=request.param, gate_dim=3)
    return model.fit(maps[:32], labels[:32]), maps, labels


def test_fit_learns_second_order_classes(fitted):
    model, maps, labels = fitted
    assert model.loss_curve_[-1] < model.loss_curve_[0]
    assert np.mean(model.predict(maps[32:]) == labels[32:]) >= 0.9


def test_transform_equals_transcription_and_round_trips(fitted):
    model, maps, _ = fitted
    codes = model.transform(maps[:3])
    for i in range(3):
        np.testing.assert_allclose(codes[i], transcribed_code(model, maps[i].astype(np.float64)),
                                   rtol=1e-4, atol=1e-5)
    arrays, meta = model.to_arrays()
    again = GatedMixtureSOP.from_arrays(arrays, meta)
    np.testing.assert_array_equal(again.transform(maps[:3]), codes)
    np.testing.assert_array_equal(again.predict(maps), model.predict(maps))
    if model.gate == "average":  # a model saved before the gate option: read with that gate
        params = {k: v for k, v in meta["params"].items() if k not in ("gate", "gate_dim")}
        old = GatedMixtureSOP.from_arrays(arrays, {**meta, "params": params})
        assert old.gate == "average"
        np.testing.assert_array_equal(old.transform(maps[:3]), codes)


@pytest.mark.parametrize("gate", ["sr-sop", "average"])
def test_codes_gradcheck(gate):
    """Through the network's codes (featpipe.nn.gmsop), with respect to the input, the
    projections and (sr-sop) the gate's reduction."""
    from featpipe.nn.gmsop import GatedMixtureSOPNet

    class Codes(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net.codes(x)[0]

    rng = np.random.default_rng(2)
    codes = Codes(GatedMixtureSOPNet(4, 2, n_components=3, top_k=2, dim=2, ns_iters=3,
                                     gate=gate, gate_dim=2))
    x = torch.tensor(rng.standard_normal((2, 6, 4)), requires_grad=True)
    width = 3 if gate == "sr-sop" else 4
    params = {"net.projections": torch.tensor(rng.standard_normal((3, 4, 2)),
                                              requires_grad=True),
              "net.gate_weight": torch.tensor(rng.standard_normal((width, 3))),
              "net.noise_weight": torch.tensor(rng.standard_normal((width, 3))),
              "net.gate_projection": torch.tensor(rng.standard_normal((4, 2)),
                                                  requires_grad=True)}
    if gate == "average":
        del params["net.gate_projection"]
    free = [k for k in params if params[k].requires_grad]
    assert torch.autograd.gradcheck(
        lambda x, *p: torch.func.functional_call(codes, {**params, **dict(zip(free, p,
                                                                              strict=True))},
                                                 (x,)),
        (x, *[params[k] for k in free]))


def test_bad_parameters_and_inputs():
    maps, labels = synthetic_maps(n_items=4)
    with pytest.raises(ValueError, match=r"top_k must lie in 1..n_components \(2\), got 3"):
        GatedMixtureSOP(n_components=2, top_k=3).fit(maps, labels)
    with pytest.raises(ValueError, match="two classes"):
        GatedMixtureSOP(n_components=2, top_k=1).fit(maps, ["a"] * 4)
    with pytest.raises(ValueError, match="one D"):
        GatedMixtureSOP(n_components=2, top_k=1).fit([maps[0], maps[1][:, :3]], ["a", "b"])


def test_cli_fit_and_encode_gmsop(store_dir, cli):
    maps, labels = synthetic_maps(n_items=16, n=12, d=5)
    store = fill_store(store_dir, {f"im{i}": (m.reshape(3, 4, 5), {})
                                   for i, m in enumerate(maps)})
    result = cli("fit", "gmsop", "--store", store_dir, "--input", "feats", "--name", "gm",
                 "--components", "3", "--top-k", "2", "--dim", "3", "--epochs", "3")
    assert result.exit_code == 0, result.output
    assert "summary: 1 done" in result.output
    again = cli("fit", "gmsop", "--store", store_dir, "--input", "feats", "--name", "gm",
                "--components", "3", "--top-k", "2", "--dim", "3", "--epochs", "3")
    assert "1 skipped" in again.output
    result = cli("encode", "--store", store_dir, "--input", "feats", "--method", "gmsop",
                 "--model", "gm", "--name", "codes")
    assert result.exit_code == 0, result.output
    arrays, meta = store.resolve("gm").load_model("gmsop")
    model = GatedMixtureSOP.from_arrays(arrays, meta)
    np.testing.assert_allclose(store.resolve("codes").read_item("im5"),
                               model.transform([maps[5]])[0], rtol=1e-6)
    assert model.gate == "sr-sop"  # the paper's gate by default; --gate average the other
    result = cli("fit", "gmsop", "--store", store_dir, "--input", "feats", "--name", "gm-avg",
                 "--components", "3", "--top-k", "2", "--dim", "3", "--epochs", "3",
                 "--gate", "average")
    assert result.exit_code == 0, result.output
    assert store.resolve("gm-avg").key != store.resolve("gm").key
    arrays, meta = store.resolve("gm-avg").load_model("gmsop")
    assert GatedMixtureSOP.from_arrays(arrays, meta).gate == "average"
    assert "gate_projection" not in arrays
    missing = cli("encode", "--store", store_dir, "--input", "feats", "--method", "gmsop")
    assert missing.exit_code == 2 and "--model is required by --method gmsop" in missing.output
    assert "`featpipe fit gmsop`" in missing.output
