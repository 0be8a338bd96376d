"""``featpipe encode --method hrp|rankpool|...`` on a store filled through the Store API."""

from __future__ import annotations

import re

import numpy as np
import pytest

from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling
from featpipe.manifest import from_rows
from featpipe.store import Store


def fill_store(store_dir, tmp_path, arrays):
    store = Store(store_dir)
    items = from_rows([(i, f"{i}.npy", ["a"], ["train"]) for i in arrays], root=tmp_path)
    stage = store.stage("import", {"test": 1}, items=items)
    for item_id, array in arrays.items():
        stage.write_item(item_id, array)
    store.set_name("feats", stage)
    return store


def test_encode_hrp_cli_matches_library(cli, store_dir, tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"clip/{k}": np.cumsum(rng.standard_normal((n, 6)), 0).astype(np.float32)
              for k, n in enumerate([1, 9, 33])}
    store = fill_store(store_dir, tmp_path, arrays)
    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "hrp",
                   "--window", 8, "--stride", 2, "--name", "hrp8")
    assert "summary:" in proc.output
    encoded = store.resolve("hrp8")
    assert encoded.params["window"] == 8 and encoded.params["psi"] == "ser"
    expected = HierarchicalRankPooling(window=8, stride=2).transform(list(arrays.values()))
    for item_id, row in zip(arrays, expected, strict=True):
        np.testing.assert_allclose(encoded.read_item(item_id), row, rtol=1e-5, atol=1e-7)

    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "hrp",
                   "--window", 8, "--emit-layer", 2, "--name", "layer2")
    assert store.resolve("layer2").read_item("clip/2").shape == (33 - 8 + 1, 12)

    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "rankpool",
                   "--name", "rp")
    expected = RankPooling().transform(list(arrays.values()))
    np.testing.assert_allclose(store.resolve("rp").read_item("clip/1"), expected[1], rtol=1e-5)


def test_encode_cli_bad_item_is_named_and_others_kept(cli, store_dir, tmp_path):
    good = np.ones((5, 3), dtype=np.float32) * np.arange(5, dtype=np.float32)[:, None]
    arrays = {"good": good, "wide": np.ones((5, 4), dtype=np.float32), "alsogood": good + 1}
    store = fill_store(store_dir, tmp_path, arrays)
    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "hrp",
                   "--C", 0, "--name", "bad")
    assert proc.exit_code == 2 and "error: --C must be a float in the range (0.0, inf), got 0.0" \
        in proc.output
    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "rankpool",
                   "--on-error", "skip", "--name", "rp")
    assert proc.exit_code == 1
    assert "name rp points to stage encode-" in proc.output  # skip: named, one item failed
    stage = store.resolve(re.search(r"stage (encode-\w+)", proc.output).group(1))
    failed = stage.failed()
    done = stage.done_ids()
    # whichever item came first fixes the dimension; the other one fails, by name
    assert len(failed) == 1 and len(done) == 2, (failed, done, proc.output)
    assert "features per frame" in next(iter(failed.values()))


def test_encode_cuda_without_gpu_is_clear(cli, store_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: there is no missing-GPU error to check")
    fill_store(store_dir, tmp_path, {"a": np.ones((4, 2), dtype=np.float32)})
    proc = cli("encode", "--store", store_dir, "--input", "feats", "--method", "hrp",
                   "--device", "cuda")
    assert proc.exit_code == 2 and "error: --device cuda: no GPU" in proc.output
