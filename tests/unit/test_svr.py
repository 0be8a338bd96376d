"""The rank-pooling SVR solver against liblinear ``-s 11 -B -1 -e 1e-8`` (its optimum)."""

from __future__ import annotations

import functools

import array_api_strict
import numpy as np
import pytest
import torch

from featpipe.encode.svr import (
    gram,
    rank_svr,
    rank_svr_dual,
    rank_svr_liblinear,
    rank_svr_objective,
    rank_svr_primal,
)
from featpipe.errors import InputError

WINDOWS = (1, 2, 3, 5, 8, 13, 20, 31, 50)
CS = (0.01, 1.0, 100.0)
EPSILONS = (0.0, 0.1, 1.0)


def smoothed_unit_windows(X):
    """TVM then L2 per window (B, T, D): the vectors rank pooling sees."""
    V = np.cumsum(X, axis=1) / np.arange(1, X.shape[1] + 1)[:, None]
    return V / np.linalg.norm(V, axis=-1, keepdims=True)


@functools.cache
def basic_motions_train():
    from aeon.datasets import load_basic_motions

    return load_basic_motions(split="train")[0]


def basic_motions_windows(T, n=2):
    """Windows of length T from real BasicMotions sequences (6 channels, SER -> 12 dims)."""
    X = basic_motions_train()
    seqs = np.transpose(X, (0, 2, 1))  # (cases, time, channels)
    windows = np.stack([seqs[i * 7, 3 * i: 3 * i + T] for i in range(n)])
    windows = (windows - windows.mean(axis=(0, 1))) / windows.std(axis=(0, 1))
    ser = np.concatenate([np.sqrt(np.maximum(windows, 0)), np.sqrt(np.maximum(-windows, 0))], -1)
    return smoothed_unit_windows(ser)


def assert_matches_liblinear(V, C, epsilon):
    U = rank_svr(V, C, epsilon)
    R = rank_svr_liblinear(V, C, epsilon, tol=1e-8)
    ours = rank_svr_objective(V, U, C, epsilon)
    ref = rank_svr_objective(V, R, C, epsilon)
    scale = np.maximum(np.abs(ref), 1e-300)
    # ours may be (slightly) lower than liblinear's, never higher by more than 1e-6 relative
    assert np.all((ours - ref) / scale <= 1e-6), (ours, ref)
    assert np.all(np.abs(ours - ref) / scale <= 1e-6), (ours, ref)
    norms = np.linalg.norm(U, axis=-1) * np.linalg.norm(R, axis=-1)
    zero = norms == 0
    assert np.all(np.linalg.norm(U[zero], axis=-1) < 1e-12)
    assert np.all(np.linalg.norm(R[zero], axis=-1) < 1e-12)
    cos = np.sum(U * R, axis=-1)[~zero] / norms[~zero]
    assert np.all(cos >= 0.99999), cos


@pytest.mark.parametrize("C", CS)
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_random_windows_reach_liblinear_optimum(C, epsilon):
    rng = np.random.default_rng(int(C * 100 + epsilon * 10))
    for T in WINDOWS:
        assert_matches_liblinear(smoothed_unit_windows(rng.standard_normal((2, T, 24))),
                                 C, epsilon)


@pytest.mark.parametrize("C", CS)
@pytest.mark.parametrize("epsilon", EPSILONS)
def test_basic_motions_windows_reach_liblinear_optimum(C, epsilon):
    # D = 12 < T for long windows: singular Gram matrices, u is still unique
    for T in (1, 4, 10, 25, 50):
        assert_matches_liblinear(basic_motions_windows(T), C, epsilon)


def test_dual_coefficients_and_active_set():
    rng = np.random.default_rng(3)
    V = smoothed_unit_windows(rng.standard_normal((3, 12, 40)))
    alpha, active = rank_svr_dual(gram(V), C=1.0, epsilon=0.1)
    U = np.einsum("bt,btd->bd", alpha, V)
    residual = np.arange(1, 13) - np.einsum("btd,bd->bt", V, U)
    np.testing.assert_array_equal(active, np.abs(residual) > 0.1)
    # stationarity u = 2C Σ s_t v_t, so α = 2C s exactly where G is invertible
    s = np.sign(residual) * np.maximum(np.abs(residual) - 0.1, 0)
    np.testing.assert_allclose(alpha, 2.0 * s, atol=1e-9)
    assert not np.any(alpha[~active])


