"""PCA: scikit-learn as the reference, seeded sampling of train items, model round trip."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.decomposition import PCA

from featpipe.errors import FeatpipeError, InputError
from featpipe.extract.pca import PCAProjection, load_pca
from featpipe.manifest import Manifest, from_rows
from featpipe.stages.fitting import sample_descriptors
from featpipe.store import Store


def test_projection_matches_sklearn_and_whitening():
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float32)
    ours = PCAProjection(n_components=10).fit(X)
    ref = PCA(n_components=10, svd_solver="full").fit(X)
    Y, R = ours.transform(X), ref.transform(X)
    # principal axes are defined up to sign
    signs = np.sign((Y * R).sum(0))
    np.testing.assert_allclose(Y * signs, R, rtol=1e-3, atol=1e-3)
    white = PCAProjection(n_components=10, whiten=True).fit(X).transform(X)
    np.testing.assert_allclose(white.var(0, ddof=1), 1.0, rtol=1e-3)


def test_bad_inputs():
    with pytest.raises(InputError, match="between 1 and"):
        PCAProjection(n_components=5).fit(np.zeros((3, 4)))
    with pytest.raises(InputError, match="zero variance"):
        PCAProjection(n_components=1).fit(np.zeros((5, 3)))
    with pytest.raises(InputError, match="2-D"):
        PCAProjection(n_components=1).fit(np.zeros(4))
    fitted = PCAProjection(n_components=2).fit(np.random.default_rng(0).random((20, 4)))
    with pytest.raises(InputError, match="fitted on 4-dim rows"):
        fitted.transform(np.zeros((2, 3)))
    with pytest.raises(FeatpipeError, match="not fitted"):
        PCAProjection().transform(np.zeros((2, 3)))


@pytest.fixture
def descriptor_stage(tmp_path):
    manifest = from_rows([(f"v{i}", f"v{i}.mp4", ["a"], ["train" if i < 3 else "test"])
                          for i in range(4)], root=tmp_path)
    stage = Store(tmp_path / "store").stage("extract", {"x": 1}, items=manifest)
    rng = np.random.default_rng(1)
    for i, item_id in enumerate(manifest.ids):
        stage.write_item(item_id, rng.normal(size=(50 + 100 * i, 8)) + i)
    return stage


def test_sampling_is_seeded_and_balanced(descriptor_stage):
    train = descriptor_stage.items.split_ids(1, "train")
    a = sample_descriptors(descriptor_stage, train, 60, seed=3)
    b = sample_descriptors(descriptor_stage, train, 60, seed=3)
    c = sample_descriptors(descriptor_stage, train, 60, seed=4)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (60, 8) and not np.array_equal(a, c)
    assert sample_descriptors(descriptor_stage, train, None, seed=0).shape == (50 + 150 + 250, 8)


def test_cli_fit_and_load(descriptor_stage, cli):
    store_dir = descriptor_stage.store.root
    Store(store_dir).set_name("desc", descriptor_stage)
    result = cli("fit", "pca", "--store", store_dir, "--input", "desc", "--name", "p3",
                 "--dim", "3", "--sample", "100", "--seed", "7")
    assert result.exit_code == 0, result.output
    assert "stage pca-" in result.output and "summary: 1 fitted" in result.output
    again = cli("fit", "pca", "--store", store_dir, "--input", "desc", "--name", "p3",
                "--dim", "3", "--sample", "100", "--seed", "7")
    assert "1 skipped" in again.output
    pca = load_pca(Store(store_dir).resolve("p3"))
    train = descriptor_stage.items.split_ids(1, "train")
    sample = sample_descriptors(descriptor_stage, train, 100, seed=7)
    ref = PCA(n_components=3, svd_solver="full").fit(sample)
    np.testing.assert_allclose(np.abs(pca.components_), np.abs(ref.components_), atol=1e-4)
    assert pca.transform(sample).shape == (100, 3)


def test_cli_needs_train_items(tmp_path, cli):
    stage = Store(tmp_path / "s").stage("extract", {}, items=Manifest(
        from_rows([("t", "t.mp4", ["a"], ["test"])], root=tmp_path).items, root=tmp_path))
    stage.write_item("t", np.ones((3, 2)))
    Store(tmp_path / "s").set_name("d", stage)
    result = cli("fit", "pca", "--store", tmp_path / "s", "--input", "d", "--dim", "1")
    assert result.exit_code == 1
    assert "no train items in split 1" in result.output


def test_save_load_round_trip(tmp_path):
    X = np.random.default_rng(0).random((30, 5))
    pca = PCAProjection(n_components=2, whiten=True).fit(X)
    stage = Store(tmp_path).stage("pca", {"d": 2}, items=Manifest([], root=tmp_path))
    stage.save_model("pca", pca, {"input": "x"})
    back = load_pca(stage)
    np.testing.assert_array_equal(back.transform(X), pca.transform(X))


_KERNEL_PROBE = """
import sys
import numpy as np
from featpipe.extract.pca import project
rng = np.random.default_rng(0)
x = (rng.gamma(0.6, 40.0, (3000, 128))).astype(np.float32)  # SIFT-like: non-negative, skewed
mean = x.mean(axis=0)
matrix = np.linalg.qr(rng.standard_normal((128, 64)))[0].T.astype(np.float32)
whole = project(x, mean, matrix)
frames = np.concatenate([project(x[i:i + 137], mean, matrix) for i in range(0, 3000, 137)])
np.save(sys.argv[1], np.stack([whole, frames]))
"""


def _has_avx2() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and " avx2" in cpuinfo.read_text()


@pytest.mark.skipif(platform.machine() != "x86_64" or not _has_avx2(),
                    reason="OpenBLAS's Haswell and Zen kernels need an x86-64 CPU with AVX2")
def test_projection_rows_do_not_depend_on_the_batch_nor_the_blas_kernel(tmp_path):
    """The fused extract --encode path projects frame by frame, the two-stage path whole
    items; OpenBLAS's Haswell and Zen float32 kernels give those rows different last bits,
    which the FV's posterior cut-off magnified to 6e-5.  The same bits under every kernel."""
    results = {}
    for kernel in ("", "Haswell", "Zen"):  # "" = the kernel OpenBLAS picks for this CPU
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        if kernel:
            env["OPENBLAS_CORETYPE"] = kernel
        out = tmp_path / f"{kernel or 'default'}.npy"
        subprocess.run([sys.executable, "-c", _KERNEL_PROBE, str(out)], env=env, check=True)
        results[kernel] = np.load(out)
    for kernel, (whole, frames) in results.items():
        np.testing.assert_array_equal(whole, frames, err_msg=kernel)
        np.testing.assert_array_equal(whole, results[""][0], err_msg=kernel)
