"""Steps run inside an extraction's pass (issue 38 §1, :mod:`featpipe.chain`): improved
trajectories -> per-frame Fisher vectors of descriptor groups -> each temporal encoder, per
group and for all groups, in one decode.  A fused stage has the key of the same step run by
``featpipe encode`` and the same bits; either run reuses the other's stage; a killed pass
resumes to the same results; an item longer than the memory budget spills to disk and back.
Real decoded video: rendered motion clips over scikit-learn's photographs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from featpipe.chain import BufferedRows, Then, pooling_steps
from featpipe.demo.motion import render_dataset
from featpipe.errors import ParameterError
from featpipe.extract.settings import ExtractSettings
from featpipe.stages import RunOptions
from featpipe.stages.encoding import encode
from featpipe.stages.extraction import extract
from featpipe.stages.fitting import fit_gmm
from featpipe.store import Store
from tests.conftest import REPO
from tests.stages.test_fusion_rules import SIFT

#: every temporal encoder, with small windows for the 20-frame clips
TEMPORAL = {"avg": {}, "max": {}, "tpyramid": {}, "arp": {}, "rankpool": {},
            "hrp": {"window": 6}, "recursive": {}}
IDT = {"descriptors": "hog,hof,mbh"}
FV = {"gmm": "gmm", "per_frame": True}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """8 rendered clips of 20 frames, a grouped GMM (K = 4) fitted on their idt sample."""
    folder = tmp_path_factory.mktemp("fused")
    manifest = render_dataset(folder / "clips", per_class=2, frames=20)
    store = Store(folder / "store")
    extract(store, manifest, "idt", params=IDT, settings=ExtractSettings(
        sample_descriptors=100), name="sample", options=RunOptions(jobs=2))
    fit_gmm(store, "sample", name="gmm", groups="hog,hof,mbh", pca_fraction=0.5,
            n_components=4, sample=4000)
    return folder, manifest


def fused_steps(groups=("hog", "all")) -> list[Then]:
    steps = []
    for method, params in TEMPORAL.items():
        steps += pooling_steps(method, params, groups, "gmm", f"f{method}")
    return steps


def fv_settings(then=(), keep=None) -> ExtractSettings:
    return ExtractSettings(encode="fisher", encode_params=FV, then=tuple(then), keep=keep)


def copy_store(clips, tmp_path) -> Store:
    import shutil

    folder, _ = clips
    shutil.copytree(folder / "store", tmp_path / "store")
    return Store(tmp_path / "store")


def items_of(store: Store, name: str) -> dict[str, np.ndarray]:
    stage = store.resolve(name)
    return {i: stage.read_item(i) for i in stage.items.ids}


def test_every_temporal_encoder_fused_equals_step_by_step_and_shares_its_key(clips,
                                                                             tmp_path):
    _, manifest = clips
    store = copy_store(clips, tmp_path)
    run = extract(store, manifest, "idt", params=IDT, settings=fv_settings(fused_steps()),
                  options=RunOptions(jobs=2))
    assert run.summary.done == len(manifest.ids) and not run.summary.failed
    per_frame = store.stage("extract", run.stage.params, inputs=run.stage.inputs(),
                            items=manifest, create=False)
    assert not per_frame.done_ids()  # the per-frame Fisher vectors never reached the disk
    assert {w.name for w in run.written} == {f"f{m}-{g}" for m in TEMPORAL
                                            for g in ("hog", "all")}
    # the same steps one command each: every pooled stage is the fused one, computed already
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(), name="fv",
            options=RunOptions(jobs=2))
    assert store.resolve("fv") == per_frame
    encode(store, "fv", "fisher-group", {"gmm": "gmm", "group": "hog"}, name="fv-hog")
    for method, params in TEMPORAL.items():
        for group, source in (("hog", "fv-hog"), ("all", "fv")):
            again = encode(store, source, method, params, name=f"{method}-{group}")
            assert again.stage == store.resolve(f"f{method}-{group}")
            assert again.summary.done == 0 and again.summary.skipped == len(manifest.ids)


def test_recomputed_bits_equal_the_fused_ones(clips, tmp_path):
    """The fused pass, then `encode --force` of each step from the kept per-frame stage:
    every item of every temporal encoder and group equal to the bit."""
    _, manifest = clips
    store = copy_store(clips, tmp_path)
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(fused_steps(), True),
            name="fv", options=RunOptions(jobs=2))
    fused = {f"f{m}-{g}": items_of(store, f"f{m}-{g}") for m in TEMPORAL
             for g in ("hog", "all")}
    encode(store, "fv", "fisher-group", {"gmm": "gmm", "group": "hog"}, name="fv-hog")
    for method, params in TEMPORAL.items():
        for group, source in (("hog", "fv-hog"), ("all", "fv")):
            encode(store, source, method, params, options=RunOptions(force=True))
            recomputed = items_of(store, f"f{method}-{group}")
            for item_id, vector in fused[f"f{method}-{group}"].items():
                np.testing.assert_array_equal(recomputed[item_id], vector,
                                              err_msg=f"{method} {group} {item_id}")


def test_a_pass_reuses_stages_computed_step_by_step_and_computes_only_what_is_missing(
        clips, tmp_path):
    _, manifest = clips
    store = copy_store(clips, tmp_path)
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(), name="fv",
            options=RunOptions(jobs=2))
    encode(store, "fv", "rankpool", name="rp-all")
    stage = store.resolve("rp-all")
    lines = len(list(stage.ledger()))
    # rankpool of all groups exists: the pass computes nothing for it
    run = extract(store, manifest, "idt", params=IDT, settings=fv_settings(
        pooling_steps("rankpool", {}, ["all"], "gmm", "rp")))
    assert run.summary.done == 0 and run.summary.skipped == len(manifest.ids)
    assert store.resolve("rp") == stage
    # with one more output, the pass decodes again and writes only that output
    run = extract(store, manifest, "idt", params=IDT, settings=fv_settings(
        pooling_steps("rankpool", {}, ["hof", "all"], "gmm", "rp")))
    assert run.summary.done == len(manifest.ids)
    assert len(list(stage.ledger())) == lines  # rp-all: not one item rewritten
    assert store.resolve("rp-hof").is_complete()


def test_an_item_over_the_memory_budget_spills_and_gives_the_same_results(clips, tmp_path):
    """FEATPIPE_MEMORY of 1 kB: every item's per-frame vectors go to a file beside it, are
    read back memory-mapped and removed; the pooled results equal those kept in memory."""
    folder, manifest = clips
    store = copy_store(clips, tmp_path)
    steps = pooling_steps("hrp", {"window": 6}, ["mbh", "all"], "gmm", "hrp")
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(steps))
    expected = {g: items_of(store, f"hrp-{g}") for g in ("mbh", "all")}
    spilled = copy_store(clips, tmp_path / "spilled")
    # every process of the run (the decoding workers too) notes each item that spilled
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SPILL_HOOK.format(log=str(tmp_path / "spills")))
    proc = subprocess.run(
        [sys.executable, "-m", "featpipe", "extract", "-m", folder / "clips" / "manifest.csv",
         "-s", spilled.root, "-f", "idt", "--descriptors", "hog,hof,mbh", "--encode",
         "fisher", "--gmm", "gmm", "--per-frame", "--temporal", "hrp", "--temporal-param",
         "window=6", "--temporal-groups", "mbh,all", "-n", "hrp"],
        env=dict(os.environ, PYTHONPATH=f"{hooks}{os.pathsep}{REPO}", FEATPIPE_MEMORY="1K"),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "spills").read_text().split() == ["spilled"] * len(manifest.ids)
    for group, items in expected.items():
        for item_id, vector in items_of(spilled, f"hrp-{group}").items():
            np.testing.assert_array_equal(vector, items[item_id])
    leftovers = [p for p in spilled.root.rglob("*") if ".tmp." in p.name]
    assert not leftovers


#: a sitecustomize module: each BufferedRows that closes after spilling writes a line
SPILL_HOOK = """
import featpipe.chain as chain

