"""fit standardize + encode --method standardize against numpy's mean/std of train frames."""

import numpy as np
import pytest

from featpipe.encode.standardize import Standardizer
from featpipe.errors import InputError
from featpipe.manifest import from_rows
from featpipe.store import Store


def test_cli_matches_numpy_train_statistics(tmp_path, cli):
    rng = np.random.default_rng(0)
    seqs = {f"s{i}": rng.normal(3.0, 2.0, size=(5 + i, 3)) for i in range(6)}
    seqs["s0"][:, 2] = 7.0  # constant in s0 only
    rows = [(k, "", ["a"], ["train" if i < 4 else "test"]) for i, k in enumerate(seqs)]
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"t": 1}, items=from_rows(rows, root=tmp_path))
    for k, x in seqs.items():
        stage.write_item(k, x)
    store.set_name("raw", stage)
    assert cli("fit", "standardize", "-s", store.root, "-i", "raw", "-n", "z").exit_code == 0
    result = cli("encode", "-s", store.root, "-i", "raw", "-m", "standardize", "--model", "z",
                 "-n", "raw-z")
    assert result.exit_code == 0, result.output
    train = np.concatenate([seqs[f"s{i}"].astype(np.float32) for i in range(4)])
    mean, std = train.mean(0), train.std(0)
    out = store.resolve("raw-z")
    for k, x in seqs.items():
        np.testing.assert_allclose(out.read_item(k), (x.astype(np.float32) - mean) / std,
                                   rtol=1e-5, atol=1e-5)


def test_constant_channel_becomes_zero_and_bad_shapes_are_named():
    model = Standardizer().fit([np.ones((4, 2))])
    assert np.all(model.transform([np.ones((3, 2))])[0] == 0)
    with pytest.raises(InputError, match="sequence 0: 3 channels"):
        model.transform([np.ones((2, 3))])
    with pytest.raises(InputError, match="sequence 1: expected a non-empty"):
        Standardizer().fit([np.ones((2, 2)), np.ones((0, 2))])
