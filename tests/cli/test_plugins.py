"""CONTRIBUTING.md's example encoder (examples/velocity_pooling.py), loaded as a plugin and
run through the command line: one module is enough to add an encoder."""

from __future__ import annotations

import numpy as np

from featpipe.manifest import from_rows
from featpipe.store import Store
from tests.conftest import REPO, run_cli

PLUGIN = {"FEATPIPE_ENCODERS": "examples.velocity_pooling"}


def test_contributing_shows_the_example_module_verbatim():
    module = (REPO / "examples" / "velocity_pooling.py").read_text(encoding="utf-8")
    guide = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert f"```python\n{module}```" in guide
    assert len(module.splitlines()) <= 60


def test_plugin_encoder_runs_through_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"v{i}": rng.normal(size=(6 + i, 3)).astype(np.float32) for i in range(4)}
    arrays["short"] = rng.normal(size=(2, 3)).astype(np.float32)  # at most lag frames: zeros
    store = Store(tmp_path / "s")
    stage = store.stage("import", {"plugin": 1}, items=from_rows(
        [(i, "", ["a"], ["train"]) for i in arrays], root=tmp_path))
    for item_id, array in arrays.items():
        stage.write_item(item_id, array)
    store.set_name("seqs", stage)

    assert "velocity" in run_cli("encode", "--help", env=PLUGIN).stdout
    listed = run_cli("encode", "--method", "velocity", "--help", env=PLUGIN).stdout
    assert "--lag INTEGER" in listed and "--absolute / --no-absolute" in listed and \
        "Frames between the two frames of each difference. [1]" in " ".join(listed.split())
    assert "velocity" not in run_cli("encode", "--help").stdout  # not a shipped method

    run_cli("encode", "--store", store.root, "--input", "seqs", "--method", "velocity",
            "--lag", "2", "--name", "vel", env=PLUGIN)
    encoded = store.resolve("vel")
    assert encoded.params == {"method": "velocity", "lag": 2, "absolute": True}
    for item_id, x in arrays.items():
        x = x.astype(np.float64)
        expected = np.abs(x[2:] - x[:-2]).mean(axis=0) if len(x) > 2 else np.zeros(3)
        np.testing.assert_allclose(encoded.read_item(item_id), expected, rtol=1e-6)

    bad = run_cli("encode", "--store", store.root, "--input", "seqs", "--method", "velocity",
                  "--lag", "0", "--name", "vel", check=False, env=PLUGIN)
    assert bad.returncode == 2
    assert "error: --lag must be an int in the range [1, inf), got 0" in bad.stderr
    assert store.resolve("vel") == encoded and len(store.all_stages()) == 2  # nothing new
