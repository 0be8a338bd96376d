"""torch modules (featpipe.nn): gradcheck through each, the same numbers as the numpy
encoders, module-level autograd functions, and lazy loading."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from featpipe.encode.fisher import GaussianMixtureModel, fisher_vector  # noqa: E402
from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling  # noqa: E402
from featpipe.errors import InputError  # noqa: E402
from featpipe.nn.dhrp import DiscriminativeRankPoolingNet  # noqa: E402
from featpipe.nn.fisher import FisherVectorLayer  # noqa: E402
from featpipe.nn.rank_pool import HierarchicalRankPool, RankPool, RankPoolArgmin  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.test_dhrp import one_torch_thread  # noqa: E402, F401  (autouse: one thread)

F64 = torch.float64


def test_rank_pool_module_equals_the_encoder_and_passes_gradcheck():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2, 9, 3)) + np.linspace(0, 2, 9)[None, :, None]
    pool = RankPool(psi="ssr")
    U = pool(torch.tensor(X, dtype=F64))
    expected = RankPooling(directions="fwd", psi="ssr").fit(list(X)).transform(list(X))
    np.testing.assert_allclose(U.detach().numpy(), expected, rtol=1e-6, atol=1e-8)
    Xt = torch.tensor(X, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(pool, (Xt,), eps=1e-6, atol=1e-5)


def test_rank_pool_module_with_lengths_equals_each_sequence_alone():
    rng = np.random.default_rng(1)
    X = torch.tensor(rng.normal(size=(2, 8, 3)) + 1.0, dtype=F64)
    X[1, 5:] = 0.0
    pool = RankPool(psi="none")
    both = pool(X, lengths=[8, 5])
    alone = pool(X[1:, :5])
    torch.testing.assert_close(both[1:], alone, rtol=1e-8, atol=1e-10)


def test_hierarchical_rank_pool_equals_the_encoder_and_passes_gradcheck():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2, 10, 3)) + 0.5
    module = HierarchicalRankPool(window=4, stride=2, depth=2, psi="ser")
    got = module(torch.tensor(X, dtype=F64)).detach().numpy()
    expected = HierarchicalRankPooling(window=4, stride=2, depth=2, psi="ser").fit(
        list(X)).transform(list(X))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)
    Xt = torch.tensor(X[:1, :7], dtype=F64, requires_grad=True)
    small = HierarchicalRankPool(window=3, stride=2, depth=2, psi="ssr")
    assert torch.autograd.gradcheck(small, (Xt,), eps=1e-6, atol=1e-5)


def test_dhrp_network_gradcheck_through_the_argmin():
    rng = np.random.default_rng(3)
    net = DiscriminativeRankPoolingNet(3, 2, psi="ssr", delta=1e-2).double()
    X = torch.tensor(rng.normal(size=(2, 6, 3)), dtype=F64)
    mask = torch.ones(2, 6, dtype=F64)
    mask[1, 4:] = 0
    X = X * mask[..., None]
    W = torch.tensor(np.eye(3) + 0.1 * rng.normal(size=(3, 3)), requires_grad=True)
    coef = torch.tensor(rng.normal(size=(2, 3)), requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda W, coef: torch.func.functional_call(net, {"W": W, "coef": coef}, (X, mask)),
        (W, coef), eps=1e-6, atol=1e-5)


def test_fisher_vector_layer_equals_fisher_vector_and_passes_gradcheck():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 3))
    gmm = GaussianMixtureModel(3, max_iter=20, random_state=0).fit(x)
    layer = FisherVectorLayer(gmm.weights_, gmm.means_, gmm.variances_)
    items = torch.tensor(rng.normal(size=(15, 3)))
    np.testing.assert_allclose(layer(items).detach().numpy(),
                               fisher_vector(items.numpy(), gmm.weights_, gmm.means_,
                                             gmm.variances_), rtol=1e-5, atol=1e-6)
    params = (layer.a, layer.mu, layer.s)
    assert torch.autograd.gradcheck(
        lambda a, mu, s: torch.func.functional_call(layer, {"a": a, "mu": mu, "s": s},
                                                    (items,)),
        tuple(p.detach().clone().requires_grad_() for p in params), eps=1e-6, atol=1e-5)
    with pytest.raises(InputError, match="not the descriptors"):
        layer(items.clone().requires_grad_())


def test_autograd_functions_live_at_module_level():
    import featpipe.learn.dhrp as dhrp

    assert issubclass(RankPoolArgmin, torch.autograd.Function)
    assert RankPoolArgmin.__qualname__ == "RankPoolArgmin"
    assert not [name for name, value in vars(dhrp).items()
                if isinstance(value, type) and issubclass(value, torch.autograd.Function)]
    assert not hasattr(dhrp, "_FUNCTION") and not hasattr(dhrp, "_rank_pool_function")


def test_the_registry_loads_without_torch():
    code = ("import sys; from featpipe.encode.registry import load_methods; load_methods(); "
            "import featpipe.stages; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True, env={"PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False"