close = chain.BufferedRows.close


def noting(self):
    if self.spilled:
        with open({log!r}, "a") as log:
            log.write("spilled\\n")
    return close(self)


chain.BufferedRows.close = noting
"""


def test_buffered_rows_spill_past_the_budget_and_read_back_the_same_item(tmp_path):
    from featpipe.manifest import from_rows

    store = Store(tmp_path / "store")
    stage = store.stage("extract", {"x": 1},
                        items=from_rows([("a", "", ["c"], ["train"])], tmp_path))
    rows = np.random.default_rng(0).standard_normal((10, 6))
    for budget, spilled in ((10**6, False), (100, True)):
        buffer = BufferedRows(stage, "a", budget)
        for t in range(10):
            buffer.append(rows[t:t + 1], frame_index=np.array([t]))
        buffer.set(timestamps=np.arange(10.0))
        pending, array, extras = buffer.close()
        assert buffer.spilled is spilled and (pending is not None) is spilled
        np.testing.assert_array_equal(array, rows.astype(np.float32))
        np.testing.assert_array_equal(extras["frame_index"], np.arange(10))
        np.testing.assert_array_equal(extras["timestamps"], np.arange(10.0))
        if pending is not None:
            assert isinstance(array, np.memmap)
            pending.discard()
    assert not [p for p in stage.path.rglob("*") if p.is_file() and ".tmp." in p.name]


def test_a_killed_pass_resumes_to_the_uninterrupted_results(clips, tmp_path):
    folder, manifest = clips
    store = copy_store(clips, tmp_path)
    steps = pooling_steps("rankpool", {}, ["hog", "all"], "gmm", "rp")
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(steps))
    expected = {g: items_of(store, f"rp-{g}") for g in ("hog", "all")}
    killed = copy_store(clips, tmp_path / "killed")
    command = [sys.executable, "-m", "featpipe", "extract", "-m",
               str(folder / "clips" / "manifest.csv"), "-s", str(killed.root), "-f", "idt",
               "--descriptors", "hog,hof,mbh", "--encode", "fisher", "--gmm", "gmm",
               "--per-frame", "--temporal", "rankpool", "--temporal-groups", "hog,all",
               "-n", "rp", "--jobs", "1"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    done = lambda: sum(1 for _ in (killed.root / "stages").rglob("ledger/*.jsonl"))  # noqa
    while done() < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    for group, items in expected.items():
        got = items_of(killed, f"rp-{group}")
        assert set(got) == set(items)
        for item_id, vector in items.items():
            np.testing.assert_array_equal(got[item_id], vector)


def test_steps_that_cannot_run_in_the_pass_are_refused_before_anything_exists(clips,
                                                                              tmp_path):
    _, manifest = clips
    store = copy_store(clips, tmp_path)
    before = sorted(p.name for p in (store.root / "stages").iterdir())
    with pytest.raises(ParameterError, match="nothing would be written"):
        extract(store, manifest, "idt", params=IDT, settings=fv_settings(
            [Then("x", "rankpool")]))
    with pytest.raises(ParameterError, match="sample of its descriptors"):
        extract(store, manifest, "idt", params=IDT, settings=ExtractSettings(
            sample_descriptors=5, then=(Then("x", "rankpool", keep=True),)))
    with pytest.raises(ParameterError, match="window"):
        extract(store, manifest, "idt", params=IDT, settings=fv_settings(
            [Then("x", "hrp", {"window": 0}, keep=True)]))
    with pytest.raises(ParameterError, match="group"):
        extract(store, manifest, "idt", params=IDT, settings=fv_settings(
            pooling_steps("avg", {}, ["hogg"], "gmm", "x")))
    assert sorted(p.name for p in (store.root / "stages").iterdir()) == before


def stage_item_bytes(stage) -> int:
    """Bytes of a stage's item files (arrays and sidecars)."""
    return sum(p.stat().st_size for p in (stage.path / "items").rglob("*.npy"))


