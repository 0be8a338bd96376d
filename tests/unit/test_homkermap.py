"""Homogeneous kernel map: VLFeat's construction, checked against libvl itself when present."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

from featpipe.encode.homkermap import HomogeneousKernelMap, default_period
from featpipe.errors import InputError


def exact_chi2(x, y):
    """k(x, y) = sign(x) sign(y) 2|x||y|/(|x| + |y|), 0 where both are 0."""
    s = np.abs(x) + np.abs(y)
    return np.where(s > 0, 2 * x * y / np.where(s > 0, s, 1), 0.0)


def _libvl():
    """VLFeat's C library (cyvlfeat 0.7.1 does not wrap homkermap, so call libvl directly)."""
    name = ctypes.util.find_library("vl")
    candidates = [name] if name else []
    try:
        import cyvlfeat.generic as generic

        candidates.append(str(__import__("pathlib").Path(generic.__file__).with_name(
            "libvl.so")))
    except ImportError:
        pass
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        lib.vl_homogeneouskernelmap_new.restype = ctypes.c_void_p
        lib.vl_homogeneouskernelmap_new.argtypes = [ctypes.c_int, ctypes.c_double,
                                                    ctypes.c_size_t, ctypes.c_double,
                                                    ctypes.c_int]
        lib.vl_homogeneouskernelmap_evaluate_d.argtypes = [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_size_t, ctypes.c_double]
        lib.vl_homogeneouskernelmap_delete.argtypes = [ctypes.c_void_p]
        return lib
    pytest.skip("VLFeat's libvl is not installed")


def vlfeat_map(values, order, window):
    lib = _libvl()
    handle = lib.vl_homogeneouskernelmap_new(1, 1.0, order, -1.0,
                                             1 if window == "rectangular" else 0)
    dim = 2 * order + 1
    out = np.zeros((len(values), dim))
    buf = (ctypes.c_double * dim)()
    for row, x in enumerate(values):
        lib.vl_homogeneouskernelmap_evaluate_d(handle, buf, 1, float(x))
        out[row] = buf[:]
    lib.vl_homogeneouskernelmap_delete(handle)
    return out


@pytest.mark.vlfeat
@pytest.mark.parametrize("order", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("window", ["rectangular", "uniform"])
def test_equals_vlfeat_on_its_table_grid(order, window):
    # VLFeat tabulates Psi at x = (1 + i/(8 + 8n))·2^e and interpolates linearly in between;
    # on the grid its values are the closed form, so ours must agree to rounding.
    nsub = 8 + 8 * order
    grid = np.array([math.ldexp(1 + i / nsub, e) for e in range(-19, 8) for i in range(nsub)])
    values = np.concatenate([grid, -grid[::5]])
    ours = HomogeneousKernelMap(order=order, window=window).fit_transform(values[:, None])
    ref = vlfeat_map(values, order, window)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12 * np.sqrt(np.abs(values)).max())
    np.testing.assert_allclose(ours / np.sqrt(np.abs(values))[:, None],
                               ref / np.sqrt(np.abs(values))[:, None], atol=1e-12)


@pytest.mark.vlfeat
def test_off_grid_close_to_vlfeat_interpolation_and_no_zeroing():
    rng = np.random.default_rng(0)
    values = np.exp(rng.uniform(np.log(1e-5), np.log(200), 300))
    ours = HomogeneousKernelMap(order=2).fit_transform(values[:, None])
    ref = vlfeat_map(values, 2, "rectangular")
    # linear interpolation between table samples: error is a small fraction of sqrt(x)
    err = np.abs(ours - ref).max(axis=1) / np.sqrt(values)
    assert err.max() < 2e-3
    # VLFeat zeroes |x| >= 256 and |x| < 2^-19 (its table spans exponents -19..7); featpipe
    # keeps mapping them
    extreme = np.array([256.0, 1e4, 0.99 * 2.0 ** -19, 2.0 ** -25])
    assert not vlfeat_map(extreme, 2, "rectangular").any()
    psi = HomogeneousKernelMap(order=2).fit_transform(extreme[:, None])
    assert np.all(np.abs(psi).sum(axis=1) > 0)
    approx = np.sum(psi[0] * psi[1])
    assert abs(approx - exact_chi2(256.0, 1e4)) / exact_chi2(256.0, 1e4) < 0.05


def test_default_periods_and_layout():
    assert default_period(1) == pytest.approx(8.80 * math.sqrt(5.44) - 12.6)
    assert default_period(0) == pytest.approx(8.80 * math.sqrt(4.44) - 12.6)
    assert default_period(1, "uniform") == pytest.approx(5.86 + 3.65)
    assert default_period(2, "uniform") == pytest.approx(5.86 * math.sqrt(2) + 3.65)
    X = np.array([[0.5, 0.0, 2.0], [-0.5, 1.0, 0.0]])
    psi = HomogeneousKernelMap(order=3).fit_transform(X)
    assert psi.shape == (2, 3 * 7)
    single = HomogeneousKernelMap(order=3).fit_transform(np.array([[0.5]]))
    np.testing.assert_array_equal(psi[0, :7], single[0])      # [Psi(x_1), Psi(x_2), ...]
    np.testing.assert_array_equal(psi[1, :7], -single[0])     # sign(x) Psi(|x|)
    assert not psi[0, 7:14].any() and not psi[1, 14:].any()  # Psi(0) = 0


def test_approaches_exact_chi2_as_order_grows():
    rng = np.random.default_rng(1)
    X = rng.random((30, 20)) ** 2
    Y = rng.random((25, 20)) ** 2
    exact = exact_chi2(X[:, None, :], Y[None, :, :]).sum(-1)
    errors = []
    for order in (1, 2, 3, 5):
        hkm = HomogeneousKernelMap(order=order).fit()
        approx = hkm.transform(X) @ hkm.transform(Y).T
        errors.append(np.abs(approx - exact).max() / exact.max())
    assert errors == sorted(errors, reverse=True), errors
    assert errors[0] < 2e-2 and errors[-1] < 1e-3, errors


def test_signed_rule_matches_exact_signed_kernel():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(10, 8))
    Y = rng.normal(size=(12, 8))
    hkm = HomogeneousKernelMap(order=4).fit()
    approx = hkm.transform(X) @ hkm.transform(Y).T
    exact = exact_chi2(X[:, None, :], Y[None, :, :]).sum(-1)
    assert np.abs(approx - exact).max() < 1e-2 * np.abs(exact).max()


@pytest.mark.parametrize("kwargs, message", [
    ({"order": -1}, "order"), ({"order": 1.5}, "order"), ({"gamma": 0}, "gamma"),
    ({"window": "hann"}, "window"), ({"period": -2.0}, "period"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(InputError, match=message):
        HomogeneousKernelMap(**kwargs).fit()


def test_bad_input():
    with pytest.raises(InputError, match="NaN"):
        HomogeneousKernelMap().fit_transform(np.array([[1.0, np.nan]]))
    with pytest.raises(InputError, match="2-D"):
        HomogeneousKernelMap().fit_transform(np.zeros((2, 2, 2)))
