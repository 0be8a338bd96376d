"""The dense-trajectory recipe's pipeline file (issue 32 §2): shipped by ``featpipe example
pipeline trajectories``, valid as a whole (every key, value and reference), and the small
version that benchmarks/results/recipe.md runs on rendered clips holds the same trajectory
steps, differing only in its declared small settings; its dry run plans every step."""

from __future__ import annotations

import tomllib

from featpipe.cli.example import SMALL_HEADER
from featpipe.pipeline import load_pipeline
from tests.conftest import REPO

TEMPLATE = REPO / "featpipe" / "templates" / "trajectories.toml"
SMALL = REPO / "benchmarks" / "recipes" / "trajectories_clips.toml"
#: what the small version may change in a step it shares with the shipped file (its clips
#: are 40 frames: no window of 45 in them)
SMALL_SETTINGS = {"manifest", "sample_descriptors", "sample_total", "sample_window",
                  "n_components", "sample", "jobs", "split"}


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
    # every step planned, those after the GMM too (on a stand-in of its shapes): the idt
    # sample (the 4 train clips: as few as give its rows), the pass of idt-fv (its seven steps
    # with it), the pass of sift (grid, hrp-sift)
    assert plan.count("dry run: 8 to compute, 0 already complete") == 2
    assert "sample: 4 of the 4 train items of split 1" in plan
    assert "dry run: 4 to compute, 0 already complete" in plan
    assert "would run after" not in plan and "size unknown" not in plan
    assert not (tmp_path / "store").exists()


def test_the_small_variant_is_the_shipped_recipe_with_small_settings(cli):
    shipped = tomllib.loads(TEMPLATE.read_text("utf-8"))["steps"]
    text = cli("example", "pipeline", "trajectories", "--small", check=True).stdout
    assert text.startswith(SMALL_HEADER)
    small = tomllib.loads(text)["steps"]
    assert list(small) == list(shipped)
    changed = {(step, key) for step in shipped for key in set(shipped[step]) | set(small[step])
               if shipped[step].get(key) != small[step].get(key)}
    assert changed == {("idt-sample", "sample_descriptors"), ("idt-sample", "jobs"),
                       ("idt-sample", "sample_total"),
                       ("idt-gmm", "n_components"), ("idt-gmm", "sample"),
                       ("idt-fv", "jobs"), ("cnn", "params"), ("cnn", "sampling")}
    assert small["cnn"]["params"] == {"weights": "random:0"}
    assert small["idt-gmm"]["n_components"] == 4
    assert "--small" in cli("example", "pipeline", "--small").output  # a usage error


def test_the_shipped_recipe_is_sized_before_anything_exists(cli, tmp_path, monkeypatch):
    """Issue 38 §3, issue 47 §1: the dry run of the Table 6 recipe sizes every stage (those
    after the GMM and the CNN's too, the ones its passes do not write listed as such), prices
    the extractions, lists the missing VGG-16 checkpoint as a problem once and exits 1 (a run
    would stop before anything); the GMM of K = 256 on this small sample is warned about."""
    monkeypatch.chdir(tmp_path)
    cli("example", "clips", "clips", "--per-class", "2", "--frames", "20", check=True)
    cli("manifest", "build", "clips", "-o", "ucf.csv", "--test-fraction", "0.5", "--seed",
        "0", check=True)
    (tmp_path / "t.toml").write_text(TEMPLATE.read_text("utf-8"))
    plan = cli("run", "t.toml", "--dry-run")
    assert plan.exit_code == 1, plan.output
    table = plan.stdout.split("dry run: the plan")[1].split("dry run: total")[0].splitlines()
    nodes = [line for line in table[2:] if "pass of step" not in line and
             "blocked by" not in line]
    # sample, gmm; the idt-fv pass (its extraction and three group views unwritten, four RP
    # stages); the cnn pass (its extraction unwritten, HRP(CNN)); four classify results (the
    # fused one reads HRP(CNN), whose pass has the problem: blocked)
    assert len(nodes) == 16, nodes
    assert sum("not written" in line for line in nodes) == 5
    assert "result-all-cnn: not planned, blocked by the problem of step 'cnn'" in plan.stdout
    assert all(" ? " not in line for line in nodes), nodes
    assert all(line.split()[0] in ("idt-sample", "idt-fv", "cnn") or not line.rstrip().endswith(
        ("s", "min", " h")) for line in nodes)
    assert "1 problem(s)" in plan.stdout
    assert plan.stderr.count("--weights vgg16-397923af.pth: no such file") == 1
    assert "problem: step 'cnn': --weights vgg16-397923af.pth: no such file" in plan.stderr
    assert "rows for K = 256 components" in plan.stderr
    assert not (tmp_path / "store").exists()
