"""``--dtype float16`` never loses values without a word (issue 22 section 4): the values a
float16 store flushes to zero are counted in a warning naming the item."""

from __future__ import annotations

import numpy as np

from featpipe.store import Store
from tests.test_import_export import write_manifest


def test_float16_underflow_is_warned_with_the_count(tmp_path, cli):
    arrays = {"tiny": np.array([[1.0, 1e-9, -2e-8], [2e-10, 0.0, 0.5]], np.float32),
              "fine": np.array([[1.0, 6e-5, -4e-8], [0.0, 0.25, 1.0]], np.float32)}
    np.savez(tmp_path / "f.npz", **arrays)
    manifest = write_manifest(tmp_path, list(arrays))
    result = cli("import", "--manifest", manifest, "--from", tmp_path / "f.npz", "--store",
                 tmp_path / "s", "--name", "half", "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert "tiny: 3 value(s) below float16's smallest (5.96e-08) written as 0" in result.stderr
    assert "fine:" not in result.stderr  # 6e-5 and -4e-8 round to float16 subnormals
    stored = Store(tmp_path / "s").resolve("half").read_item("tiny")
    assert stored.dtype == np.float16 and np.count_nonzero(stored) == 2
