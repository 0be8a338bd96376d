"""The dense-trajectory recipe's pipeline file (issue 32 §2): shipped by ``featpipe example
pipeline trajectories``, valid as a whole (every key, value and reference), and the small
version that RESULTS runs on rendered clips holds the same trajectory steps, differing only in
its declared small settings; its dry run plans every step."""

from __future__ import annotations

import tomllib

from featpipe.pipeline import load_pipeline
from tests.conftest import REPO

TEMPLATE = REPO / "featpipe" / "templates" / "trajectories.toml"
SMALL = REPO / "benchmarks" / "recipes" / "trajectories_clips.toml"
#: what the small version may change in a step it shares with the shipped file
SMALL_SETTINGS = {"manifest", "sample_descriptors", "n_components", "sample", "jobs", "split"}


def test_the_shipped_recipe_is_printed_and_valid(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = cli("example", "pipeline", "trajectories", check=True).stdout
    assert shipped == TEMPLATE.read_text("utf-8")
    (tmp_path / "t.toml").write_text(shipped)
    pipeline = load_pipeline(tmp_path / "t.toml")
    assert len(pipeline.steps) == 17
    steps = tomllib.loads(shipped)["steps"]
    assert steps["idt-gmm"]["n_components"] == 256 and steps["idt-gmm"]["pca_fraction"] == 0.5
    assert steps["idt-fv"]["encode_params"] == {"gmm": "idt-gmm", "per_frame": True}
    assert steps["result-all-cnn"]["inputs"] == ["rp-all", "hrp-cnn"]
    assert "hrp" in cli("example", "pipeline", check=True).stdout  # the walkthrough's stays


def test_the_small_recipe_is_the_same_recipe(cli, tmp_path, monkeypatch):
    shipped = tomllib.loads(TEMPLATE.read_text("utf-8"))["steps"]
    small = tomllib.loads(SMALL.read_text("utf-8"))["steps"]
    shared = [s for s in shipped if s in small]
    assert shared[:10] == ["idt-sample", "idt-gmm", "idt-fv", "fv-hog", "fv-hof", "fv-mbh",
                           "rp-hog", "rp-hof", "rp-mbh", "rp-all"]
    for step in shared:
        keys = set(shipped[step]) | set(small[step])
        differ = {k for k in keys if shipped[step].get(k) != small[step].get(k)}
        assert differ <= SMALL_SETTINGS, (step, differ)
    monkeypatch.chdir(tmp_path)
    cli("example", "clips", "clips", "--per-class", "2", "--frames", "20", check=True)
    cli("manifest", "build", "clips", "-o", "clips.csv", "--test-fraction", "0.5", "--seed",
        "0", check=True)
    plan = cli("run", SMALL, "--dry-run", check=True).stdout
    # the idt sample, then the appearance stream; the rest waits for the fitted GMMs
    assert plan.count("dry run: 8 to compute, 0 already complete") == 4
    assert "step 3/19: idt-fv (extract)\ndry run: would run after idt-gmm" in plan
    assert plan.count("would run after") == 13
    assert not (tmp_path / "store").exists()