def test_a_dry_run_sizes_the_pass_within_5_percent_of_what_it_writes(clips, tmp_path):
    """Issue 38 §3: the bytes a dry run plans for each stage a pass writes (pooled vectors of
    every kind, per group and all; the per-frame stage kept) against the bytes written."""
    _, manifest = clips
    store = copy_store(clips, tmp_path)
    steps = (pooling_steps("rankpool", {}, ["hog", "all"], "gmm", "rp")
             + pooling_steps("hrp", {"window": 6}, ["mbh"], "gmm", "hrp")
             + pooling_steps("tpyramid", {}, ["all"], "gmm", "tp"))
    settings = fv_settings(steps, keep=True)
    plan = extract(store, manifest, "idt", params=IDT, settings=settings, name="fv",
                   options=RunOptions(dry_run=True))
    planned = {w.stage.name: w.bytes for w in plan.written}
    assert len(planned) == 5 and all(planned.values())
    run = extract(store, manifest, "idt", params=IDT, settings=settings, name="fv",
                  options=RunOptions(jobs=2))
    for written in run.written:
        actual = stage_item_bytes(written.stage)
        assert abs(planned[written.stage.name] - actual) <= 0.05 * actual, (
            written.name, planned[written.stage.name], actual)


def test_a_group_of_stored_per_frame_vectors_is_a_view_not_a_copy(clips, tmp_path):
    """Issue 38 §2: with the per-frame Fisher vectors kept, `fisher-group` makes a view (its
    record names the stage and the columns) whose items are those columns, read from the
    source; in a pass that keeps both, the same."""
    from featpipe.encode.fisher_groups import _GroupSlice

    _, manifest = clips
    store = copy_store(clips, tmp_path)
    extract(store, manifest, "idt", params=IDT, settings=fv_settings(), name="fv",
            options=RunOptions(jobs=2))
    run = encode(store, "fv", "fisher-group", {"gmm": "gmm", "group": "hof"}, name="fv-hof")
    view, source = store.resolve("fv-hof"), store.resolve("fv")
    assert run.summary.skipped == len(manifest.ids) and not run.summary.failed
    assert (view.path / "view.json").is_file() and not (view.path / "items").exists()
    assert view.is_complete() and view.view()[0] == source
    columns = _GroupSlice(store.resolve("gmm"), "hof")
    for item_id in manifest.ids:
        expected = columns.encode_batch([source.read_item(item_id)],
                                        [source.extras_of(item_id)])[0]
        np.testing.assert_array_equal(view.read_item(item_id), expected.array)
        assert set(view.extras_of(item_id)) == set(expected.extras) == {"frame_index",
                                                                          "timestamps"}
    # in a pass that writes the per-frame stage, a kept group step is the same view
    steps = [Then("fv-mbh", "fisher-group", {"gmm": "gmm", "group": "mbh"}, name="fv-mbh"),
             Then("rp", "rankpool", input="fv-mbh", name="rp-mbh")]
    run = extract(store, manifest, "idt", params=IDT, settings=fv_settings(steps, True),
                  name="fv")
    assert store.resolve("fv-mbh").view() is not None
    assert not (store.resolve("fv-mbh").path / "items").exists()
    assert store.resolve("rp-mbh").is_complete()
    assert encode(store, "fv-mbh", "rankpool").summary.skipped == len(manifest.ids)


