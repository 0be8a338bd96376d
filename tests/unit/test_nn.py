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
from featpipe.nn.functional import RankPoolArgmin  # noqa: E402
from featpipe.nn.rank_pool import HierarchicalRankPool, RankPool  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.unit.test_dhrp import one_torch_thread  # noqa: E402, F401  (autouse: one thread)

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


# -- the gradcheck sweep: every module and function of featpipe.nn at its defaults ----------
#
# Three inputs each: exact zeros, repeated frames, a single frame.  Where an input has exact
# zeros at which a square root (or SER's kink) has no derivative, gradcheck runs with respect
# to every other entry (the zeros held fixed), and the full gradient must be finite: the zero
# entries get the subgradient 0, not NaN.

def _frames(kind, T=6, D=3, B=1, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "single":
        return torch.tensor(rng.normal(size=(B, 1, D)) + 0.3, dtype=F64)
    X = torch.tensor(rng.normal(size=(B, T, D)) + 0.3, dtype=F64)
    if kind == "zeros":
        X[:, 2] = 0.0       # a whole zero frame
        X[:, 0, 1] = 0.0    # a zero at the start of a running sum
        X[:, T - 1, 0] = 0.0
    else:                   # repeated frames
        X[:, 1] = X[:, 0]
        X[:, 4] = X[:, 3]
    return X


def _sweep(fn, X, *params, fast_mode=False):
    """gradcheck of fn(X, *params) in the non-zero entries of X and in params; the gradient
    with respect to all of X (zeros included) is finite.  ``fast_mode``: gradcheck of a random
    projection of the Jacobian (for many parameters)."""
    free = X != 0
    values = X[free].clone().requires_grad_()

    def on_free(v, *p):
        full = torch.zeros_like(X).masked_scatter(free, v)
        return fn(full, *p)

    params = tuple(p.detach().clone().requires_grad_() for p in params)
    assert torch.autograd.gradcheck(on_free, (values, *params), eps=1e-6, atol=1e-5,
                                    fast_mode=fast_mode)
    whole = X.clone().requires_grad_()
    out = fn(whole, *params)
    out = out if isinstance(out, torch.Tensor) else out[0]
    weights = torch.as_tensor(np.random.default_rng(9).normal(size=out.shape), dtype=F64)
    (grad,) = torch.autograd.grad((out * weights).sum(), whole)
    assert torch.isfinite(grad).all()


KINDS = ("zeros", "repeated", "single")


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_rank_pool_function(kind):
    from featpipe.nn.functional import rank_pool

    _sweep(rank_pool, _frames(kind, B=2))


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_rank_pool_module(kind):
    _sweep(RankPool(), _frames(kind, B=2))


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_hierarchical_rank_pool_module_at_its_defaults(kind):
    """Window 20, stride 1, depth 2, ψ = SER (the default that gave all-NaN gradients)."""
    module = HierarchicalRankPool()
    assert (module.window, module.stride, module.depth, module.pool.psi) == (20, 1, 2, "ser")
    _sweep(module, _frames(kind, T=23, D=2))


def test_hierarchical_rank_pool_gradient_is_finite_for_an_all_zero_sequence():
    X = torch.zeros(1, 5, 2, dtype=F64, requires_grad=True)
    HierarchicalRankPool()(X).sum().backward()
    assert torch.isfinite(X.grad).all()


@pytest.mark.parametrize("psi", ["ssr", "ser", "tanh"])
@pytest.mark.parametrize("kind", KINDS)
def test_sweep_psi_map_and_mapped_sequences(psi, kind):
    from featpipe.nn.functional import mapped_sequences, psi_map

    X = _frames(kind, B=2)
    _sweep(lambda Z: psi_map(Z, psi, 1e-3), X)
    if psi == "ssr":  # smooth at 0: the zeros themselves pass gradcheck
        assert torch.autograd.gradcheck(lambda Z: psi_map(Z, psi, 1e-3),
                                        (X.clone().requires_grad_(),), eps=1e-6, atol=1e-5)
    mask = torch.ones(X.shape[:2], dtype=F64)
    W = torch.eye(X.shape[2], dtype=F64) + 0.1
    _sweep(lambda Z, W: mapped_sequences(Z, mask, W, psi, 1e-3), X, W)


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_dhrp_network_at_its_defaults(kind):
    X = _frames(kind, B=2)
    net = DiscriminativeRankPoolingNet(X.shape[2], 3).double()
    mask = torch.ones(X.shape[:2], dtype=F64)
    coef = torch.as_tensor(np.random.default_rng(1).normal(size=net.coef.shape), dtype=F64)
    _sweep(lambda Z, W, c: torch.func.functional_call(net, {"W": W, "coef": c}, (Z, mask)),
           X, net.W.detach() + 0.05, coef)


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_fisher_vector_layer_at_its_defaults(kind):
    rng = np.random.default_rng(4)
    gmm = GaussianMixtureModel(3, max_iter=20, random_state=0).fit(rng.normal(size=(40, 3)))
    layer = FisherVectorLayer(gmm.weights_, gmm.means_, gmm.variances_)
    x = _frames(kind, T=12)[0]  # descriptors: zero rows and entries, repeats, a single one
    params = tuple(p.detach().clone().requires_grad_() for p in (layer.a, layer.mu, layer.s))
    assert torch.autograd.gradcheck(
        lambda a, mu, s: torch.func.functional_call(layer, {"a": a, "mu": mu, "s": s}, (x,)),
        params, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_gmsop_network_at_its_defaults(kind):
    from featpipe.nn.gmsop import GatedMixtureSOPNet

    X = _frames(kind, T=5, D=4, B=2)  # conv maps (B, N positions, D channels)
    net = GatedMixtureSOPNet(4, 3, generator=torch.Generator().manual_seed(0)).double()
    torch.nn.init.normal_(net.head.weight, generator=torch.Generator().manual_seed(1))
    projections = net.projections.detach()
    _sweep(lambda Z, P: torch.func.functional_call(net, {"projections": P}, (Z,))[0],
           X, projections, fast_mode=True)


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_gate_functions(kind):
    from featpipe.nn.functional import balance_loss, top_k_softmax

    logits = {"zeros": [[0.0, 0.0, 1.0, 2.0, -1.0], [0.5, 0.0, -2.0, 0.0, 3.0]],
              "repeated": [[3.0, 3.0, 1.0, 0.0, -1.0], [3.0, 3.0, 1.0, 0.0, -1.0]],
              "single": [[0.3, -0.2, 1.5, 0.7, 0.0]]}[kind]
    logits = torch.tensor(logits, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: top_k_softmax(z, 2), (logits,))
    gates = top_k_softmax(logits, 3).detach().requires_grad_()  # exact zeros off the top 3
    assert torch.autograd.gradcheck(balance_loss, (gates,))


#: featpipe.nn's names and the sweep test that checks each; the others are not functions of
#: differentiable inputs (the forward solver, the backward pass itself, padding).
SWEPT = {"RankPoolArgmin": "test_sweep_rank_pool_function", "psi_map": "test_sweep_psi_map",
         "mapped_sequences": "test_sweep_psi_map", "top_k_softmax": "test_sweep_gate_functions",
         "balance_loss": "test_sweep_gate_functions", "RankPool": "test_sweep_rank_pool_module",
         "HierarchicalRankPool": "test_sweep_hierarchical_rank_pool_module_at_its_defaults",
         "DiscriminativeRankPoolingNet": "test_sweep_dhrp_network_at_its_defaults",
         "FisherVectorFunction": "test_sweep_fisher_vector_layer_at_its_defaults",
         "FisherVectorLayer": "test_sweep_fisher_vector_layer_at_its_defaults",
         "GatedMixtureSOPNet": "test_sweep_gmsop_network_at_its_defaults"}
NOT_SWEPT = {"solve_rank_svr": "the forward solve (no gradient; RankPoolArgmin wraps it)",
             "argmin_input_gradient": "RankPoolArgmin's backward pass",
             "pad_sequences": "builds the padded input; no parameters"}


def test_the_sweep_covers_every_exported_name():
    import featpipe.nn as nn_package

    assert set(nn_package.__all__) == set(SWEPT) | set(NOT_SWEPT)
    names = set(globals())
    assert all(any(n.startswith(test) for n in names) for test in SWEPT.values())


def test_every_exported_name_imports():
    import featpipe.nn as nn_package

    for name in nn_package.__all__:
        assert getattr(nn_package, name) is getattr(
            __import__(f"featpipe.nn.{nn_package.EXPORTS[name]}", fromlist=[name]), name)
    from featpipe.nn import HierarchicalRankPool as H
    from featpipe.nn import RankPool as R

    assert (R, H) == (RankPool, HierarchicalRankPool)


def test_the_documented_imports_run():
    """Every ``from featpipe.nn... import ...`` and ``import featpipe.nn...`` line in the
    README and docs/ runs."""
    import re

    lines = set()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]:
        for match in re.finditer(r"^\s*(from featpipe\.nn\S* import [^\n`]+|import featpipe\.nn"
                                 r"\S*)", path.read_text(encoding="utf-8"), re.MULTILINE):
            lines.add(match.group(1).strip().rstrip("\\"))
    assert any("from featpipe.nn import" in line for line in lines)  # docs/python-api.md
    for line in sorted(lines):
        exec(line, {})  # noqa: S102 - the documented import itself
