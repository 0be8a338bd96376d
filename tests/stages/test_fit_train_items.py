"""Every `featpipe fit` model is fitted on the whole train split, never silently on part of it."""

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.store import Store


@pytest.fixture
def half_done(tmp_path):
    rows = [(f"i{k}", "", ["a" if k % 2 else "b"], ["train" if k < 4 else "test"])
            for k in range(6)]
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"t": 1}, items=from_rows(rows, root=tmp_path))
    rng = np.random.default_rng(0)
    for k in (0, 1, 2, 4, 5):  # train item i3 is missing
        stage.write_item(f"i{k}", rng.normal(size=(20, 4)))
    store.set_name("feat", stage)
    return store


@pytest.mark.parametrize("args", [["pca", "--dim", "2"], ["gmm", "--components", "2"],
                                  ["standardize"]])
def test_fit_refuses_a_train_split_with_missing_items(half_done, cli, args):
    result = cli("fit", *args, "--store", half_done.root, "--input", "feat", "--name", "m")
    assert result.exit_code == 1
    assert "1 train items of import-" in result.output
    assert "(first: 'i3'); finish the input stage first" in result.output