def test_a_pipeline_fuses_its_chains_and_keeps_what_is_read_or_asked_for(tmp_path,
                                                                          monkeypatch):
    """Issue 38 §2: `featpipe run` runs an extraction and the encode steps after it as one
    pass; a step's stage is written when a step outside the pass reads it (the classify of
    `grid`'s pooling), when nothing reads it, or with `keep = true`; a step with run options
    of its own runs alone; `--step` of a step of a pass runs the pass."""
    from featpipe.pipeline import load_pipeline, plan_fusion, run_pipeline

    monkeypatch.chdir(tmp_path)
    render_dataset(tmp_path / "clips", per_class=2, frames=8)
    (tmp_path / "p.toml").write_text(SIFT + """keep = true
[steps.avg]
stage = "encode"
input = "grid"
method = "avg"
[steps.hrp]
stage = "encode"
input = "grid"
method = "hrp"
params = { window = 2 }
jobs = 2
[steps.result]
stage = "classify"
inputs = ["avg"]
""")
    pipeline = load_pipeline(tmp_path / "p.toml")
    fusion = plan_fusion(pipeline.steps)
    assert fusion.members == {"sift": ["grid", "avg"]}  # hrp has run options of its own
    assert fusion.kept == {"sift": False, "grid": True, "avg": True}
    store = Store(tmp_path / "store")
    run_pipeline(pipeline, store, only=lambda step: step.name == "avg")
    assert store.resolve("grid").is_complete() and store.resolve("avg").is_complete()
    assert "sift" not in store.names()
    assert not list((tmp_path / "store" / "stages").glob("extract-*/items/*/*.npy"))
    results = run_pipeline(pipeline, store)
    assert results[3].summary.done == 8  # hrp, alone, from the kept grid stage
    assert results[0].summary.done == 0 and results[0].summary.skipped == 8


def test_fit_gmm_warns_when_its_sample_is_thin_for_its_components(clips, tmp_path):
    """Issue 38 §3: fewer sampled rows per component than a diagonal Gaussian has parameters
    (2 d + 1) is a warning of `fit gmm` (and of its dry run, tests/cli/test_recipe_pipeline.py),
    naming the group, the rows and the most components those rows carry."""
    from featpipe.stages import Reporter

    class Warnings(Reporter):
        def __init__(self):
            self.lines = []

        def warn(self, text):
            self.lines.append(text)

    store = copy_store(clips, tmp_path)
    rows = len(store.resolve("sample").read_item(store.resolve("sample").items.ids[0]))
    # the sample: about 250 rows; MBH's 96 dimensions (193 parameters) take one component
    quiet, thin = Warnings(), Warnings()
    fit_gmm(store, "sample", name="g1", groups="hog,hof,mbh", pca_fraction=0.5,
            n_components=1, sample=4000, reporter=quiet)
    fit_gmm(store, "sample", name="g64", groups="hog,hof,mbh", pca_fraction=0.5,
            n_components=64, sample=4000, reporter=thin)
    assert rows and not quiet.lines
    assert [line.split(":")[1].strip() for line in thin.lines] == ["group hog", "group hof",
                                                                   "group mbh"]
    assert all("for K = 64 components" in line and "(2 x " in line for line in thin.lines)
