"""The pipeline's fusion rules (issue 51 §8: the reviewer's survivors in featpipe/pipeline.py):
`keep = true` writes a step of a pass that nothing outside reads; a fused step reads the step
it names, not the extraction; a step whose model is fitted after the extraction does not run
in its pass."""

from __future__ import annotations

import numpy as np

from featpipe import stages
from featpipe.demo.motion import render_dataset
from featpipe.pipeline import load_pipeline, plan_fusion, run_pipeline
from featpipe.store import Store

SIFT = """[pipeline]
store = "store"
[steps.sift]
stage = "extract"
manifest = "clips/manifest.csv"
features = "dsift"
params = { sizes = [8], step = 16 }
sampling = { every = 2 }
[steps.grid]
stage = "encode"
input = "sift"
method = "spatial-grid"
params = { grid = "2x2" }
"""


def test_keep_true_writes_a_step_of_a_pass_that_only_the_pass_reads(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(SIFT + '[steps.avg]\nstage = "encode"\ninput = "grid"\nmethod = "avg"\n')
    assert plan_fusion(load_pipeline(path).steps).kept == {"sift": False, "grid": False,
                                                           "avg": True}
    path.write_text(SIFT + 'keep = true\n[steps.avg]\nstage = "encode"\ninput = "grid"\n'
                    'method = "avg"\n')
    assert plan_fusion(load_pipeline(path).steps).kept == {"sift": False, "grid": True,
                                                           "avg": True}


def test_a_step_whose_model_is_fitted_after_the_extraction_runs_on_its_own(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(SIFT + '[steps.g]\nstage = "fit_gmm"\ninput = "sift"\nn_components = 2\n'
                    '[steps.fv]\nstage = "encode"\ninput = "sift"\nmethod = "fisher"\n'
                    'params = { gmm = "g" }\n')
    fusion = plan_fusion(load_pipeline(path).steps)
    assert fusion.members == {"sift": ["grid"]}  # fv needs g, which needs sift done first
    assert "fv" not in fusion.pass_of and fusion.kept["sift"]  # g reads sift: written


def test_a_fused_step_reads_the_step_it_names_to_the_bit(tmp_path, monkeypatch):
    """avg of hrp's layer-2 sequence, fused into the extraction's pass: equal to the bit to
    `featpipe encode` step by step on the stored stages (not avg of the extraction's grid
    sequence, which has other values and another width)."""
    monkeypatch.chdir(tmp_path)
    render_dataset(tmp_path / "clips", per_class=2, frames=8)
    path = tmp_path / "p.toml"
    path.write_text(SIFT + '[steps.layer]\nstage = "encode"\ninput = "grid"\nmethod = "hrp"\n'
                    'params = { window = 2, emit_layer = 2 }\n'
                    '[steps.avg]\nstage = "encode"\ninput = "layer"\nmethod = "avg"\n')
    pipeline = load_pipeline(path)
    assert plan_fusion(pipeline.steps).members == {"sift": ["grid", "layer", "avg"]}
    fused = Store(tmp_path / "store")
    run_pipeline(pipeline, fused)
    apart = Store(tmp_path / "apart")
    from featpipe.io.video import Sampling
    from featpipe.manifest import Manifest

    stages.extract(apart, Manifest.read(tmp_path / "clips" / "manifest.csv"), "dsift",
                   params={"sizes": [8], "step": 16}, sampling=Sampling(every=2), name="sift")
    stages.encode(apart, "sift", "spatial-grid", {"grid": "2x2"}, name="grid")
    stages.encode(apart, "grid", "hrp", {"window": 2, "emit_layer": 2}, name="layer")
    stages.encode(apart, "layer", "avg", name="avg")
    mine, theirs = fused.resolve("avg"), apart.resolve("avg")
    assert mine.key == theirs.key
    grid = apart.resolve("grid")
    for item_id in theirs.items.ids:
        expected = theirs.read_item(item_id)
        np.testing.assert_array_equal(mine.read_item(item_id), expected)
        assert expected.shape != grid.read_item(item_id).mean(axis=0).shape
