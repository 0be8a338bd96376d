"""A feature method added as one module and one registry line (tests/_grey_grid.py, loaded
through ``$FEATPIPE_FEATURES``) runs through the command line and a pipeline file, with its
options generated from its declarations, and gives the literal values."""

from __future__ import annotations

import json

import cv2
import numpy as np

from featpipe.io.video import iter_frames
from featpipe.store import Store
from tests.conftest import run_cli
from tests.unit.test_video import write_video

PLUGIN = {"FEATPIPE_FEATURES": "tests._grey_grid"}


def literal_cells(rgb: np.ndarray, cell: int) -> np.ndarray:
    """Each cell's grey values (mean of R, G, B over 255), cells row-major, pixels row-major."""
    grey = rgb.astype(np.float64).mean(axis=2) / 255
    rows, cols = rgb.shape[0] // cell, rgb.shape[1] // cell
    return np.array([grey[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell].ravel()
                     for r in range(rows) for c in range(cols)])


def test_a_toy_feature_method_through_the_cli_and_a_pipeline_file(tmp_path):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (13, 18, 3), np.uint8)  # 3 x 4 cells of 4 (the rest cut)
    cv2.imwrite(str(tmp_path / "a.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    write_video(tmp_path / "v.mp4", n_frames=6, size=(16, 8))
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.png,x,train\nv,v.mp4,y,test\n")
    assert "grey-grid" in run_cli("extract", "--help", env=PLUGIN).stdout
    helped = run_cli("extract", "-f", "grey-grid", "--help", env=PLUGIN)
    assert "--cell INTEGER" in helped.stdout
    assert "Side of the square cells in pixels" in helped.stdout
    assert "--cell" not in run_cli("extract", "-f", "dsift", "--help", env=PLUGIN).stdout
    bad = run_cli("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f", "grey-grid",
                  "--cell", "0", env=PLUGIN, check=False)
    assert bad.returncode == 2 and "error: --cell must be an int in the range [1, inf)" in \
        bad.stderr
    wrong = run_cli("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f", "dsift",
                    "--cell", "4", env=PLUGIN, check=False)
    assert wrong.returncode == 2 and "--cell is not a parameter of --features dsift" in \
        wrong.stderr
    assert not (tmp_path / "s").exists()  # usage errors: no stage
    done = run_cli("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f",
                   "grey-grid", "--cell", "4", "-n", "cells", env=PLUGIN)
    assert "summary: 2 done" in done.stdout
    stage = Store(tmp_path / "s").resolve("cells")
    assert stage.params["grey-grid"] == {"cell": 4}
    np.testing.assert_allclose(stage.read_item("a"), literal_cells(image, 4), atol=1e-6)
    np.testing.assert_array_equal(stage.read_extra("a", "positions")[:2],
                                  [[2, 2, 4], [6, 2, 4]])
    frames = list(iter_frames(tmp_path / "v.mp4"))
    video = stage.read_item("v")
    assert video.shape == (6 * 2 * 4, 16)  # 6 frames of 2 x 4 cells, 16 values each
    np.testing.assert_allclose(video, np.concatenate([literal_cells(f, 4) for _, f in frames]),
                               atol=1e-6)
    # a pipeline file with the same step: the same stage key, nothing to compute
    (tmp_path / "p.toml").write_text(f"""
[pipeline]
store = "{tmp_path / 's'}"

[steps.cells]
stage = "extract"
manifest = "{tmp_path / 'm.csv'}"
features = "grey-grid"
params = {{ cell = 4.0 }}
""")
    again = run_cli("run", tmp_path / "p.toml", env=PLUGIN)
    assert "summary: 0 done, 2 skipped (already complete)" in again.stdout
    assert json.loads((stage.path / "stage.json").read_text())["params"]["grey-grid"] == \
        {"cell": 4}


def test_feature_methods_are_estimators_with_declared_parameters():
    """Every registered method's estimator follows scikit-learn's contract (get_params,
    clone) and declares each parameter once; a bad value names it before anything runs."""
    import pytest
    from sklearn.base import clone

    from featpipe.errors import ParameterError
    from featpipe.extract.features import load_features
    from featpipe.stages.extraction_plan import choose_features

    methods = load_features()
    assert {"dsift", "vgg16-fc6", "vgg16-conv5_3"} <= set(methods)
    for method in methods.values():
        defaults = {p.name: p.default for p in method.parameters}
        estimator = method.build(defaults)
        assert clone(estimator).get_params() == estimator.get_params()
        assert all(p.help for p in method.parameters)
    vgg = choose_features("vgg16-conv5_3", {"weights": "random:0"})
    assert vgg.record == {"weights": "random:0", "resize": 256, "crop": 224}
    assert vgg.estimator().count(480, 640) == 14 * 14 and vgg.estimator().n_features == 512
    sift = choose_features("dsift", {"sizes": (8.0,), "step": 4})
    assert sift.record["sizes"] == [8] and sift.record["contrast_threshold"] == 0.005
    with pytest.raises(ParameterError, match="crop must be at most resize"):
        choose_features("vgg16-fc6", {"weights": "random:0", "resize": 100, "crop": 224})
    with pytest.raises(ParameterError, match="step must be an int in the range"):
        choose_features("dsift", {"step": 0})
