"""Feature maps (TVM, SSR, SER, L2) against literal transcriptions of docs/methods.md."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
import torch

from featpipe.encode.maps import (
    apply_psi,
    l2_normalize,
    normalized_map,
    psi_dim,
    rank_pool_vectors,
    sign_expansion_root,
    signed_square_root,
    time_varying_mean,
)
from featpipe.errors import InputError


def literal_tvm(X):
    return np.stack([X[: t + 1].mean(axis=0) for t in range(len(X))])


def literal_ser(x):
    return np.array([np.sqrt(max(0.0, v)) for v in x] + [np.sqrt(max(0.0, -v)) for v in x])


def literal_l2(x):
    n = np.sqrt(sum(v * v for v in x))
    return x / n if n > 0 else x


def test_tvm_is_running_mean():
    X = np.random.default_rng(0).standard_normal((9, 4))
    np.testing.assert_allclose(time_varying_mean(X), literal_tvm(X), rtol=1e-12)
    W = np.stack([X, X[::-1]])
    np.testing.assert_allclose(time_varying_mean(W)[1], literal_tvm(X[::-1]), rtol=1e-12)


def test_ssr_ser_l2_literal():
    x = np.array([[-4.0, 0.0, 2.25, -0.01], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(signed_square_root(x), np.sign(x) * np.sqrt(np.abs(x)))
    np.testing.assert_allclose(sign_expansion_root(x)[0], literal_ser(x[0]))
    assert sign_expansion_root(x).shape == (2, 8) and psi_dim("ser", 4) == 8
    L = l2_normalize(x)
    np.testing.assert_allclose(L[0], literal_l2(x[0]))
    assert np.all(L[1] == 0) and np.all(np.isfinite(L))


@pytest.mark.parametrize("psi", ["none", "ssr", "ser"])
def test_normalized_map_equals_l2_of_map(psi):
    rng = np.random.default_rng(1)
    S = rng.standard_normal((3, 5, 6))
    S[1, 2] = 0.0  # a zero row stays zero
    ours = normalized_map(S, psi)
    literal = np.zeros_like(ours)
    for b in range(3):
        for t in range(5):
            mapped = {"none": S[b, t], "ssr": np.sign(S[b, t]) * np.sqrt(np.abs(S[b, t])),
                      "ser": literal_ser(S[b, t])}[psi]
            literal[b, t] = literal_l2(mapped)
    np.testing.assert_allclose(ours, literal, rtol=1e-12, atol=1e-15)
    assert np.all(ours[1, 2] == 0)


def test_unknown_psi_is_named():
    with pytest.raises(InputError, match="psi"):
        apply_psi(np.ones((2, 2)), "chi3")


@pytest.mark.parametrize("psi", ["ssr", "ser"])
def test_namespaces(psi):
    X = np.random.default_rng(2).standard_normal((2, 7, 5))
    ref = rank_pool_vectors(X, psi)
    t = rank_pool_vectors(torch.from_numpy(X), psi)
    s = rank_pool_vectors(array_api_strict.asarray(X), psi)
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(s), ref, rtol=1e-12)