def test_namespaces_agree():
    rng = np.random.default_rng(4)
    V = smoothed_unit_windows(rng.standard_normal((5, 20, 16)))
    G = gram(V)
    a_np, act_np = rank_svr_dual(G, 1.0, 0.1)
    a_t, act_t = rank_svr_dual(torch.from_numpy(G), 1.0, 0.1)
    a_s, act_s = rank_svr_dual(array_api_strict.asarray(G), 1.0, 0.1)
    assert isinstance(a_t, torch.Tensor) and isinstance(a_s, type(array_api_strict.asarray(0.0)))
    np.testing.assert_allclose(a_t.numpy(), a_np, atol=1e-10)
    np.testing.assert_allclose(np.asarray(a_s), a_np, atol=1e-10)
    np.testing.assert_array_equal(act_t.numpy(), act_np)
    np.testing.assert_array_equal(np.asarray(act_s), act_np)
    U_s = rank_svr(array_api_strict.asarray(V))
    np.testing.assert_allclose(np.asarray(U_s), rank_svr(V), atol=1e-10)


def test_float32_input_keeps_dtype_and_accuracy():
    rng = np.random.default_rng(5)
    V = smoothed_unit_windows(rng.standard_normal((4, 20, 64))).astype(np.float32)
    U = rank_svr(V)
    assert U.dtype == np.float32
    R = rank_svr_liblinear(V, 1.0, 0.1, tol=1e-8)
    cos = np.sum(U * R, -1) / np.linalg.norm(U, axis=-1) / np.linalg.norm(R, axis=-1)
    assert np.all(cos >= 0.99999)


def test_empty_batch():
    assert rank_svr(np.zeros((0, 5, 3))).shape == (0, 3)


@pytest.mark.parametrize("C", [0, -1, float("nan"), "x"])
def test_bad_C_is_named(C):
    with pytest.raises(InputError, match="C"):
        rank_svr(np.ones((1, 2, 3)), C=C)


def test_bad_epsilon_and_shapes():
    with pytest.raises(InputError, match="epsilon"):
        rank_svr(np.ones((1, 2, 3)), epsilon=-0.1)
    with pytest.raises(InputError, match=r"\(B, T, T\)"):
        rank_svr_dual(np.ones((2, 3, 4)))
    with pytest.raises(InputError, match=r"\(B, T, D\)"):
        rank_svr(np.ones((2, 3)))


@pytest.mark.parametrize(("C", "epsilon", "dtype"),
                         [(1.0, 0.1, np.float64), (100.0, 0.0, np.float64),
                          (0.01, 1.0, np.float64), (1.0, 0.1, np.float32)])
def test_primal_solver_for_long_windows_reaches_liblinear_optimum(C, epsilon, dtype):
    rng = np.random.default_rng(6)
    V = smoothed_unit_windows(np.cumsum(rng.standard_normal((1, 90, 20)), axis=1)).astype(dtype)
    u = rank_svr_primal([V[0, i:i + 16] for i in range(0, 90, 16)], C, epsilon)
    assert u.dtype == dtype
    R = rank_svr_liblinear(V, C, epsilon, tol=1e-8)
    ours = rank_svr_objective(V, u[None], C, epsilon)
    ref = rank_svr_objective(V, R, C, epsilon)
    assert abs(ours[0] - ref[0]) <= 1e-6 * abs(ref[0])
    assert u @ R[0] / np.linalg.norm(u) / np.linalg.norm(R[0]) >= 0.99999



@pytest.mark.parametrize("C", [0.1, 1.0, 100.0])
def test_a_window_gets_the_same_bits_alone_and_in_any_batch(C):
    """A window that settles keeps its coefficients while the others of its batch iterate, so
    batching never changes a result (before, the extra Newton steps of a settled window moved
    its last bits: 97 of 120 batches of these windows differed)."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        V = rng.standard_normal((8, int(rng.integers(5, 60)), 20))
        V[::2] = np.cumsum(V[::2], axis=1)  # smooth windows settle sooner than random ones
        V /= np.linalg.norm(V, axis=-1, keepdims=True)
        G = V @ V.transpose(0, 2, 1)
        together, _ = rank_svr_dual(G, C=C, epsilon=0.1)
        for b in range(V.shape[0]):
            np.testing.assert_array_equal(rank_svr_dual(G[b:b + 1], C=C)[0][0], together[b])
